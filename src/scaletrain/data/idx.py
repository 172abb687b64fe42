"""IDX files (the MNIST / Fashion-MNIST format) and the Fashion-MNIST dataset built from them.

An IDX file is big-endian: two zero bytes, a type byte (``0x08`` = unsigned byte), a byte giving the
number of dimensions, one unsigned 32-bit size per dimension, then the data in C order. Files may be
gzip-compressed; gzip is recognised by its magic bytes, so a file's name does not have to end in
``.gz``. :func:`find_fashion_mnist` finds the four Fashion-MNIST files or downloads them.

Example::

    >>> import tempfile, numpy as np
    >>> from pathlib import Path
    >>> from scaletrain.data.idx import read_idx, write_idx
    >>> path = Path(tempfile.mkdtemp()) / "labels-idx1-ubyte.gz"
    >>> write_idx(path, np.array([3, 1, 4], dtype=np.uint8))
    >>> read_idx(path).tolist()
    [3, 1, 4]
"""

from __future__ import annotations

import gzip
import math
import os
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from scaletrain.data.download import download as _download
from scaletrain.data.files import read_dataset_bytes
from scaletrain.data.locate import ENV_FASHION_MNIST_URL, ENV_OFFLINE, Download, Findable, cache_dir, search
from scaletrain.errors import DataError

__all__ = [
    "FASHION_MNIST_FILES",
    "FASHION_MNIST_MEAN",
    "FASHION_MNIST_STD",
    "FASHION_MNIST_SUBDIR",
    "FASHION_MNIST_URL",
    "SYSTEM_FASHION_MNIST_DIRS",
    "FashionMNIST",
    "fashion_mnist_file",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "missing_fashion_mnist_files",
    "read_idx",
    "write_idx",
]

#: SHA-256 of the official gzipped files (identical to Debian's ``dataset-fashion-mnist`` package).
FASHION_MNIST_FILES: dict[str, str] = {
    "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
    "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
    "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
    "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
}

#: The official download location named in the zalandoresearch/fashion-mnist README.
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
#: Where Debian's ``dataset-fashion-mnist`` package installs the four gzipped files.
SYSTEM_FASHION_MNIST_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets/fashion-mnist"),)
#: Subfolder of ``--data-dir``, ``$SCALETRAIN_DATA`` and the cache that may hold Fashion-MNIST.
FASHION_MNIST_SUBDIR = "fashion-mnist"

#: Training-set pixel statistics after scaling to [0, 1]; the test set is normalised with the same
#: numbers so that no test information leaks into preprocessing.
FASHION_MNIST_MEAN = 0.2860
FASHION_MNIST_STD = 0.3530

_TRAIN_IMAGES = "train-images-idx3-ubyte"
_TRAIN_LABELS = "train-labels-idx1-ubyte"
_TEST_IMAGES = "t10k-images-idx3-ubyte"
_TEST_LABELS = "t10k-labels-idx1-ubyte"
_STEMS = (_TRAIN_IMAGES, _TRAIN_LABELS, _TEST_IMAGES, _TEST_LABELS)

_UBYTE = 0x08
# Type codes from the IDX description; all but unsigned byte are recognised only to give a precise
# "unsupported" message instead of "not an IDX file".
_KNOWN_TYPES = {
    0x08: "unsigned byte",
    0x09: "signed byte",
    0x0B: "int16",
    0x0C: "int32",
    0x0D: "float32",
    0x0E: "float64",
}
_GZIP_MAGIC = b"\x1f\x8b"
_NUM_CLASSES = 10
_IMAGE_SIDE = 28

_HOW_TO_GET = (
    "get Fashion-MNIST by running `apt-get install dataset-fashion-mnist` as root (installs it in "
    "/usr/share/datasets/fashion-mnist), or download the four .gz files from "
    f"{FASHION_MNIST_URL} into a folder and pass it with --data-dir"
)


def _read_bytes(path: Path) -> bytes:
    raw = read_dataset_bytes(path, when_missing=_HOW_TO_GET)
    if not raw.startswith(_GZIP_MAGIC):
        return raw
    try:
        return gzip.decompress(raw)
    except (gzip.BadGzipFile, EOFError, zlib.error, OSError) as exc:
        raise DataError(
            f"{path}: corrupt or truncated gzip data ({exc}); delete it and fetch it again ({_HOW_TO_GET})"
        ) from exc


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file of unsigned bytes (raw or gzip-compressed) into a uint8 array.

    Raises :class:`DataError` if the file is missing, is not IDX, holds another element type, or is
    shorter or longer than its header says.

    Example::

        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "images-idx3-ubyte"
        >>> write_idx(path, np.zeros((2, 28, 28), dtype=np.uint8))
        >>> read_idx(path).shape
        (2, 28, 28)
    """
    path = Path(path)
    data = _read_bytes(path)
    refetch = f"delete it and fetch it again ({_HOW_TO_GET})"
    if len(data) < 4:
        raise DataError(f"{path}: only {len(data)} bytes, too short for an IDX header; {refetch}")
    type_code, ndim = data[2], data[3]
    if data[0] != 0 or data[1] != 0 or type_code not in _KNOWN_TYPES:
        raise DataError(
            f"{path}: not an IDX file (magic bytes {data[:4].hex()}, expected 000008 followed by the "
            f"number of dimensions); {refetch}"
        )
    if type_code != _UBYTE:
        raise DataError(
            f"{path}: IDX element type {_KNOWN_TYPES[type_code]} is not supported, only unsigned byte; "
            "convert the file to uint8 (write_idx) or use the original dataset file"
        )
    if ndim == 0:
        raise DataError(f"{path}: IDX header declares zero dimensions; {refetch}")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise DataError(
            f"{path}: {len(data)} bytes, too short for an IDX header of {ndim} dimensions "
            f"({header_size} bytes); {refetch}"
        )
    shape = tuple(int(size) for size in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header_size + math.prod(shape)
    if len(data) < expected:
        raise DataError(
            f"{path}: truncated: header promises shape {shape} ({expected} bytes) but the file has "
            f"{len(data)} bytes; {refetch}"
        )
    if len(data) > expected:
        raise DataError(
            f"{path}: {len(data) - expected} unexpected bytes after the data of shape {shape}; "
            f"the file is damaged or not IDX; {refetch}"
        )
    # copy() so callers get a writable array that does not pin the whole file buffer.
    return np.frombuffer(data, dtype=np.uint8, offset=header_size).reshape(shape).copy()


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write a uint8 array as an IDX file, gzip-compressed if ``path`` ends with ``.gz``.

    The file appears atomically: a failed write leaves nothing behind.

    Example::

        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> path = Path(tempfile.mkdtemp()) / "t.gz"
        >>> write_idx(path, np.arange(6, dtype=np.uint8).reshape(2, 3))
        >>> read_idx(path).tolist()
        [[0, 1, 2], [3, 4, 5]]
    """
    path = Path(path)
    array = np.asarray(array)
    if array.dtype != np.uint8:
        raise DataError(
            f"{path}: cannot write dtype {array.dtype} as IDX; only uint8 is supported, "
            "convert with array.astype(numpy.uint8)"
        )
    if not 1 <= array.ndim <= 255:
        raise DataError(f"{path}: cannot write a {array.ndim}-dimensional array as IDX (1 to 255 allowed)")
    header = bytes([0, 0, _UBYTE, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    payload = header + np.ascontiguousarray(array).tobytes()
    if path.name.endswith(".gz"):
        # mtime=0 makes the bytes (and so the checksum) depend only on the array.
        payload = gzip.compress(payload, mtime=0)
    temp_name: str | None = None
    try:
        with tempfile.NamedTemporaryFile(
            dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
        ) as handle:
            temp_name = handle.name
            handle.write(payload)
        os.replace(temp_name, path)
        temp_name = None
    except OSError as exc:
        raise DataError(f"{path}: cannot write ({exc.strerror or exc}); check the folder and free space") from exc
    finally:
        if temp_name is not None:
            Path(temp_name).unlink(missing_ok=True)


def fashion_mnist_file(directory: Path, stem: str) -> Path | None:
    """Return ``directory/stem.gz`` or ``directory/stem``, whichever exists (``.gz`` first), else None.

    Example::

        >>> fashion_mnist_file(Path("/nonexistent"), "train-images-idx3-ubyte") is None
        True
    """
    for candidate in (directory / f"{stem}.gz", directory / stem):
        if candidate.is_file():
            return candidate
    return None


def missing_fashion_mnist_files(directory: Path) -> list[str]:
    """Names of the four Fashion-MNIST files absent from ``directory`` (gzipped or raw both count).

    Example::

        >>> len(missing_fashion_mnist_files(Path("/nonexistent")))
        4
    """
    return [f"{stem}.gz" for stem in _STEMS if fashion_mnist_file(Path(directory), stem) is None]


@dataclass(frozen=True)
class FashionMNIST:
    """Fashion-MNIST as tensors: images float32 ``[N, 1, 28, 28]`` normalised, labels int64 ``[N]``."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor


def _load_split(directory: Path, images_stem: str, labels_stem: str) -> tuple[torch.Tensor, torch.Tensor]:
    images_path = fashion_mnist_file(directory, images_stem)
    labels_path = fashion_mnist_file(directory, labels_stem)
    assert images_path is not None and labels_path is not None  # checked by the caller
    images = read_idx(images_path)
    labels = read_idx(labels_path)
    if images.ndim != 3 or images.shape[1:] != (_IMAGE_SIDE, _IMAGE_SIDE):
        raise DataError(
            f"{images_path}: expected images of shape [N, 28, 28], found {list(images.shape)}; "
            f"this is not a Fashion-MNIST image file; {_HOW_TO_GET}"
        )
    if labels.ndim != 1:
        raise DataError(
            f"{labels_path}: expected a 1-D label vector, found shape {list(labels.shape)}; "
            f"this is not a Fashion-MNIST label file; {_HOW_TO_GET}"
        )
    if images.shape[0] != labels.shape[0]:
        raise DataError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} "
            f"labels; the files come from different datasets or one is damaged; {_HOW_TO_GET}"
        )
    if images.shape[0] == 0:
        raise DataError(f"{images_path}: holds no images; {_HOW_TO_GET}")
    if int(labels.max()) >= _NUM_CLASSES:
        raise DataError(
            f"{labels_path}: label {int(labels.max())} is outside 0..9; this is not a Fashion-MNIST "
            f"label file; {_HOW_TO_GET}"
        )
    pixels = images.astype(np.float32)
    # In place, so the 60,000-image training set exists only once as float32.
    pixels /= 255.0
    pixels -= FASHION_MNIST_MEAN
    pixels /= FASHION_MNIST_STD
    return torch.from_numpy(pixels).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def load_fashion_mnist(directory: Path) -> FashionMNIST:
    """Load the four Fashion-MNIST files from ``directory`` and normalise the images.

    Pixels are scaled to [0, 1], then shifted and scaled by the training-set statistics
    (:data:`FASHION_MNIST_MEAN`, :data:`FASHION_MNIST_STD`). Any number of images is accepted, so
    small generated files work as well as the real 60,000 / 10,000.

    Example::

        >>> import tempfile, numpy as np
        >>> from pathlib import Path
        >>> folder = Path(tempfile.mkdtemp())
        >>> for prefix, count in (("train", 5), ("t10k", 3)):
        ...     write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", np.zeros((count, 28, 28), np.uint8))
        ...     write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.zeros(count, np.uint8))
        >>> data = load_fashion_mnist(folder)
        >>> tuple(data.train_images.shape), data.test_labels.dtype
        ((5, 1, 28, 28), torch.int64)
    """
    directory = Path(directory)
    missing = missing_fashion_mnist_files(directory)
    if missing:
        raise DataError(
            f"{directory}: Fashion-MNIST files missing: {', '.join(missing)} (raw files without .gz also "
            f"work); {_HOW_TO_GET}"
        )
    train_images, train_labels = _load_split(directory, _TRAIN_IMAGES, _TRAIN_LABELS)
    test_images, test_labels = _load_split(directory, _TEST_IMAGES, _TEST_LABELS)
    return FashionMNIST(train_images, train_labels, test_images, test_labels)


def _fixes(cache: Path) -> str:
    names = ", ".join(FASHION_MNIST_FILES)
    return (
        "Fixes: (1) as root run `apt-get install dataset-fashion-mnist` (installs "
        f"{SYSTEM_FASHION_MNIST_DIRS[0]}); (2) put the four files ({names}; raw files without .gz "
        "also work) in a folder and pass it with --data-dir; (3) go online "
        f"(and leave {ENV_OFFLINE} unset) so that scaletrain downloads them into {cache}"
    )


def _complete(folder: Path) -> Path | None:
    return None if missing_fashion_mnist_files(folder) else folder


def find_fashion_mnist(
    data_dir: Path | None,
    *,
    download: bool = True,
    environ: Mapping[str, str] | None = None,
    system_dirs: Sequence[Path] | None = None,
    checksums: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return a folder holding the four Fashion-MNIST files, downloading them if need be.

    ``data_dir`` (or its ``fashion-mnist`` subfolder) must hold the files when given; otherwise the
    first match among ``$SCALETRAIN_DATA`` (and its subfolder), ``system_dirs`` (default
    :data:`SYSTEM_FASHION_MNIST_DIRS`) and ``cache_dir()/fashion-mnist`` wins. Failing all, the files
    listed in ``checksums`` (default :data:`FASHION_MNIST_FILES`) are fetched from
    ``$SCALETRAIN_FASHION_MNIST_URL`` or the official URL into the cache and verified, unless
    ``download`` is false or ``SCALETRAIN_OFFLINE=1``. Raises :class:`DataError` naming every place
    searched and the fixes (the order is :func:`scaletrain.data.locate.search`'s).

    Example::

        >>> import tempfile
        >>> try:
        ...     find_fashion_mnist(None, download=False, environ={"XDG_CACHE_HOME": tempfile.mkdtemp()},
        ...                        system_dirs=[])
        ... except DataError as error:
        ...     print("apt-get install dataset-fashion-mnist" in str(error))
        True
    """
    cache = cache_dir(environ) / FASHION_MNIST_SUBDIR

    def fetch(base_url: str) -> Path | str:
        for name, sha256 in (FASHION_MNIST_FILES if checksums is None else checksums).items():
            _download(f"{base_url.rstrip('/')}/{name}", cache / name, sha256, timeout=timeout)
        still_missing = missing_fashion_mnist_files(cache)
        return f"the download from {base_url} did not provide {', '.join(still_missing)}" if still_missing else cache

    def not_in_data_dir(data_dir: Path, looked: list[Path]) -> str:
        folder = Path(data_dir).expanduser()
        return (
            f"--data-dir {folder}: Fashion-MNIST files missing ({', '.join(missing_fashion_mnist_files(folder))}), "
            f"looked in {folder} and {folder / FASHION_MNIST_SUBDIR}. {_fixes(cache)}; or leave out --data-dir to "
            "search the usual places"
        )

    fashion_mnist = Findable(
        name="Fashion-MNIST",
        subdirs=("", FASHION_MNIST_SUBDIR),
        found_in=(_complete,),
        not_in_data_dir=not_in_data_dir,
        download=Download(FASHION_MNIST_URL, ENV_FASHION_MNIST_URL, fetch, _fixes(cache)),
    )
    system = SYSTEM_FASHION_MNIST_DIRS if system_dirs is None else system_dirs
    return search(fashion_mnist, data_dir, [*system, cache], download=download, environ=environ)
