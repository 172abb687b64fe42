"""Synthetic stand-ins in the real file formats, for timing and tests when the real data is absent.

Anything trained on them says so: these are not Fashion-MNIST.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from scaletrain.data.idx import write_idx

__all__ = ["write_synthetic_fashion_mnist"]


def write_synthetic_fashion_mnist(folder: Path, *, train: int = 256, test: int = 64, seed: int = 0) -> Path:
    """IDX files shaped like Fashion-MNIST: noise plus one bright square per class, so a network can
    learn them. Returns ``folder``.

    >>> import tempfile, pathlib
    >>> folder = write_synthetic_fashion_mnist(pathlib.Path(tempfile.mkdtemp()), train=20, test=10)
    >>> sorted(p.name for p in folder.iterdir())[0]
    't10k-images-idx3-ubyte.gz'
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
