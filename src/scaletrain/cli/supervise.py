"""A one-process run that dies of a signal says so in one line, as a worker of a distributed run does.

A distributed run's launcher watches its worker processes and names the one killed by a signal. A
one-process run has nobody watching: a segmentation fault or an abort in native code (a library's
kernel, the C allocator) ends it with the C library's line at most and exit code 134 or 139. So the
``scaletrain`` command runs a one-process ``train`` as its own child and waits for it: the child's
exit code passes through unchanged, a death by signal becomes one line naming the signal and where
Python's ``faulthandler`` wrote the child's last traceback. The child runs in a process group of its own
and dies with the parent; the parent passes SIGINT, SIGTERM and SIGHUP on to it once, so Ctrl-C and a
cluster's stop reach the run as before.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from types import FrameType

from scaletrain.parallel.preloaded import die_with_parent

__all__ = ["ENV_FAULT_LOG", "ENV_SUPERVISED", "log_faults", "run_supervised", "supervised"]

#: Set in the supervised child: it runs the command itself.
ENV_SUPERVISED = "SCALETRAIN_SUPERVISED"
#: The file the supervised child's ``faulthandler`` writes a fatal signal's traceback to.
ENV_FAULT_LOG = "SCALETRAIN_FAULT_LOG"

_PASSED_ON = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def supervised() -> bool:
    """Whether this process is the child of a supervising ``scaletrain`` command."""
    return bool(os.environ.get(ENV_SUPERVISED))


def log_faults() -> None:
    """In a supervised child: a fatal signal's traceback goes to the supervisor's fault log (not the terminal)."""
    path = os.environ.get(ENV_FAULT_LOG)
    if not path:
        return
    try:
        log = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open until the process ends, as faulthandler needs
    except OSError:
        return
    faulthandler.enable(file=log, all_threads=True)


def run_supervised(argv: Sequence[str], what: str) -> int:
    """Run ``scaletrain ARGV`` as a child and wait for it; its exit code, or one line and 128 + N for signal N."""
    handle, name = tempfile.mkstemp(prefix="scaletrain-fault-", suffix=".log")
    os.close(handle)
    log = Path(name)
    environment = {**os.environ, ENV_SUPERVISED: "1", ENV_FAULT_LOG: str(log)}
    # its own process group: a terminal's Ctrl-C reaches this process alone, which passes it on once
    child = subprocess.Popen(
        [sys.executable, "-m", "scaletrain", *argv], env=environment, process_group=0, preexec_fn=die_with_parent
    )

    def pass_on(number: int, frame: FrameType | None) -> None:
        if child.poll() is None:
            child.send_signal(number)

    before = {number: signal.signal(number, pass_on) for number in _PASSED_ON}
    try:
        code = child.wait()  # as long as the run trains; the child has its own time-outs for every wait
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    if code >= 0:
        log.unlink(missing_ok=True)
        return code
    number = -code
    if number in _PASSED_ON:  # stopped on request, before it could say so itself
        log.unlink(missing_ok=True)
        return 128 + number
    try:
        traced = log.stat().st_size > 0
    except OSError:
        traced = False
    if not traced:
        log.unlink(missing_ok=True)
    where = f"; its last Python traceback is in {log}" if traced else ""
    print(
        f"scaletrain: error: {what} (pid {child.pid}) was killed by signal {number} ({_signal_name(number)}){where}; "
        "the run's folder keeps its last checkpoint, if one was written (--resume continues from it)",
        file=sys.stderr,
    )
    return 128 + number


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
