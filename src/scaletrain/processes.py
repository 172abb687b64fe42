"""What Linux says of a process in ``/proc/PID/stat``: its state letter, read the same way by the launcher (a
frozen worker), the data loader's watchdog (a stuck loader worker) and the fault benchmarks."""

from __future__ import annotations

from pathlib import Path

__all__ = ["is_stopped", "process_state"]


def process_state(pid: int) -> str | None:
    """The state letter of process ``pid`` (``R`` running, ``S`` sleeping, ``D`` waiting in the kernel, ``T``
    stopped, ``t`` traced, ``Z`` zombie …), or None where there is no such process (or it went while being read).

    The command name in parentheses may itself hold spaces and parentheses, so the letter is the first field after
    the last ``)``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return fields[0] if fields else None


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is frozen: stopped (``SIGSTOP``, ``SIGTSTP``) or held by a tracer."""
    return process_state(pid) in ("T", "t")
