"""CIFAR-10 read from its official binary archive, ``cifar-10-binary.tar.gz`` (Krizhevsky 2009).

The format, as the dataset's page (https://www.cs.toronto.edu/~kriz/cifar.html) describes the binary
version: the archive holds the folder ``cifar-10-batches-bin/`` with ``data_batch_1.bin`` …
``data_batch_5.bin`` (10,000 records each), ``test_batch.bin`` (10,000) and ``batches.meta.txt`` (the
ten class names, one per line). A record is 3,073 bytes: one label byte (0–9), then 1,024 red, 1,024
green and 1,024 blue pixel bytes, each plane row-major 32×32, so a record's pixels already are an
image in [channel, row, column] order. No pickle is read anywhere.

:func:`load_cifar10` reads the members straight out of the ``.tar.gz`` in one pass (nothing is unpacked
to disk), or reads the unpacked folder. Any number of records is accepted, so small generated files
work as well as the real 50,000 / 10,000. :func:`find_cifar10` finds the archive or downloads it.

Example::

    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp()) / BATCHES_FOLDER
    >>> folder.mkdir()
    >>> for name in (*TRAIN_FILES, TEST_FILE):
    ...     _ = (folder / name).write_bytes(bytes([3]) + bytes(RECORD_BYTES - 1))
    >>> data = load_cifar10(folder.parent)
    >>> tuple(data.train_images.shape), data.test_labels.tolist(), data.classes[3]
    ((5, 3, 32, 32), [3], 'cat')
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from scaletrain.data.download import download as _download
from scaletrain.data.files import read_dataset_bytes
from scaletrain.data.locate import ENV_CIFAR10_URL, ENV_OFFLINE, Download, Findable, cache_dir, search
from scaletrain.errors import DataError

__all__ = [
    "ARCHIVE_BYTES",
    "ARCHIVE_MD5",
    "ARCHIVE_NAME",
    "ARCHIVE_SHA256",
    "ARCHIVE_URL",
    "BATCHES_FOLDER",
    "CIFAR10",
    "CIFAR10_SUBDIR",
    "CLASSES",
    "IMAGE_SHAPE",
    "MEMBERS",
    "META_FILE",
    "RECORD_BYTES",
    "TEST_FILE",
    "TRAIN_FILES",
    "cifar10_location",
    "find_cifar10",
    "load_cifar10",
    "missing_cifar10_files",
]

ARCHIVE_NAME = "cifar-10-binary.tar.gz"
ARCHIVE_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
#: Size and MD5 of the archive as the official page gives them.
ARCHIVE_BYTES = 170_052_171
ARCHIVE_MD5 = "c32a1d4ab5d03f1284b67883e8d87530"
#: The official page gives no SHA-256. This one is pinned for the same URL by tensorflow/datasets
#: (tensorflow_datasets/url_checksums/cifar10.txt, with the size 170052171), gomlx/gomlx
#: (examples/cifar/cifar.go, DownloadCifar10) and ankane/torchvision-ruby
#: (lib/torchvision/datasets/cifar10.rb); the three agree.
ARCHIVE_SHA256 = "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"

BATCHES_FOLDER = "cifar-10-batches-bin"
TRAIN_FILES = tuple(f"data_batch_{number}.bin" for number in range(1, 6))
TEST_FILE = "test_batch.bin"
META_FILE = "batches.meta.txt"
#: The archive's members that are read, as they are named inside it.
MEMBERS = tuple(f"{BATCHES_FOLDER}/{name}" for name in (*TRAIN_FILES, TEST_FILE, META_FILE))

IMAGE_SHAPE = (3, 32, 32)
RECORD_BYTES = 1 + 3 * 32 * 32
#: The names in the official ``batches.meta.txt``; used for an unpacked folder that lacks that file.
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
#: Subfolder of ``--data-dir``, ``$SCALETRAIN_DATA`` and the cache that may hold CIFAR-10.
CIFAR10_SUBDIR = "cifar-10"

_BATCH_FILES = (*TRAIN_FILES, TEST_FILE)
_CHUNK_BYTES = 1 << 20
_REFETCH = (
    f"replace it with a fresh copy of {ARCHIVE_NAME} from {ARCHIVE_URL} (SHA-256 {ARCHIVE_SHA256}; unpacking it "
    f"with `tar -xzf {ARCHIVE_NAME}` is optional), or train on Fashion-MNIST with -o dataset=fashion-mnist"
)
_HOW_TO_GET = (
    f"download {ARCHIVE_NAME} from {ARCHIVE_URL} and pass the archive or its folder, or train on Fashion-MNIST "
    "with -o dataset=fashion-mnist"
)


@dataclass(frozen=True)
class CIFAR10:
    """CIFAR-10 as tensors: images uint8 ``[N, 3, 32, 32]`` (red, green, blue), labels int64 ``[N]``, and
    the ten class names in label order."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    test_images: torch.Tensor
    test_labels: torch.Tensor
    classes: tuple[str, ...]


def missing_cifar10_files(folder: Path) -> list[str]:
    """Names of the six batch files (``data_batch_1.bin`` … ``test_batch.bin``) absent from ``folder``.

    Example::

        >>> missing_cifar10_files(Path("/nonexistent"))[-1]
        'test_batch.bin'
    """
    return [name for name in _BATCH_FILES if not (Path(folder) / name).is_file()]


def cifar10_location(folder: Path) -> Path | None:
    """Where CIFAR-10 is in ``folder``, or None: a complete unpacked ``cifar-10-batches-bin`` in it, else
    ``folder`` itself when it holds the six batch files, else its ``cifar-10-binary.tar.gz``.

    An unpacked folder wins over the archive beside it because it is read without decompressing. Only
    names are checked here; :func:`load_cifar10` checks the contents.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> cifar10_location(folder) is None
        True
        >>> _ = (folder / ARCHIVE_NAME).write_bytes(b"")
        >>> cifar10_location(folder).name
        'cifar-10-binary.tar.gz'
    """
    folder = Path(folder)
    for candidate in (folder / BATCHES_FOLDER, folder):
        if candidate.is_dir() and not missing_cifar10_files(candidate):
            return candidate
    archive = folder / ARCHIVE_NAME
    return archive if archive.is_file() else None


def load_cifar10(path: Path) -> CIFAR10:
    """Load CIFAR-10 from ``path``: the archive itself (any file name), the unpacked
    ``cifar-10-batches-bin`` folder, or the folder holding either of them.

    Every problem (missing member or file, truncated record, label outside 0–9, a file that is not a
    gzip-compressed tar) is one :class:`DataError` naming the file and the fix. The class names come
    from ``batches.meta.txt``, or are :data:`CLASSES` when an unpacked folder lacks it.

    Example::

        >>> import io, tarfile, tempfile
        >>> archive = Path(tempfile.mkdtemp()) / ARCHIVE_NAME
        >>> with tarfile.open(archive, "w:gz") as tar:
        ...     for member in MEMBERS[:-1]:
        ...         info = tarfile.TarInfo(member)
        ...         info.size = RECORD_BYTES
        ...         tar.addfile(info, io.BytesIO(bytes([7]) + bytes(RECORD_BYTES - 1)))
        >>> data = load_cifar10(archive)
        >>> data.train_labels.tolist(), data.test_images.dtype
        ([7, 7, 7, 7, 7], torch.uint8)
    """
    path = Path(path)
    if path.is_file():
        contents = _read_archive(path)
    elif path.is_dir():
        found = cifar10_location(path)
        if found is None:
            raise DataError(_nothing_in(path))
        contents = _read_archive(found) if found.is_file() else _read_folder(found)
    else:
        raise DataError(f"{path}: no such file or folder; {_HOW_TO_GET}")
    train_images, train_labels = _records([contents[name] for name in TRAIN_FILES])
    test_images, test_labels = _records([contents[TEST_FILE]])
    return CIFAR10(train_images, train_labels, test_images, test_labels, _classes(contents.get(META_FILE)))


def _nothing_in(folder: Path) -> str:
    for candidate in (folder / BATCHES_FOLDER, folder):
        missing = missing_cifar10_files(candidate)
        if candidate.is_dir() and len(missing) < len(_BATCH_FILES):
            return f"{candidate}: CIFAR-10 files missing: {', '.join(missing)}; {_REFETCH}"
    return (
        f"{folder}: neither {ARCHIVE_NAME} nor a {BATCHES_FOLDER} folder with the six batch files is there; "
        f"{_HOW_TO_GET}"
    )


def _check_size(where: str, size: int) -> None:
    if size == 0 or size % RECORD_BYTES:
        raise DataError(
            f"{where}: {size} bytes is not a whole, non-zero number of {RECORD_BYTES}-byte records (1 label byte "
            f"+ 3,072 pixel bytes), so the file is truncated or damaged; {_REFETCH}"
        )


def _read_folder(folder: Path) -> dict[str, tuple[str, bytes]]:
    contents: dict[str, tuple[str, bytes]] = {}
    for name in (*_BATCH_FILES, META_FILE):
        file = folder / name
        if name == META_FILE and not file.is_file():
            continue
        if name != META_FILE and file.is_file():
            # Checked before reading, so a damaged file fails at once rather than after 30 MB are read.
            _check_size(str(file), file.stat().st_size)
        contents[name] = (str(file), read_dataset_bytes(file, when_missing=_REFETCH))
    return contents


def _read_archive(archive: Path) -> dict[str, tuple[str, bytes]]:
    wanted = {*_BATCH_FILES, META_FILE}
    contents: dict[str, tuple[str, bytes]] = {}
    try:
        with tarfile.open(archive, "r:gz") as tar:
            # Iterating reads the archive once, front to back; getmembers() followed by extractfile()
            # would seek backwards and so decompress the 170 MB stream again for every member.
            for member in tar:
                name = PurePosixPath(member.name).name
                if name not in wanted or name in contents or not member.isfile():
                    continue
                where = f"{archive} (member {member.name})"
                if name != META_FILE:
                    _check_size(where, member.size)
                handle = tar.extractfile(member)
                assert handle is not None  # member.isfile()
                contents[name] = (where, handle.read())
            # Reading on to the end makes gzip check its CRC-32 and length trailer, which catches damage
            # that decompresses without complaint and an archive cut short after its last member.
            while tar.fileobj is not None and tar.fileobj.read(_CHUNK_BYTES):
                pass
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        # gzip.BadGzipFile (a CRC error) is an OSError; a stream cut short raises EOFError or ReadError.
        raise DataError(
            f"{archive}: not a readable gzip-compressed tar archive ({exc}), so it is damaged, cut short or "
            f"not {ARCHIVE_NAME}; {_REFETCH}"
        ) from exc
    missing = [f"{BATCHES_FOLDER}/{name}" for name in _BATCH_FILES if name not in contents]
    if missing:
        raise DataError(f"{archive}: the archive lacks {', '.join(missing)}; {_REFETCH}")
    return contents


def _records(files: list[tuple[str, bytes]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Images ``[N, 3, 32, 32]`` uint8 and labels ``[N]`` int64 from whole batch files, in file order."""
    for where, raw in files:
        _check_size(where, len(raw))
    counts = [len(raw) // RECORD_BYTES for _, raw in files]
    images = np.empty((sum(counts), RECORD_BYTES - 1), dtype=np.uint8)
    labels = np.empty(sum(counts), dtype=np.int64)
    start = 0
    for (where, raw), count in zip(files, counts, strict=True):
        rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, RECORD_BYTES)
        bad = np.flatnonzero(rows[:, 0] >= len(CLASSES))
        if bad.size:
            raise DataError(
                f"{where}: record {int(bad[0])} has label {int(rows[bad[0], 0])}, outside 0–9, so the file is "
                f"damaged or not CIFAR-10; {_REFETCH}"
            )
        # One copy per file straight into the result: the pixels of a record are already [c, y, x].
        images[start : start + count] = rows[:, 1:]
        labels[start : start + count] = rows[:, 0]
        start += count
    return torch.from_numpy(images).view(-1, *IMAGE_SHAPE), torch.from_numpy(labels)


def _classes(meta: tuple[str, bytes] | None) -> tuple[str, ...]:
    if meta is None:
        return CLASSES
    where, raw = meta
    names = tuple(line.strip() for line in raw.decode("utf-8", errors="replace").splitlines() if line.strip())
    if len(names) != len(CLASSES):
        raise DataError(
            f"{where}: {len(names)} class names where CIFAR-10 has {len(CLASSES)} (one per line), so the file "
            f"is damaged; {_REFETCH}"
        )
    return names


def _fixes(cache: Path) -> str:
    return (
        f"Fixes: (1) put {ARCHIVE_NAME} (or its unpacked {BATCHES_FOLDER} folder) in a folder and pass it with "
        f"--data-dir; (2) go online (and leave {ENV_OFFLINE} unset) so that scaletrain downloads it into {cache}; "
        "(3) train the same network on Fashion-MNIST with -o dataset=fashion-mnist"
    )


def _incomplete(folders: Sequence[Path]) -> str:
    """``; FOLDER lacks NAMES`` for each of ``folders`` (and its batches folder) that holds only some batch files."""
    notes = []
    for folder in folders:
        for candidate in (folder, folder / BATCHES_FOLDER):
            missing = missing_cifar10_files(candidate)
            if candidate.is_dir() and 0 < len(missing) < len(_BATCH_FILES):
                notes.append(f"; {candidate} lacks {', '.join(missing)}")
    return "".join(notes)


def find_cifar10(
    data_dir: Path | None,
    *,
    download: bool = True,
    environ: Mapping[str, str] | None = None,
    system_dirs: Sequence[Path] | None = None,
    sha256: str | None = None,
    timeout: float = 60.0,
) -> Path:
    """Return the CIFAR-10 archive or unpacked folder for :func:`load_cifar10`, downloading the archive if
    need be.

    The same order as :func:`~scaletrain.data.idx.find_fashion_mnist` (:func:`scaletrain.data.locate.search`'s):
    ``data_dir`` (or its ``cifar-10`` subfolder) must hold it when given; otherwise the first of
    ``$SCALETRAIN_DATA`` (and its subfolder), ``system_dirs`` (default: none) and ``cache_dir()/cifar-10``
    that holds ``cifar-10-binary.tar.gz`` or the unpacked ``cifar-10-batches-bin`` folder wins (see
    :func:`cifar10_location`). Failing all, the archive is fetched from ``$SCALETRAIN_CIFAR10_URL`` (a full
    URL of the archive) or the official URL into the cache and must match ``sha256`` (default
    :data:`ARCHIVE_SHA256`), unless ``download`` is false or ``SCALETRAIN_OFFLINE=1``. Raises
    :class:`DataError` naming every place searched and the fixes.

    Example::

        >>> import tempfile
        >>> try:
        ...     find_cifar10(None, download=False, environ={"XDG_CACHE_HOME": tempfile.mkdtemp()})
        ... except DataError as error:
        ...     print("-o dataset=fashion-mnist" in str(error))
        True
    """
    cache = cache_dir(environ) / CIFAR10_SUBDIR

    def fetch(url: str) -> Path:
        return _download(url, cache / ARCHIVE_NAME, ARCHIVE_SHA256 if sha256 is None else sha256, timeout=timeout)

    def not_in_data_dir(data_dir: Path, looked: list[Path]) -> str:
        folder = Path(data_dir).expanduser()
        return (
            f"--data-dir {folder}: no CIFAR-10 there (looked for {ARCHIVE_NAME}, a {BATCHES_FOLDER} folder or "
            f"the six batch files in {folder} and {folder / CIFAR10_SUBDIR}{_incomplete(looked)}). "
            f"{_fixes(cache)}; or leave out --data-dir to search the usual places"
        )

    cifar10 = Findable(
        name="CIFAR-10",
        subdirs=("", CIFAR10_SUBDIR),
        found_in=(cifar10_location,),
        not_in_data_dir=not_in_data_dir,
        download=Download(ARCHIVE_URL, ENV_CIFAR10_URL, fetch, _fixes(cache)),
    )
    return search(cifar10, data_dir, [*(system_dirs or ()), cache], download=download, environ=environ)
