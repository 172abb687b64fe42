"""What a process says when the run breaks under it: one line for the terminal, the traceback in a file.

A process that loses its peers gets a low-level error from c10d/gloo (``Connection closed by
peer``, ``Timed out waiting 60000ms for recv operation``) with a long C++ traceback. Users need one
true line: which process, what happened in words, and where the details are.
"""

from __future__ import annotations

import traceback
from pathlib import Path

from scaletrain.errors import ScaletrainError

__all__ = ["DROPPED_EXIT_CODE", "Dropped", "ProcessFailed", "connection_closed", "describe", "write_traceback"]

LOGS_DIR = "logs"


class ProcessFailed(ScaletrainError):
    """This process stopped because of an unexpected error or a lost peer; the details are in its logs."""

    exit_code = 1


#: The exit code of a worker an elastic run's survivors dropped (it answered too late): the launcher counts it as lost.
DROPPED_EXIT_CODE = 3


class Dropped(ScaletrainError):
    """The survivors went on without this worker: it stopped answering for longer than they waited."""

    exit_code = DROPPED_EXIT_CODE


def describe(exc: BaseException, timeout: float, peer: str = "another process", *, compiled: bool = False) -> str:
    """``exc`` in words a user can act on; ``peer`` names the other end when it is known. In a ``compiled`` run
    (``--compile``) a worker's first step, and its first after a reconfiguration, include compiling, which the
    others wait for as for any step: a wait that timed out says so.

    >>> describe(RuntimeError("[gloo] Timed out waiting 60000ms for recv operation to complete"), 60)
    'no answer from another process within 60 s: it stopped answering (frozen, or its machine is unreachable)'
    >>> describe(RuntimeError("Connection closed by peer [127.0.0.1]:1234"), 60)
    'lost the connection to another process: it died or its machine went away'
    >>> describe(RuntimeError("Timed out"), 20, compiled=True).partition("; ")[2]
    'or it was still compiling (--compile): give --timeout more than its compile time'
    """
    text = str(exc)
    lowered = text.lower()
    if "timed out" in lowered or "timeout" in lowered:
        compiling = "; or it was still compiling (--compile): give --timeout more than its compile time"
        return (
            f"no answer from {peer} within {timeout:.0f} s: it stopped answering "
            "(frozen, or its machine is unreachable)" + (compiling if compiled else "")
        )
    if connection_closed(exc):
        return f"lost the connection to {peer}: it died or its machine went away"
    first = text.strip().splitlines()[0] if text.strip() else ""
    return f"unexpected {type(exc).__name__}" + (f": {first}" if first else "")


def connection_closed(exc: BaseException) -> bool:
    """Whether a gloo error says the other end's connection closed (its process died, or its machine went away).

    >>> connection_closed(RuntimeError("Connection reset by peer")), connection_closed(RuntimeError("Timed out"))
    (True, False)
    """
    lowered = str(exc).lower()
    timed_out = "timed out" in lowered or "timeout" in lowered
    return not timed_out and any(
        words in lowered for words in ("connection closed", "connection reset", "broken pipe", "peer")
    )


def write_traceback(out: Path | None, rank: int) -> Path | None:
    """Append the current exception's traceback to ``OUT/logs/rank-K.traceback``; its path, or None."""
    if out is None:
        return None
    path = Path(out) / LOGS_DIR / f"rank-{rank}.traceback"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as file:
            traceback.print_exc(file=file)
    except OSError:
        return None
    return path
