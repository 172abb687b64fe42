"""scaletrain.processes on real processes: a sleeping one, the same one stopped and continued, one whose name holds
parentheses and a state-like letter, and one that is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from scaletrain.processes import is_stopped, process_state


def wait_for(pid: int, wanted: str, seconds: float = 10.0) -> str | None:
    """The state once it is ``wanted``, or the last one seen after ``seconds``."""
    deadline = time.monotonic() + seconds
    state = process_state(pid)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.02)
        state = process_state(pid)
    return state


def test_a_process_stopped_and_continued_and_gone() -> None:
    process = subprocess.Popen(["sleep", "30"])
    try:
        assert wait_for(process.pid, "S") == "S" and not is_stopped(process.pid)
        os.kill(process.pid, signal.SIGSTOP)
        assert wait_for(process.pid, "T") == "T" and is_stopped(process.pid)
        os.kill(process.pid, signal.SIGCONT)
        assert wait_for(process.pid, "S") == "S" and not is_stopped(process.pid)
    finally:
        process.kill()
        process.wait(timeout=10)
    assert process_state(process.pid) is None and not is_stopped(process.pid)


def test_a_name_with_parentheses_and_spaces_is_not_read_as_the_state(tmp_path: Path) -> None:
    odd = tmp_path / "a) T (b"  # the kernel names the process after the file it ran: "(a) T (b) S …"
    odd.symlink_to("/bin/sleep")
    process = subprocess.Popen([str(odd), "30"])
    try:
        assert wait_for(process.pid, "S") == "S"
        assert Path(f"/proc/{process.pid}/stat").read_text().split()[1:4] == ["(a)", "T", "(b)"]
        assert not is_stopped(process.pid)
    finally:
        process.kill()
        process.wait(timeout=10)
