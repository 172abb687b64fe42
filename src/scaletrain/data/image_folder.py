"""An image-folder reader: one sub-folder per class, images decoded once and cached as uint8 tensors.

The layout is Caltech256's (``256_ObjectCategories/001.ak47/001_0001.jpg``): the classes are the
sorted sub-folder names, a sample's label is its folder's position among them. Every image is
decoded with Pillow, converted to RGB (Caltech256 holds some greyscale images), resized to
``image_size``×``image_size`` (bilinear, the aspect ratio is not kept) and stored as uint8.

The test set is not drawn at random: of each class's sorted files, file ``i`` is held out when
⌊(i+1)·f⌋ > ⌊i·f⌋ for ``test_fraction`` f (every 10th file for f = 0.1). So every worker of a
distributed run, with any seed, agrees on the split.

The decoded tensors are cached in ``cache`` (one ``.pt`` file per folder, size, split and file
list — names, sizes and modification times), written atomically (a temporary file renamed into
place), so a second run, and every worker after the first, skips the decoding. Files that are not
images by their suffix (Caltech256 has a few) and nested folders are ignored.

Example::

    >>> import tempfile
    >>> from PIL import Image
    >>> root = Path(tempfile.mkdtemp())
    >>> for name in ("cat", "dog"):
    ...     (root / name).mkdir()
    ...     for index in range(4):
    ...         Image.new("RGB", (40, 30), (index * 60, 0, 0)).save(root / name / f"{index}.png")
    >>> data = load_image_folder(root, image_size=32, test_fraction=0.25)
    >>> data.classes, len(data.train), len(data.test), tuple(data.train.images.shape[1:])
    (('cat', 'dog'), 6, 2, (3, 32, 32))
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import pickle
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from scaletrain.errors import DataError

__all__ = [
    "IMAGE_SUFFIXES",
    "ImageFolderData",
    "LabelledImages",
    "decode_image",
    "is_held_out",
    "list_image_folder",
    "load_image_folder",
]

#: File name endings (lower case) read as images; anything else in a class folder is ignored.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})
_CACHE_FORMAT = 1
_LAYOUT = "one sub-folder of images per class, like Caltech256's 256_ObjectCategories/001.ak47/001_0001.jpg"


@dataclass(frozen=True)
class LabelledImages:
    """uint8 RGB images (N×3×S×S) and their int64 class labels."""

    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The images and labels at ``indices``."""
        return self.images[indices], self.labels[indices]


@dataclass(frozen=True)
class ImageFolderData:
    """A decoded image folder: class names, training and test images, and whether the cache served it."""

    folder: Path
    classes: tuple[str, ...]
    train: LabelledImages
    test: LabelledImages
    from_cache: bool = False


def is_held_out(index: int, fraction: float) -> bool:
    """Whether a class's ``index``-th file (sorted by name) belongs to the test set.

    The held-out files are spread evenly: ⌊(i+1)·f⌋ > ⌊i·f⌋.

    >>> [i for i in range(30) if is_held_out(i, 0.1)]
    [9, 19, 29]
    """
    return math.floor((index + 1) * fraction) > math.floor(index * fraction)


def list_image_folder(folder: Path) -> list[tuple[str, list[Path]]]:
    """The classes (sorted sub-folder names) with their image files (sorted); errors name the fix."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: no such folder; an image folder has {_LAYOUT}")
    classes = sorted(entry for entry in folder.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise DataError(
            f"{folder} holds no class folders; an image folder has {_LAYOUT}. Pass the folder that holds "
            "the class folders with --data-dir"
        )
    listing = []
    for class_folder in classes:
        files = sorted(
            path
            for path in class_folder.iterdir()
            if path.suffix.lower() in IMAGE_SUFFIXES and path.is_file() and not path.name.startswith(".")
        )
        if not files:
            raise DataError(
                f"class folder {class_folder} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); "
                "add its images or remove the folder"
            )
        listing.append((class_folder.name, files))
    return listing


def decode_image(path: Path, image_size: int) -> torch.Tensor:
    """One image file as a 3×S×S uint8 RGB tensor; an unreadable file is a :class:`DataError` naming it."""
    try:
        with Image.open(path) as image:
            # Lets the JPEG decoder shrink by 2, 4 or 8 while decoding: much faster for large photos.
            image.draft("RGB", (image_size, image_size))
            rgb = image.convert("RGB").resize((image_size, image_size), Image.Resampling.BILINEAR)
            pixels = np.asarray(rgb, dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise DataError(
            f"{path}: cannot decode the image ({exc}); delete or replace the file (or unpack the archive again)"
        ) from exc
    return torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()


def load_image_folder(
    folder: Path,
    *,
    image_size: int,
    test_fraction: float = 0.1,
    num_classes: int | None = None,
    cache: Path | None = None,
) -> ImageFolderData:
    """Decode (or read from ``cache``) every image of ``folder`` and split it into training and test sets.

    ``num_classes`` (the network's outputs), when given, must be at least the number of class folders.
    Raises :class:`DataError` for a missing folder, no class folders, a class folder without images,
    an undecodable image and too many classes, each naming the fix.
    """
    folder = Path(folder)
    listing = list_image_folder(folder)
    classes = tuple(name for name, _ in listing)
    if num_classes is not None and len(classes) > num_classes:
        raise DataError(
            f"{folder} has {len(classes)} class folders but the network has {num_classes} outputs; pass "
            f"--num-classes {len(classes)} (or -o num_classes={len(classes)})"
        )
    cache_file = None
    if cache is not None:
        key = _cache_key(folder, listing, image_size, test_fraction)
        cache_file = Path(cache) / f"{folder.name}-{image_size}px-{key[:16]}.pt"
        cached = _read_cache(cache_file, key)
        if cached is not None:
            return ImageFolderData(folder, classes, *cached, from_cache=True)

    splits: dict[bool, tuple[list[Path], list[int]]] = {False: ([], []), True: ([], [])}
    for label, (_, files) in enumerate(listing):
        for index, path in enumerate(files):
            paths, labels = splits[is_held_out(index, test_fraction)]
            paths.append(path)
            labels.append(label)
    for held_out, split in ((False, "training"), (True, "test")):
        if not splits[held_out][0]:
            raise DataError(
                f"{folder}: test_fraction {test_fraction} leaves the {split} set empty; use a test_fraction "
                "nearer 0.5 (-o test_fraction=...) or more images per class"
            )
    train, test = (_decode_all(*splits[held_out], image_size) for held_out in (False, True))
    if cache_file is not None:
        _write_cache(cache_file, key, train, test)
    return ImageFolderData(folder, classes, train, test)


def _decode_all(paths: list[Path], labels: list[int], image_size: int) -> LabelledImages:
    images = torch.empty(len(paths), 3, image_size, image_size, dtype=torch.uint8)
    for row, path in enumerate(paths):
        images[row] = decode_image(path, image_size)
    return LabelledImages(images, torch.tensor(labels, dtype=torch.long))


def _cache_key(folder: Path, listing: list[tuple[str, list[Path]]], image_size: int, test_fraction: float) -> str:
    files = []
    for name, paths in listing:
        for path in paths:
            status = path.stat()
            files.append([name, path.name, status.st_size, status.st_mtime_ns])
    description = {
        "format": _CACHE_FORMAT,
        "folder": str(folder.resolve()),
        "image_size": image_size,
        "test_fraction": test_fraction,
        "files": files,
    }
    return hashlib.sha256(json.dumps(description).encode()).hexdigest()


def _read_cache(path: Path, key: str) -> tuple[LabelledImages, LabelledImages] | None:
    if not path.is_file():
        return None
    try:
        # mmap: worker processes on one machine share the page cache instead of a copy each.
        content = torch.load(path, weights_only=True, mmap=True)
        if content["key"] != key:
            return None
        return (
            LabelledImages(content["train_images"], content["train_labels"]),
            LabelledImages(content["test_images"], content["test_labels"]),
        )
    except (OSError, RuntimeError, EOFError, KeyError, TypeError, pickle.UnpicklingError) as exc:
        warnings.warn(f"ignoring the unreadable image cache {path} ({exc}); decoding the images again", stacklevel=3)
        return None


def _write_cache(path: Path, key: str, train: LabelledImages, test: LabelledImages) -> None:
    content = {
        "key": key,
        "train_images": train.images,
        "train_labels": train.labels,
        "test_images": test.images,
        "test_labels": test.labels,
    }
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Several workers may decode at once: each writes its own temporary file, the last rename wins,
        # and a reader sees either no file or a whole one.
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "wb") as file:
            torch.save(content, file)
        os.replace(temporary, path)
    except (OSError, RuntimeError) as exc:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        warnings.warn(f"could not write the image cache {path} ({exc}); the next run decodes again", stacklevel=3)
