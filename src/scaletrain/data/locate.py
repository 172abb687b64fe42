"""Finding datasets on disk, and fetching Fashion-MNIST when it is nowhere to be found.

This is the only module of :mod:`scaletrain.data` that reads the environment; every function takes an
``environ`` mapping (default :data:`os.environ`) so that tests and callers can pass their own.

Search order for Fashion-MNIST: ``--data-dir`` (then only there), ``$SCALETRAIN_DATA``, Debian's
``dataset-fashion-mnist`` package folder, the user cache; then a verified download into the cache
unless ``SCALETRAIN_OFFLINE=1``. Each folder is also tried with a ``fashion-mnist`` (or ``ptb``)
subfolder, except the system and cache folders, which already are dataset folders. Image folders
(Caltech256) are looked for in the same places but never downloaded: see :func:`find_image_folder`.
CIFAR-10 (:func:`find_cifar10`) is searched in the same order, with a ``cifar-10`` subfolder and no
system folder by default, and its single archive is downloaded from ``$SCALETRAIN_CIFAR10_URL`` or
the official URL.

Example::

    >>> from scaletrain.data.locate import cache_dir
    >>> cache_dir({"XDG_CACHE_HOME": "/tmp/cache"})
    PosixPath('/tmp/cache/scaletrain')
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from scaletrain.data.cifar import (
    ARCHIVE_NAME,
    ARCHIVE_SHA256,
    ARCHIVE_URL,
    BATCHES_FOLDER,
    TEST_FILE,
    TRAIN_FILES,
    cifar10_location,
    missing_cifar10_files,
)
from scaletrain.data.download import download as _download
from scaletrain.data.idx import FASHION_MNIST_FILES, FASHION_MNIST_URL, missing_fashion_mnist_files
from scaletrain.errors import DataError

__all__ = [
    "CALTECH256_PAGE",
    "CALTECH256_SUBDIRS",
    "CIFAR10_SUBDIR",
    "ENV_CIFAR10_URL",
    "ENV_DATA",
    "ENV_FASHION_MNIST_URL",
    "ENV_OFFLINE",
    "ENV_XDG_CACHE_HOME",
    "FASHION_MNIST_SUBDIR",
    "PTB_SUBDIR",
    "SYSTEM_FASHION_MNIST_DIRS",
    "cache_dir",
    "find_cifar10",
    "find_fashion_mnist",
    "find_image_folder",
    "find_ptb",
    "image_cache_dir",
    "is_offline",
]

#: A folder holding datasets, each possibly in its own subfolder (``fashion-mnist``, ``ptb``).
ENV_DATA = "SCALETRAIN_DATA"
#: ``1`` forbids downloads.
ENV_OFFLINE = "SCALETRAIN_OFFLINE"
#: Replaces :data:`~scaletrain.data.idx.FASHION_MNIST_URL`, e.g. to use a mirror or a local server.
ENV_FASHION_MNIST_URL = "SCALETRAIN_FASHION_MNIST_URL"
ENV_XDG_CACHE_HOME = "XDG_CACHE_HOME"
#: Replaces :data:`~scaletrain.data.cifar.ARCHIVE_URL` (a full URL of the archive), e.g. a mirror.
ENV_CIFAR10_URL = "SCALETRAIN_CIFAR10_URL"
#: Subfolder of ``--data-dir``, ``$SCALETRAIN_DATA`` and the cache that may hold CIFAR-10.
CIFAR10_SUBDIR = "cifar-10"

#: Where Debian's ``dataset-fashion-mnist`` package installs the four gzipped files.
SYSTEM_FASHION_MNIST_DIRS: tuple[Path, ...] = (Path("/usr/share/datasets/fashion-mnist"),)
FASHION_MNIST_SUBDIR = "fashion-mnist"
PTB_SUBDIR = "ptb"

#: Where Caltech256's official archive (``256_ObjectCategories.tar``) is published.
CALTECH256_PAGE = "https://data.caltech.edu/records/nyy15-4j048"
#: Subfolders of a data folder tried, in this order, for an image folder.
CALTECH256_SUBDIRS = ("256_ObjectCategories", "caltech256/256_ObjectCategories", "caltech256")
_IMAGE_CACHE_SUBDIR = "image-folder"

_PTB_REQUIRED = ("ptb.valid.txt", "ptb.test.txt")
_PTB_TRAIN = "ptb.train.txt"
_PTB_ARCHIVE = "http://www.fit.vutbr.cz/~imikolov/rnnlm/simple-examples.tgz"


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The user cache for scaletrain: ``$XDG_CACHE_HOME/scaletrain``, else ``~/.cache/scaletrain``.

    A relative ``XDG_CACHE_HOME`` is ignored, as the XDG base-directory specification asks.

    Example::

        >>> cache_dir({"XDG_CACHE_HOME": "/var/cache/me"})
        PosixPath('/var/cache/me/scaletrain')
    """
    base = _environ(environ).get(ENV_XDG_CACHE_HOME, "")
    if base and Path(base).is_absolute():
        return Path(base) / "scaletrain"
    return Path.home() / ".cache" / "scaletrain"


def is_offline(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``SCALETRAIN_OFFLINE`` is ``1``: nothing may be downloaded.

    Example::

        >>> is_offline({"SCALETRAIN_OFFLINE": "1"}), is_offline({})
        (True, False)
    """
    return _environ(environ).get(ENV_OFFLINE, "").strip() == "1"


def _with_subdir(folder: Path, subdir: str) -> list[Path]:
    return [folder, folder / subdir]


def _fashion_candidates(environ: Mapping[str, str], system_dirs: Sequence[Path]) -> list[Path]:
    candidates: list[Path] = []
    if environ.get(ENV_DATA):
        candidates += _with_subdir(Path(environ[ENV_DATA]).expanduser(), FASHION_MNIST_SUBDIR)
    candidates += [Path(folder) for folder in system_dirs]
    candidates.append(cache_dir(environ) / FASHION_MNIST_SUBDIR)
    return candidates


def _fashion_fixes(cache: Path) -> str:
    names = ", ".join(FASHION_MNIST_FILES)
    return (
        "Fixes: (1) as root run `apt-get install dataset-fashion-mnist` (installs "
        f"{SYSTEM_FASHION_MNIST_DIRS[0]}); (2) put the four files ({names}; raw files without .gz "
        "also work) in a folder and pass it with --data-dir; (3) go online "
        f"(and leave {ENV_OFFLINE} unset) so that scaletrain downloads them into {cache}"
    )


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
    listed in ``checksums`` (default :data:`~scaletrain.data.idx.FASHION_MNIST_FILES`) are fetched
    from ``$SCALETRAIN_FASHION_MNIST_URL`` or the official URL into the cache and verified, unless
    ``download`` is false or ``SCALETRAIN_OFFLINE=1``. Raises :class:`DataError` naming every place
    searched and the fixes.

    Example::

        >>> import tempfile
        >>> try:
        ...     find_fashion_mnist(None, download=False, environ={"XDG_CACHE_HOME": tempfile.mkdtemp()},
        ...                        system_dirs=[])
        ... except DataError as error:
        ...     print("apt-get install dataset-fashion-mnist" in str(error))
        True
    """
    env = _environ(environ)
    cache = cache_dir(env) / FASHION_MNIST_SUBDIR
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        for folder in _with_subdir(data_dir, FASHION_MNIST_SUBDIR):
            if not missing_fashion_mnist_files(folder):
                return folder
        missing = ", ".join(missing_fashion_mnist_files(data_dir))
        raise DataError(
            f"--data-dir {data_dir}: Fashion-MNIST files missing ({missing}), looked in {data_dir} and "
            f"{data_dir / FASHION_MNIST_SUBDIR}. {_fashion_fixes(cache)}; or leave out --data-dir to "
            "search the usual places"
        )

    searched = _fashion_candidates(env, SYSTEM_FASHION_MNIST_DIRS if system_dirs is None else system_dirs)
    for folder in searched:
        if not missing_fashion_mnist_files(folder):
            return folder

    places = ", ".join(str(folder) for folder in searched)
    if not download:
        reason = "downloading was not allowed"
    elif is_offline(env):
        reason = f"downloading was skipped because {ENV_OFFLINE}=1"
    else:
        base_url = env.get(ENV_FASHION_MNIST_URL) or FASHION_MNIST_URL
        table = FASHION_MNIST_FILES if checksums is None else checksums
        try:
            for name, sha256 in table.items():
                _download(f"{base_url.rstrip('/')}/{name}", cache / name, sha256, timeout=timeout)
        except DataError as exc:
            raise DataError(
                f"Fashion-MNIST not found (searched {places}) and the download failed: {exc}. {_fashion_fixes(cache)}"
            ) from exc
        still_missing = missing_fashion_mnist_files(cache)
        if not still_missing:
            return cache
        reason = f"the download from {base_url} did not provide {', '.join(still_missing)}"
    raise DataError(f"Fashion-MNIST not found: searched {places}; {reason}. {_fashion_fixes(cache)}")


def _cifar_fixes(cache: Path) -> str:
    return (
        f"Fixes: (1) put {ARCHIVE_NAME} (or its unpacked {BATCHES_FOLDER} folder) in a folder and pass it with "
        f"--data-dir; (2) go online (and leave {ENV_OFFLINE} unset) so that scaletrain downloads it into {cache}; "
        "(3) train the same network on Fashion-MNIST with -o dataset=fashion-mnist"
    )


def _cifar_incomplete(folders: Sequence[Path]) -> str:
    """``; FOLDER lacks NAMES`` for each of ``folders`` (and its batches folder) that holds only some batch files."""
    notes = []
    for folder in folders:
        for candidate in (folder, folder / BATCHES_FOLDER):
            missing = missing_cifar10_files(candidate)
            if candidate.is_dir() and 0 < len(missing) < len((*TRAIN_FILES, TEST_FILE)):
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
    """Return the CIFAR-10 archive or unpacked folder for :func:`~scaletrain.data.cifar.load_cifar10`,
    downloading the archive if need be.

    The same order as :func:`find_fashion_mnist`: ``data_dir`` (or its ``cifar-10`` subfolder) must hold
    it when given; otherwise the first of ``$SCALETRAIN_DATA`` (and its subfolder), ``system_dirs``
    (default: none) and ``cache_dir()/cifar-10`` that holds ``cifar-10-binary.tar.gz`` or the unpacked
    ``cifar-10-batches-bin`` folder wins (see :func:`~scaletrain.data.cifar.cifar10_location`). Failing
    all, the archive is fetched from ``$SCALETRAIN_CIFAR10_URL`` (a full URL of the archive) or the
    official URL into the cache and must match ``sha256`` (default
    :data:`~scaletrain.data.cifar.ARCHIVE_SHA256`), unless ``download`` is false or
    ``SCALETRAIN_OFFLINE=1``. Raises :class:`DataError` naming every place searched and the fixes.

    Example::

        >>> import tempfile
        >>> try:
        ...     find_cifar10(None, download=False, environ={"XDG_CACHE_HOME": tempfile.mkdtemp()})
        ... except DataError as error:
        ...     print("-o dataset=fashion-mnist" in str(error))
        True
    """
    env = _environ(environ)
    cache = cache_dir(env) / CIFAR10_SUBDIR
    if data_dir is not None:
        data_dir = Path(data_dir).expanduser()
        looked = _with_subdir(data_dir, CIFAR10_SUBDIR)
        for folder in looked:
            found = cifar10_location(folder)
            if found is not None:
                return found
        raise DataError(
            f"--data-dir {data_dir}: no CIFAR-10 there (looked for {ARCHIVE_NAME}, a {BATCHES_FOLDER} folder or "
            f"the six batch files in {data_dir} and {data_dir / CIFAR10_SUBDIR}{_cifar_incomplete(looked)}). "
            f"{_cifar_fixes(cache)}; or leave out --data-dir to search the usual places"
        )

    searched: list[Path] = []
    if env.get(ENV_DATA):
        searched += _with_subdir(Path(env[ENV_DATA]).expanduser(), CIFAR10_SUBDIR)
    searched += [Path(folder) for folder in system_dirs or ()]
    searched.append(cache)
    for folder in searched:
        found = cifar10_location(folder)
        if found is not None:
            return found

    places = ", ".join(str(folder) for folder in searched)
    if not download:
        reason = "downloading was not allowed"
    elif is_offline(env):
        reason = f"downloading was skipped because {ENV_OFFLINE}=1"
    else:
        url = env.get(ENV_CIFAR10_URL) or ARCHIVE_URL
        try:
            return _download(url, cache / ARCHIVE_NAME, ARCHIVE_SHA256 if sha256 is None else sha256, timeout=timeout)
        except DataError as exc:
            raise DataError(
                f"CIFAR-10 not found (searched {places}) and the download failed: {exc}. {_cifar_fixes(cache)}"
            ) from exc
    raise DataError(f"CIFAR-10 not found: searched {places}; {reason}. {_cifar_fixes(cache)}")


def _has_ptb(folder: Path, *, need_train: bool) -> bool:
    names = (*_PTB_REQUIRED, _PTB_TRAIN) if need_train else _PTB_REQUIRED
    return all((folder / name).is_file() for name in names)


def find_ptb(
    data_dir: Path | None,
    *,
    environ: Mapping[str, str] | None = None,
    system_dirs: Sequence[Path] | None = None,
) -> Path:
    """Return a folder holding Mikolov's ``ptb.valid.txt`` and ``ptb.test.txt`` (ideally ``ptb.train.txt``).

    Searched: ``data_dir`` and its ``ptb`` subfolder when given (then nowhere else), otherwise
    ``$SCALETRAIN_DATA`` (and ``ptb`` subfolder), then ``system_dirs`` (default: ``cache_dir()/ptb``).
    A folder that also has ``ptb.train.txt`` is preferred over an earlier one without it. Nothing is
    downloaded. Raises :class:`DataError` naming the places searched and where the files come from.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> for name in ("ptb.valid.txt", "ptb.test.txt"):
        ...     _ = (folder / name).write_text("a b\\n")
        >>> find_ptb(folder) == folder
        True
    """
    env = _environ(environ)
    if data_dir is not None:
        candidates = _with_subdir(Path(data_dir).expanduser(), PTB_SUBDIR)
    else:
        candidates = []
        if env.get(ENV_DATA):
            candidates += _with_subdir(Path(env[ENV_DATA]).expanduser(), PTB_SUBDIR)
        default_dirs = [cache_dir(env) / PTB_SUBDIR] if system_dirs is None else system_dirs
        candidates += [Path(folder) for folder in default_dirs]

    for need_train in (True, False):
        for folder in candidates:
            if _has_ptb(folder, need_train=need_train):
                return folder

    flag = f"--data-dir {data_dir}" if data_dir is not None else "Penn Treebank"
    raise DataError(
        f"{flag}: ptb.valid.txt and ptb.test.txt not found; searched "
        f"{', '.join(str(folder) for folder in candidates)}. The files ptb.train.txt, ptb.valid.txt and "
        f"ptb.test.txt come from the data/ folder of Mikolov's simple-examples archive ({_PTB_ARCHIVE}); "
        f"put them in a folder and pass it with --data-dir (or set {ENV_DATA})"
    )


def image_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where decoded image folders are cached: ``cache_dir()/image-folder``.

    Example::

        >>> image_cache_dir({"XDG_CACHE_HOME": "/tmp/cache"})
        PosixPath('/tmp/cache/scaletrain/image-folder')
    """
    return cache_dir(environ) / _IMAGE_CACHE_SUBDIR


def find_image_folder(data_dir: Path | None, *, environ: Mapping[str, str] | None = None) -> Path:
    """Return the folder of class folders to train on: Caltech256's ``256_ObjectCategories`` or your own.

    With ``data_dir`` the first existing of its subfolders :data:`CALTECH256_SUBDIRS` wins, else
    ``data_dir`` itself (any folder with one sub-folder of images per class). Without it, the same
    subfolders of ``$SCALETRAIN_DATA``, then ``cache_dir()/caltech256/256_ObjectCategories`` and
    ``cache_dir()/caltech256``. Nothing is downloaded (the archive is 1.2 GB); the
    :class:`DataError` says where to get it and how to time the networks without it.

    Example::

        >>> import tempfile
        >>> data = Path(tempfile.mkdtemp())
        >>> (data / "256_ObjectCategories").mkdir()
        >>> find_image_folder(data) == data / "256_ObjectCategories"
        True
    """
    env = _environ(environ)
    cache = cache_dir(env) / "caltech256"
    if data_dir is not None:
        base = Path(data_dir).expanduser()
        candidates = [base / subdir for subdir in CALTECH256_SUBDIRS] + [base]
    else:
        candidates = []
        if env.get(ENV_DATA):
            candidates += [Path(env[ENV_DATA]).expanduser() / subdir for subdir in CALTECH256_SUBDIRS]
        candidates += [cache / "256_ObjectCategories", cache]
    for folder in candidates:
        if folder.is_dir():
            return folder
    flag = f"--data-dir {data_dir}" if data_dir is not None else "image folder"
    raise DataError(
        f"{flag}: no image folder found; searched {', '.join(str(folder) for folder in candidates)}. "
        f"Caltech256: download 256_ObjectCategories.tar from the official Caltech DATA page {CALTECH256_PAGE}, "
        "unpack it with `tar -xf 256_ObjectCategories.tar -C DIR` (this makes "
        "DIR/256_ObjectCategories/001.ak47/001_0001.jpg …) and pass --data-dir DIR (or set "
        f"{ENV_DATA}=DIR, or unpack it into {cache}); any folder with one sub-folder of images per class "
        "works the same way. To time a network without any data, use -o data=synthetic"
    )
