"""An image-folder reader: one sub-folder per class, images decoded once and cached as uint8 tensors.

The layout is Caltech256's (``256_ObjectCategories/001.ak47/001_0001.jpg``): the classes are the sorted sub-folder
names, a sample's label its folder's position among them. Every image is decoded with Pillow, converted to RGB
(Caltech256 holds some greyscale images), resized to ``image_size``×``image_size`` (bilinear, the aspect ratio is
not kept) and stored as uint8. Of each class's sorted files, file ``i`` is held out for testing when
⌊(i+1)·f⌋ > ⌊i·f⌋ for ``test_fraction`` f (every 10th file for f = 0.1), so every worker, with any seed, agrees on
the split. The decoded tensors are cached in ``cache``, one ``.pt`` file per folder, size, split and file list
(names, sizes and modification times), written atomically, so only the first run decodes. Files without an image
suffix and nested folders are ignored. :func:`find_image_folder` finds the folder to read (never downloaded).

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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from scaletrain.data.locate import ENV_DATA, Findable, cache_dir, search
from scaletrain.errors import DataError

__all__ = [
    "CALTECH256_PAGE",
    "CALTECH256_SUBDIRS",
    "IMAGE_SUFFIXES",
    "ImageFolderData",
    "LabelledImages",
    "decode_image",
    "find_image_folder",
    "image_cache_dir",
    "is_held_out",
    "list_image_folder",
    "load_image_folder",
]

#: File name endings (lower case) read as images; anything else in a class folder is ignored.
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})
_CACHE_FORMAT = 1
_LAYOUT = "one sub-folder of images per class, like Caltech256's 256_ObjectCategories/001.ak47/001_0001.jpg"

#: Where Caltech256's official archive (``256_ObjectCategories.tar``) is published.
CALTECH256_PAGE = "https://data.caltech.edu/records/nyy15-4j048"
#: Subfolders of a data folder tried, in this order, for an image folder.
CALTECH256_SUBDIRS = ("256_ObjectCategories", "caltech256/256_ObjectCategories", "caltech256")
_IMAGE_CACHE_SUBDIR = "image-folder"


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


def image_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where decoded image folders are cached: ``cache_dir()/image-folder``.

    Example::

        >>> image_cache_dir({"XDG_CACHE_HOME": "/tmp/cache"})
        PosixPath('/tmp/cache/scaletrain/image-folder')
    """
    return cache_dir(environ) / _IMAGE_CACHE_SUBDIR


def _existing(folder: Path) -> Path | None:
    return folder if folder.is_dir() else None


def find_image_folder(data_dir: Path | None, *, environ: Mapping[str, str] | None = None) -> Path:
    """Return the folder of class folders to train on: Caltech256's ``256_ObjectCategories`` or your own.

    With ``data_dir`` the first existing of its subfolders :data:`CALTECH256_SUBDIRS` wins, else
    ``data_dir`` itself (any folder with one sub-folder of images per class). Without it, the same
    subfolders of ``$SCALETRAIN_DATA``, then ``cache_dir()/caltech256/256_ObjectCategories`` and
    ``cache_dir()/caltech256`` (the order is :func:`scaletrain.data.locate.search`'s). Nothing is
    downloaded (the archive is 1.2 GB); the :class:`DataError` says where to get it and how to time the
    networks without it.

    Example::

        >>> import tempfile
        >>> data = Path(tempfile.mkdtemp())
        >>> (data / "256_ObjectCategories").mkdir()
        >>> find_image_folder(data) == data / "256_ObjectCategories"
        True
    """
    cache = cache_dir(environ) / "caltech256"

    def nothing_found(flag: str, searched: list[Path]) -> str:
        return (
            f"{flag}: no image folder found; searched {', '.join(str(folder) for folder in searched)}. "
            f"Caltech256: download 256_ObjectCategories.tar from the official Caltech DATA page {CALTECH256_PAGE}, "
            "unpack it with `tar -xf 256_ObjectCategories.tar -C DIR` (this makes "
            "DIR/256_ObjectCategories/001.ak47/001_0001.jpg …) and pass --data-dir DIR (or set "
            f"{ENV_DATA}=DIR, or unpack it into {cache}); any folder with one sub-folder of images per class "
            "works the same way. To time a network without any data, use -o data=synthetic"
        )

    image_folder = Findable(
        name="image folder",
        subdirs=(*CALTECH256_SUBDIRS, ""),
        shared_subdirs=CALTECH256_SUBDIRS,
        found_in=(_existing,),
        not_in_data_dir=lambda data_dir, looked: nothing_found(f"--data-dir {data_dir}", looked),
        not_found=lambda searched: nothing_found("image folder", searched),
    )
    return search(image_folder, data_dir, [cache / "256_ObjectCategories", cache], environ=environ)
