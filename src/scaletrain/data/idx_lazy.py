"""Fashion-MNIST as a map-style ``torch.utils.data.Dataset`` that reads each image from the IDX file when
asked for it, by its offset, instead of loading the whole set into memory (:mod:`scaletrain.data.idx`).

Reading by offset needs the uncompressed file: :func:`lazy_fashion_mnist` finds the four files as the
``lenet`` workload does and keeps an uncompressed copy of a gzipped image file in the cache. An image
is normalised with the training set's statistics exactly as :func:`~scaletrain.data.idx.load_fashion_mnist`
does, so the two give the same tensors. Each process (a ``DataLoader`` worker included) opens the file
itself and reads with ``pread``, which moves no shared file offset.

    >>> import tempfile, numpy as np
    >>> from scaletrain.data.idx import write_idx
    >>> folder = Path(tempfile.mkdtemp())
    >>> write_idx(folder / "images", np.full((3, 28, 28), 255, np.uint8))
    >>> write_idx(folder / "labels.gz", np.array([7, 1, 4], np.uint8))
    >>> images = IdxImages(folder / "images", folder / "labels.gz")
    >>> len(images), images[2][0].shape, images[2][1]
    (3, torch.Size([1, 28, 28]), 4)
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from scaletrain.data.idx import FASHION_MNIST_MEAN, FASHION_MNIST_STD, fashion_mnist_file, find_fashion_mnist, read_idx
from scaletrain.data.locate import cache_dir
from scaletrain.errors import DataError

__all__ = ["IdxImages", "lazy_fashion_mnist", "uncompressed"]

_GZIP_MAGIC = b"\x1f\x8b"
_UBYTE = 0x08


class IdxImages(Dataset):
    """The images of an uncompressed IDX file of unsigned bytes ``[N, H, W]`` with the labels of an IDX label
    file (raw or gzipped, read whole: one byte a sample): sample ``i`` is ``(float32 [1, H, W] normalised
    as (pixel / 255 − mean) / std, int label)``."""

    def __init__(
        self, images: Path, labels: Path, *, mean: float = FASHION_MNIST_MEAN, std: float = FASHION_MNIST_STD
    ) -> None:
        self.path = Path(images)
        self.mean, self.std = mean, std
        count, self.shape, self._offset = _image_header(self.path)
        self._image_bytes = math.prod(self.shape)
        self.labels = torch.from_numpy(read_idx(Path(labels)).astype(np.int64))
        if self.labels.ndim != 1 or len(self.labels) != count:
            raise DataError(
                f"{labels}: {list(self.labels.shape)} labels for the {count} images of {self.path}; "
                "give the label file that belongs to the image file"
            )
        self._descriptor: int | None = None
        self._opened_by: int | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"image {index} of {len(self)}")
        index %= len(self)
        raw = os.pread(self._file(), self._image_bytes, self._offset + index * self._image_bytes)
        pixels = torch.frombuffer(bytearray(raw), dtype=torch.uint8).reshape(1, *self.shape).float()
        # in place and in this order, like load_fashion_mnist: the same float32 roundings, the same tensors
        return pixels.div_(255.0).sub_(self.mean).div_(self.std), int(self.labels[index])

    def _file(self) -> int:
        """This process's descriptor: a forked loader worker opens its own."""
        if self._opened_by != os.getpid():
            self._descriptor, self._opened_by = os.open(self.path, os.O_RDONLY), os.getpid()
        assert self._descriptor is not None
        return self._descriptor

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_descriptor": None, "_opened_by": None}  # a spawned worker opens its own

    def __del__(self) -> None:
        if getattr(self, "_descriptor", None) is not None and self._opened_by == os.getpid():
            os.close(self._descriptor)


def _image_header(path: Path) -> tuple[int, tuple[int, int], int]:
    """How many images, ``(H, W)``, and where their bytes begin; one line naming the fix for another file."""
    try:
        with path.open("rb") as file:
            head = file.read(4)
            if head[:2] == _GZIP_MAGIC:
                raise DataError(
                    f"{path} is gzip-compressed; reading one image by its offset needs the uncompressed file: run "
                    f"`gunzip -k {path}` or use scaletrain.data.idx_lazy.uncompressed"
                )
            if len(head) < 4 or head[:3] != bytes([0, 0, _UBYTE]) or head[3] != 3:
                raise DataError(f"{path}: not an IDX file of unsigned-byte images [N, H, W] (header {head.hex()})")
            count, height, width = (int(size) for size in np.frombuffer(file.read(12), dtype=">u4", count=3))
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    offset = 16
    expected = offset + count * height * width
    if os.path.getsize(path) != expected:
        raise DataError(
            f"{path}: {os.path.getsize(path)} bytes, but its header promises {count} images of {height}×{width} "
            f"({expected} bytes); the file is damaged, fetch it again"
        )
    return count, (height, width), offset


def uncompressed(path: Path, folder: Path) -> Path:
    """``path`` itself when it is not gzipped, else its uncompressed copy in ``folder`` (made once, atomically;
    remade when the compressed file is newer)."""
    path = Path(path)
    with path.open("rb") as file:
        if file.read(2) != _GZIP_MAGIC:
            return path
    # one folder per source file, so that copies of two files of the same name never meet
    source = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    target = Path(folder) / source / path.name.removesuffix(".gz")
    if target.exists() and target.stat().st_mtime >= path.stat().st_mtime:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as handle:
        try:
            with gzip.open(path, "rb") as compressed:
                shutil.copyfileobj(compressed, handle)
        except (OSError, EOFError, zlib.error) as exc:
            Path(handle.name).unlink()
            raise DataError(f"{path}: corrupt or truncated gzip data ({exc}); delete it and fetch it again") from exc
    os.replace(handle.name, target)  # processes that uncompress at once each replace it whole
    return target


def lazy_fashion_mnist(
    data_dir: Path | None, *, download: bool = True, cache: Path | None = None
) -> tuple[IdxImages, IdxImages]:
    """Fashion-MNIST's training and test sets read image by image: the files found as the ``lenet`` workload
    finds them (``data_dir``, ``$SCALETRAIN_DATA``, the system folders, the cache, a verified download), a
    gzipped image file uncompressed once into ``cache`` (default: the user cache's ``fashion-mnist-raw``)."""
    folder = find_fashion_mnist(data_dir, download=download)
    cache = cache if cache is not None else cache_dir() / "fashion-mnist-raw"
    sets = []
    for prefix in ("train", "t10k"):
        images = fashion_mnist_file(folder, f"{prefix}-images-idx3-ubyte")
        labels = fashion_mnist_file(folder, f"{prefix}-labels-idx1-ubyte")
        assert images is not None and labels is not None  # find_fashion_mnist found all four
        sets.append(IdxImages(uncompressed(images, cache), labels))
    return sets[0], sets[1]
