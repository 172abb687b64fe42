"""The search order every dataset is found by, and the environment it reads.

This is the only module of :mod:`scaletrain.data` that reads the environment; every function takes an
``environ`` mapping (default :data:`os.environ`) so that tests and callers can pass their own.

The order, walked by :func:`search`: ``--data-dir`` (then only there), ``$SCALETRAIN_DATA``, the
dataset's system folders, the user cache (:func:`cache_dir`); then, for a dataset that can be
downloaded, a verified download into the cache unless ``SCALETRAIN_OFFLINE=1``. ``--data-dir`` and
``$SCALETRAIN_DATA`` are also tried with the dataset's subfolder (``fashion-mnist``, ``cifar-10``,
``ptb``); the system and cache folders already are dataset folders. Each dataset describes itself
with a :class:`Findable` in its own module, beside its reader:
:func:`~scaletrain.data.idx.find_fashion_mnist`, :func:`~scaletrain.data.cifar.find_cifar10`,
:func:`~scaletrain.data.ptb.find_ptb` and :func:`~scaletrain.data.image_folder.find_image_folder`.

Example::

    >>> from scaletrain.data.locate import cache_dir
    >>> cache_dir({"XDG_CACHE_HOME": "/tmp/cache"})
    PosixPath('/tmp/cache/scaletrain')
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scaletrain.errors import DataError

__all__ = [
    "ENV_CIFAR10_URL",
    "ENV_DATA",
    "ENV_FASHION_MNIST_URL",
    "ENV_OFFLINE",
    "ENV_XDG_CACHE_HOME",
    "Download",
    "Findable",
    "cache_dir",
    "is_offline",
    "search",
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


@dataclass(frozen=True)
class Download:
    """How :func:`search` fetches a dataset into the cache when no folder holds it.

    ``fetch(url)`` downloads from ``url`` (``$url_variable``, else ``url``) and returns where the
    dataset now is, or a sentence saying why it still is not there; a :class:`DataError` it raises
    means the download failed. ``fixes`` ends every message that says the dataset was not found.
    """

    url: str
    url_variable: str
    fetch: Callable[[str], Path | str]
    fixes: str


@dataclass(frozen=True)
class Findable:
    """What :func:`search` needs to know about one dataset.

    ``subdirs`` are the folders tried inside ``--data-dir`` (and ``$SCALETRAIN_DATA``, unless
    ``shared_subdirs`` names others), in this order; ``""`` is the folder itself. ``found_in`` are tests
    in order of preference, each returning where in a folder the dataset is, or None: a later test is
    tried only when the earlier one found it in no folder. ``not_in_data_dir(data_dir, looked)`` is the
    message when ``--data-dir`` (as given) lacks it. Failing every usual place, a dataset with a
    ``download`` is downloaded; one without says ``not_found(searched)``.
    """

    name: str
    subdirs: tuple[str, ...]
    found_in: tuple[Callable[[Path], Path | None], ...]
    not_in_data_dir: Callable[[Path, list[Path]], str]
    download: Download | None = None
    not_found: Callable[[list[Path]], str] | None = None
    shared_subdirs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if (self.download is None) == (self.not_found is None):
            raise ValueError(f"{self.name}: give either a download or a not_found message, not both or neither")


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


def _first_found(findable: Findable, folders: list[Path]) -> Path | None:
    for found_in in findable.found_in:
        for folder in folders:
            found = found_in(folder)
            if found is not None:
                return found
    return None


def search(
    findable: Findable,
    data_dir: Path | None,
    fallbacks: Sequence[Path],
    *,
    download: bool = True,
    environ: Mapping[str, str] | None = None,
) -> Path:
    """Where ``findable`` is: in ``data_dir`` when given (then only there), else in ``$SCALETRAIN_DATA``,
    then ``fallbacks`` (its system folders and cache, in order), else downloaded into the cache unless
    ``download`` is false or ``SCALETRAIN_OFFLINE=1``. Raises :class:`DataError` naming every place
    searched and the fixes.

    Example::

        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> notes = Findable(
        ...     name="notes",
        ...     subdirs=("", "notes"),
        ...     found_in=(lambda folder: folder if (folder / "notes.txt").is_file() else None,),
        ...     not_in_data_dir=lambda data_dir, looked: f"--data-dir {data_dir}: no notes.txt",
        ...     not_found=lambda searched: f"no notes.txt in {', '.join(map(str, searched))}",
        ... )
        >>> (folder / "notes").mkdir()
        >>> _ = (folder / "notes" / "notes.txt").write_text("hello")
        >>> search(notes, None, [], environ={ENV_DATA: str(folder)}) == folder / "notes"
        True
    """
    env = _environ(environ)
    if data_dir is not None:
        given = Path(data_dir).expanduser()
        looked = [given / subdir for subdir in findable.subdirs]
        found = _first_found(findable, looked)
        if found is not None:
            return found
        raise DataError(findable.not_in_data_dir(data_dir, looked))

    searched: list[Path] = []
    if env.get(ENV_DATA):
        shared = Path(env[ENV_DATA]).expanduser()
        subdirs = findable.subdirs if findable.shared_subdirs is None else findable.shared_subdirs
        searched += [shared / subdir for subdir in subdirs]
    searched += [Path(folder) for folder in fallbacks]
    found = _first_found(findable, searched)
    if found is not None:
        return found
    if findable.download is None:
        assert findable.not_found is not None  # Findable.__post_init__ checks it
        raise DataError(findable.not_found(searched))

    places = ", ".join(str(folder) for folder in searched)
    fixes = findable.download.fixes
    if not download:
        reason = "downloading was not allowed"
    elif is_offline(env):
        reason = f"downloading was skipped because {ENV_OFFLINE}=1"
    else:
        url = env.get(findable.download.url_variable) or findable.download.url
        try:
            fetched = findable.download.fetch(url)
        except DataError as exc:
            raise DataError(
                f"{findable.name} not found (searched {places}) and the download failed: {exc}. {fixes}"
            ) from exc
        if isinstance(fetched, Path):
            return fetched
        reason = fetched
    raise DataError(f"{findable.name} not found: searched {places}; {reason}. {fixes}")
