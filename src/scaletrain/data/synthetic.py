"""Synthetic stand-ins, for timing and tests when the real data is absent.

Fashion-MNIST look-alikes in the real file format, and random images made on demand for the image
networks. Anything trained on them says so: they are not the real datasets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scaletrain.data.idx import write_idx

__all__ = ["SyntheticImages", "write_synthetic_fashion_mnist"]

# Each sample seeds its own generator. The CPU generator keeps only the low 32 bits of a seed, so the
# splits take the two halves of that range: no test image repeats a training image.
_SPLIT_SEEDS = {"train": 0, "test": 1 << 31}
_MAX_SAMPLES = 1 << 31


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


@dataclass(frozen=True)
class SyntheticImages:
    """``count`` random uint8 RGB images of ``image_size``² pixels with random labels, made on demand.

    Sample ``i`` is a fixed function of ``split`` and ``i`` (its own generator, seeded with both), so
    a batch is made from its indices alone: memory holds one batch, and a worker's part of a batch
    is exactly that slice of the whole batch. Which samples a batch holds follows the run's seed,
    as with real data. For timing only: nothing in these images predicts their labels.

    >>> images = SyntheticImages(100, 32, 10)
    >>> batch, labels = images.take(torch.tensor([7, 3]))
    >>> tuple(batch.shape), batch.dtype, torch.equal(images.take(torch.tensor([3]))[0][0], batch[1])
    ((2, 3, 32, 32), torch.uint8, True)
    """

    count: int
    image_size: int
    num_classes: int
    split: str = "train"

    def __post_init__(self) -> None:
        if self.split not in _SPLIT_SEEDS:
            raise ValueError(f"split must be one of {', '.join(_SPLIT_SEEDS)}, got {self.split!r}")
        if not 0 < self.count <= _MAX_SAMPLES:
            raise ValueError(f"a synthetic split holds 1 to {_MAX_SAMPLES} images, not {self.count}")

    def __len__(self) -> int:
        return self.count

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The images (N×3×S×S uint8) and labels (N, int64) of the samples at ``indices``."""
        size = self.image_size
        images = torch.empty(len(indices), 3, size, size, dtype=torch.uint8)
        labels = torch.empty(len(indices), dtype=torch.long)
        generator = torch.Generator()
        for row, index in enumerate(indices.tolist()):
            if not 0 <= index < self.count:
                raise IndexError(f"sample {index} of {self.count} synthetic {self.split} images")
            generator.manual_seed(_SPLIT_SEEDS[self.split] + index)
            labels[row] = torch.randint(self.num_classes, (), generator=generator)
            images[row] = torch.randint(0, 256, (3, size, size), dtype=torch.uint8, generator=generator)
        return images, labels
