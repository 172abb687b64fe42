"""Helpers the tests share: data in the real file formats, made by the tests, and the CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from scaletrain.data.synthetic import write_synthetic_fashion_mnist

REPO = Path(__file__).resolve().parents[1]
SHARED_PTB = REPO.parent / "shared" / "datasets" / "ptb"
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def make_fashion_mnist(folder: Path, *, train: int = 256, test: int = 64, seed: int = 0) -> Path:
    """A tiny learnable Fashion-MNIST look-alike in the real IDX format (see scaletrain.data.synthetic)."""
    return write_synthetic_fashion_mnist(folder, train=train, test=test, seed=seed)


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
