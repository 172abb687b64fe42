"""Helpers the tests share: data in the real file formats, made by the tests, and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from scaletrain.data.idx import write_idx

REPO = Path(__file__).resolve().parents[1]
SHARED_PTB = REPO.parent / "shared" / "datasets" / "ptb"
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def make_fashion_mnist(folder: Path, *, train: int = 256, test: int = 64, seed: int = 0) -> Path:
    """Write a tiny Fashion-MNIST look-alike: each class is a bright square at its own place.

    A network can learn it, which is what the training tests need.
    """
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", train), ("t10k", test)):
        labels = (np.arange(count) % 10).astype(np.uint8)
        rng.shuffle(labels)
        images = rng.integers(0, 40, size=(count, 28, 28), dtype=np.uint8)
        for index, label in enumerate(labels):
            row, col = divmod(int(label), 5)
            images[index, 4 + row * 12 : 12 + row * 12, 1 + col * 5 : 5 + col * 5] = 250
        write_idx(folder / f"{split}-images-idx3-ubyte.gz", images)
        write_idx(folder / f"{split}-labels-idx1-ubyte.gz", labels)
    return folder


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """Run ``python -m scaletrain ARGS`` in a real subprocess."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
