"""A worker program's heartbeat (both engines' programs): ``progress-<role>-<index>`` in the output folder.

The training loop only records where it is (:meth:`Progress.step`, :meth:`Progress.exchange`,
:meth:`Progress.evaluate`, :meth:`Progress.done`: an assignment, no I/O); a daemon thread writes that state,
``<phase> <count>``, at most every :data:`INTERVAL` seconds and only when it changed, so the file changes
exactly while the process moves on and a process that hangs (a deadlock, a collective that never completes,
a loop that never ends) leaves it as it was, even though it is neither frozen nor ended. Nothing is written
before the first step is done (the launcher gives start-up, imports and the first step a bound of their own).
Phases: ``train`` (count: steps done), ``exchange`` (waiting for the other processes inside a step, or at a
barrier: count, the steps done before it), ``evaluate`` (count: test batches scored) and ``done`` (every
step and the results written; what is left waits for the others).

The spec's ``hang`` block (``{"role": "worker", "index": 1, "step": 5}``) is a fault-injection hook for the
tests of the launcher's watchdog: that process hangs after that step (it waits forever, neither exiting nor
frozen). Like the programs it needs only the standard library.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

INTERVAL = 0.5  # seconds between two writes at most


class Progress:
    """The heartbeat of process ``role`` ``index``; its thread starts at once."""

    def __init__(self, spec: dict, role: str, index: int) -> None:
        self.path = Path(spec["out"]) / f"progress-{role}-{index}"
        self.label = f"{role} {index}"
        self.state = ("start", 0)  # one attribute, so that the thread never sees half of a change
        self.written: tuple[str, int] | None = None
        hang = spec.get("hang") or {}
        self.hang_at = hang.get("step") if (hang.get("role"), hang.get("index")) == (role, index) else None
        threading.Thread(target=self._beat, name="progress", daemon=True).start()

    def step(self, done: int) -> None:
        """``done`` steps are done (the spec's ``hang`` hook may stop here forever)."""
        self.state = ("train", done)
        if done == self.hang_at:
            self._hang(done)

    def exchange(self) -> None:
        """Waiting for the others from here on (an all-reduce, a push and pull, a barrier)."""
        self.state = ("exchange", self.state[1] if self.state[0] in ("train", "exchange") else 0)

    def evaluate(self, batches: int) -> None:
        """``batches`` test batches are scored."""
        self.state = ("evaluate", batches)

    def done(self) -> None:
        """Every step and result is done; what follows waits for the others to end."""
        self.state = ("done", 0)

    def _beat(self) -> None:
        while True:
            time.sleep(INTERVAL)
            state = self.state
            if state != self.written and state[0] != "start":
                partial = self.path.with_name(self.path.name + ".partial")
                try:
                    partial.write_text(f"{state[0]} {state[1]}\n", encoding="utf-8")
                    os.replace(partial, self.path)
                except OSError:
                    continue
                self.written = state

    def _hang(self, done: int) -> None:
        print(f"{self.label}: hangs after step {done}, as the spec's hang block asks", file=sys.stderr, flush=True)
        while True:
            time.sleep(1.0)
