"""The foreign runs' watchdog: a process that trains and hangs (neither frozen nor ended) is named in one line.

The launcher's rules are tested on stand-in processes (a few lines of Python writing a heartbeat as the programs
do), so they run without any engine; then each installed engine's real run, one worker of two made to hang by the
spec's ``hang`` block (the contract's fault-injection hook) after its 5th step.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from scaletrain.engines import launch
from scaletrain.engines.base import Role
from scaletrain.engines.launch import EngineFailed, _Process, _watch, run_engine
from scaletrain.engines.prepare import SPEC_NAME, prepare
from scaletrain.engines.tensorflow import TensorFlowEngine
from tests.engines.settings import setting
from tests.engines.test_runs import _ours
from tests.helpers import make_fashion_mnist

pytestmark = pytest.mark.multiprocess

TIMEOUT = 8  # seconds without progress before the run is stopped
MARGIN = 6  # seconds the launcher may take past it: the heartbeat's interval, the poll, stopping the others

#: a stand-in for a program: ``BEATS`` heartbeats of ``PHASE`` a tenth of a second apart, then it waits forever
STAND_IN = """
import os, sys, time
path, phase, beats = sys.argv[1], sys.argv[2], int(sys.argv[3])
for n in range(1, 10**9):
    if n <= beats:
        with open(path + ".partial", "w") as file:
            file.write(f"{phase if n == beats else 'train'} {n}")
        os.replace(path + ".partial", path)
    time.sleep(0.1)
"""


def stand_ins(folder: Path, beats: list[tuple[str, int]]) -> list[_Process]:
    """One stand-in worker per ``(phase, beats)``; each hangs after its last heartbeat (``10**9``: never)."""
    processes = []
    for index, (phase, count) in enumerate(beats):
        log = folder / f"worker-{index}.log"
        command = [sys.executable, "-c", STAND_IN, str(folder / f"progress-worker-{index}"), phase, str(count)]
        log_file = log.open("wb")
        popen = subprocess.Popen(command, stdout=log_file, stderr=log_file)
        processes.append(_Process(Role("worker", index, trains=True), popen, log, log_file))
    return processes


def watched(folder: Path, beats: list[tuple[str, int]], timeout: float = 2.0) -> tuple[str, list[_Process], float]:
    """The one line the watchdog fails with over the stand-ins, the stand-ins and the seconds it took."""
    processes = stand_ins(folder, beats)
    began = time.monotonic()
    try:
        with pytest.raises(EngineFailed) as caught:
            _watch(TensorFlowEngine(), processes, timeout, progress=folder, start_timeout=3 * timeout)
    finally:
        for process in processes:
            process.log_file.close()
    return str(caught.value), processes, time.monotonic() - began


def test_a_trainer_whose_heartbeat_stops_is_named_while_the_others_move_on(tmp_path: Path) -> None:
    message, processes, took = watched(tmp_path, [("train", 10**9), ("train", 5)])
    named = f"tensorflow worker 1 (pid {processes[1].popen.pid}) made no progress for 2 s after step 5"
    assert message.startswith(named), message
    assert "it hangs" in message and "\n" not in message
    assert 2.0 < took < 2.0 + 2.0
    assert all(process.popen.poll() is not None for process in processes)  # the one moving on was stopped too


def test_a_peer_stuck_in_its_own_work_is_named_before_those_waiting_for_it(tmp_path: Path) -> None:
    # worker 0 stops first, waiting in the exchange; worker 1 stops a moment later, in its own work
    message, processes, _ = watched(tmp_path, [("exchange", 5), ("train", 10)])
    assert message.startswith(f"tensorflow worker 1 (pid {processes[1].popen.pid}) made no progress"), message


def test_when_every_trainer_waits_for_the_others_the_line_says_so(tmp_path: Path) -> None:
    message, _, _ = watched(tmp_path, [("exchange", 5), ("exchange", 5)])
    assert "waiting for the others in the exchange after step 5" in message and "it or a peer hangs" in message


def test_a_trainer_without_a_first_step_gets_the_start_bound(tmp_path: Path) -> None:
    message, _, took = watched(tmp_path, [("train", 10**9), ("train", 0)])
    assert message.startswith("tensorflow worker 1") and "did not finish its first step within 6 s" in message
    assert 5.5 < took < 6.0 + 2.0


def test_a_frozen_trainer_is_still_reported_as_frozen(tmp_path: Path) -> None:
    processes = stand_ins(tmp_path, [("train", 10**9), ("train", 10**9)])
    time.sleep(1.0)
    processes[1].popen.send_signal(19)  # SIGSTOP: its heartbeat stops too, but it is frozen, not hanging
    try:
        with pytest.raises(EngineFailed) as caught:
            _watch(TensorFlowEngine(), processes, 2.0, progress=tmp_path, start_timeout=6.0)
    finally:
        for process in processes:
            process.log_file.close()
    assert str(caught.value).startswith(f"tensorflow worker 1 (pid {processes[1].popen.pid}) stopped answering")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("engines") / "fmnist", train=640, test=64)


def test_a_worker_that_hangs_is_named_in_one_line_and_nothing_is_left_running(
    engine: str, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def hanging(run: object, folder: Path) -> dict:  # the spec's fault-injection hook: worker 1 hangs after step 5
        spec = prepare(run, folder)
        spec["hang"] = {"role": "worker", "index": 1, "step": 5}
        (folder / SPEC_NAME).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
        return spec

    monkeypatch.setattr(launch, "prepare", hanging)
    out = tmp_path / "run"
    seen: dict[str, float | int] = {}

    def look() -> None:  # when worker 1's heartbeat says it finished step 5, and its pid
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and "hung" not in seen:
            with contextlib.suppress(OSError, ValueError):  # a process may end, a file be replaced, meanwhile
                for pid in _ours(out):
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if command[command.index(b"--role") + 1 :][:3:2] == [b"worker", b"1"]:
                        seen["pid"] = pid
                if (out / "engine" / "progress-worker-1").read_text().split() == ["train", "5"]:
                    seen["hung"] = time.monotonic()
            time.sleep(0.1)

    thread = threading.Thread(target=look, daemon=True)
    thread.start()
    with pytest.raises(EngineFailed) as caught:
        run_engine(setting(engine, "sync", 2, 16, tiny, steps=100_000), out, timeout=TIMEOUT)
    ended = time.monotonic()
    thread.join(5)
    message = str(caught.value)
    assert "\n" not in message and caught.value.exit_code != 0
    pattern = rf"{engine} worker 1 \(pid {seen['pid']}\) made no progress for \d+ s after step 5 .*: it hangs"
    assert re.match(pattern, message), message
    assert "hangs after step 5, as the spec's hang block asks" in message  # its last words
    assert "stopped the other processes" in message
    assert ended - seen["hung"] < TIMEOUT + MARGIN
    assert _ours(out) == []  # every process of the run has ended
