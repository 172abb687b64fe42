"""Leaving a process that used c10d: its background threads must not be torn down by the interpreter."""

from __future__ import annotations

import os
import sys

__all__ = ["exit_now"]


def exit_now(code: int) -> None:
    """Leave without running C++ destructors: c10d/gloo background threads can abort a process
    (``terminate called without an active exception``) when the interpreter tears them down after
    the work is done. Every output file is closed by then; flush the streams and go."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
