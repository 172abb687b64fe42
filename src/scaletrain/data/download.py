"""Verified downloads: stream to a temporary file, check SHA-256, then move into place atomically.

A reader therefore never sees a half-written or unverified file at the destination, whatever fails
(network, checksum, full disk, Ctrl-C).

Example::

    >>> import hashlib, tempfile
    >>> from pathlib import Path
    >>> source = Path(tempfile.mkdtemp()) / "hello.txt"
    >>> _ = source.write_bytes(b"hello")
    >>> digest = hashlib.sha256(b"hello").hexdigest()
    >>> download(source.as_uri(), source.parent / "copy.txt", digest).read_bytes()
    b'hello'
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import os
import re
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import BinaryIO

from scaletrain.errors import DataError

__all__ = ["download", "file_sha256"]

_CHUNK_BYTES = 1 << 20
_SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks so large files do not need to fit in memory.

    Example::

        >>> import tempfile
        >>> path = Path(tempfile.mkdtemp()) / "empty"
        >>> _ = path.write_bytes(b"")
        >>> file_sha256(path)[:16]
        'e3b0c44298fc1c14'
    """
    hasher = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK_BYTES):
            hasher.update(chunk)
    return hasher.hexdigest()


def _copy(source: BinaryIO, target: BinaryIO) -> tuple[str, int]:
    """Copy ``source`` to ``target``; return the SHA-256 and the number of bytes copied."""
    hasher = hashlib.sha256()
    size = 0
    while chunk := source.read(_CHUNK_BYTES):
        hasher.update(chunk)
        target.write(chunk)
        size += len(chunk)
    return hasher.hexdigest(), size


def _matches(path: Path, expected: str) -> bool:
    try:
        return path.is_file() and file_sha256(path) == expected
    except OSError:
        # An unreadable existing file is treated like a wrong one: download() will replace it.
        return False


def download(url: str, destination: Path, sha256: str, *, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``destination`` and verify its SHA-256; return ``destination``.

    If ``destination`` already exists with the right checksum nothing is fetched. The data is
    streamed into a temporary file next to ``destination`` and moved into place only after the
    checksum matched, so on any failure (:class:`DataError`) no new file is left behind.
    ``timeout`` is in seconds and applies to connecting and to each read.

    Example::

        >>> import hashlib, tempfile
        >>> from pathlib import Path
        >>> source = Path(tempfile.mkdtemp()) / "data.bin"
        >>> _ = source.write_bytes(b"ab")
        >>> target = download(source.as_uri(), source.parent / "fetched.bin",
        ...                   hashlib.sha256(b"ab").hexdigest())
        >>> target.name
        'fetched.bin'
    """
    destination = Path(destination)
    expected = sha256.lower()
    if not _SHA256_PATTERN.fullmatch(expected):
        raise ValueError(f"sha256 must be 64 hexadecimal digits, got {sha256!r}")
    if _matches(destination, expected):
        return destination

    by_hand = (
        f"put the file in place by hand: fetch {url} on a machine that is online (for example "
        f"`curl -fLo {destination.name} {url}`) and copy it to {destination}"
    )
    try:
        destination.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the folder {destination.parent} for {url} ({exc.strerror or exc}); "
            f"choose a writable location or {by_hand}"
        ) from exc

    temp_path: Path | None = None
    try:
        descriptor, temp_name = tempfile.mkstemp(dir=destination.parent, prefix=f".{destination.name}.", suffix=".part")
        temp_path = Path(temp_name)
        with os.fdopen(descriptor, "wb") as target, urllib.request.urlopen(url, timeout=timeout) as response:
            promised = response.headers.get("Content-Length")
            actual, size = _copy(response, target)
        # http.client returns a short body without complaint when the server hangs up early.
        if promised is not None and promised.isdigit() and size < int(promised):
            raise DataError(
                f"downloading {url} failed: the connection broke off after {size} of {promised} bytes; "
                f"try again, or {by_hand}"
            )
        if actual != expected:
            raise DataError(
                f"checksum mismatch for {url}: expected SHA-256 {expected}, got {actual}; the download "
                f"is damaged or the server sent a different file; nothing was saved at {destination}. "
                f"Try again, or {by_hand} and check it with `sha256sum`"
            )
        os.replace(temp_path, destination)
        temp_path = None
    except urllib.error.HTTPError as exc:
        exc.close()
        raise DataError(f"downloading {url} failed: HTTP {exc.code} {exc.reason}; {by_hand}") from exc
    except urllib.error.URLError as exc:
        raise DataError(f"downloading {url} failed: {exc.reason}; check the network or {by_hand}") from exc
    except TimeoutError as exc:
        raise DataError(f"downloading {url} failed: no answer within {timeout:g} s; {by_hand}") from exc
    except http.client.HTTPException as exc:
        raise DataError(
            f"downloading {url} failed: the connection broke off ({type(exc).__name__}); {by_hand}"
        ) from exc
    except ValueError as exc:
        # urlopen's complaint about a string that is not a URL at all.
        raise DataError(f"cannot download {url!r}: {exc}; give a full http:// or https:// URL") from exc
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise DataError(
                f"downloading {url} failed: no space left on the disk holding {destination.parent}; "
                "free some space there, or fetch the files onto another disk by hand and pass that folder "
                "with --data-dir"
            ) from exc
        raise DataError(f"downloading {url} to {destination} failed: {exc}; {by_hand}") from exc
    finally:
        if temp_path is not None:
            temp_path.unlink(missing_ok=True)
    return destination
