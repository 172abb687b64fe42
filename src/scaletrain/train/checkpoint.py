"""Atomic checkpoints: written to a temporary file, flushed to disk, then renamed into place.

A run killed at any moment leaves either the previous checkpoint or the new one, never half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from scaletrain.errors import ConfigError, ScaletrainError

__all__ = ["CHECKPOINT_NAME", "atomic_save", "load_checkpoint", "refuse_overwrite"]

CHECKPOINT_NAME = "checkpoint.pt"


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically.

    A full disk or any other write error leaves the old file untouched and raises an error that
    says so.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.pt"
    >>> atomic_save({"a": 1}, target); torch.load(target)["a"]
    1
    """
    path = Path(path)
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except (OSError, RuntimeError) as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise ScaletrainError(f"could not write {path}: {exc}; {kept}. Free disk space and use --resume") from exc


def refuse_overwrite(out: Path, *, resume: bool) -> None:
    """A run folder that holds a checkpoint is only ever continued (``--resume``), never overwritten."""
    if not resume and (Path(out) / CHECKPOINT_NAME).exists():
        raise ConfigError(
            f"{out} already holds a run (checkpoint.pt); pass --resume to continue it, or choose another --out"
        )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`atomic_save`, with a clear error if it is unusable."""
    path = Path(path)
    if not path.exists():
        raise ScaletrainError(
            f"--resume given but there is no checkpoint at {path}; run without --resume to start afresh"
        )
    try:
        return torch.load(path, weights_only=True)
    except Exception as exc:  # torch raises several types for a damaged file
        raise ScaletrainError(f"checkpoint {path} cannot be read ({exc}); delete it to start afresh") from exc
