"""Reading a dataset file with errors that say what to do."""

from __future__ import annotations

from pathlib import Path

from scaletrain.errors import DataError

__all__ = ["read_dataset_bytes"]


def read_dataset_bytes(path: Path, *, when_missing: str) -> bytes:
    """The file's bytes; a missing file is a :class:`DataError` ending in ``when_missing`` (how to get it).

    >>> read_dataset_bytes(Path("/nonexistent/x"), when_missing="get it somewhere")
    Traceback (most recent call last):
    scaletrain.errors.DataError: /nonexistent/x: file not found; get it somewhere
    """
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found; {when_missing}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc}); check its permissions") from exc
