"""The foreign engines' runs, for real: TensorFlow and MXNet processes started by scaletrain's launcher in their
own environments (``scaletrain engines install``; CI installs both), measured by scaletrain's meter.

Tolerances: a synchronous run of 2 workers at batch b must hold the weights of the engine's one process at
batch 2b within ``atol 1e-5 + rtol 1e-4`` (the equivalence tests' tolerance elsewhere: the gradients are summed
in another order) after 30 steps.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from scaletrain.engines.launch import EngineFailed, run_engine
from scaletrain.processes import process_state
from tests.engines.settings import setting
from tests.helpers import make_fashion_mnist

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("engines") / "fmnist", train=640, test=64)


def weights(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "engine" / "final.npz") as saved:
        return dict(saved)


def test_two_synchronous_workers_hold_the_weights_of_one_process_at_the_doubled_batch(
    engine: str, tiny: Path, tmp_path: Path
) -> None:
    one = run_engine(setting(engine, "local", 1, 32, tiny), tmp_path / "one")
    two = run_engine(setting(engine, "sync", 2, 16, tiny), tmp_path / "two")
    assert (one["steps"], two["steps"]) == (30, 30)
    assert (two["framework"], two["mode"], two["workers"]) == (engine, "sync", 2)
    assert two["batches_per_second"] > 0 and len(two["per_worker"]) == 2
    first, second = weights(tmp_path / "one"), weights(tmp_path / "two")
    assert sorted(first) == sorted(second) == sorted(np.load(tmp_path / "one" / "engine" / "init.npz"))
    for name in first:
        np.testing.assert_allclose(second[name], first[name], rtol=1e-4, atol=1e-5, err_msg=name)
    moved = max(np.abs(first[n] - np.load(tmp_path / "one" / "engine" / "init.npz")[n]).max() for n in first)
    assert moved > 1e-3  # it trained: the weights left their start


def test_an_asynchronous_parameter_server_run_trains_every_batch(engine: str, tiny: Path, tmp_path: Path) -> None:
    summary = run_engine(setting(engine, "async", 2, 16, tiny, steps=None, epochs=1), tmp_path / "run")
    assert summary["worker_steps"] == [20, 20]  # 640 images / 16 = 40 batches an epoch, a chunk of 20 each
    assert summary["steps"] == sum(summary["worker_steps"])
    assert 0.0 <= summary["test_accuracy"] <= 1.0 and summary["batches_per_second"] > 0


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_lost_worker_is_named_in_one_line_and_nothing_is_left_running(
    engine: str, how: str, tiny: Path, tmp_path: Path
) -> None:
    run = setting(engine, "sync", 2, 16, tiny, steps=100_000)  # it would run for many minutes
    out = tmp_path / "run"
    victim: dict[str, int] = {}

    def strike() -> None:  # once the worker is training, as a user's kill or a frozen machine would
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not victim:
            for pid in _ours(out):
                command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                if b"--role" in command and command[command.index(b"--role") + 1 :][:3:2] == [b"worker", b"1"]:
                    time.sleep(4)  # past the start-up, into the steps
                    os.kill(pid, getattr(signal, how))
                    victim["pid"] = pid
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=strike, daemon=True)
    thread.start()
    began = time.monotonic()
    with pytest.raises(EngineFailed) as caught:
        run_engine(run, out, timeout=6)
    thread.join(5)
    message = str(caught.value)
    assert "\n" not in message
    what = "was killed by signal 9" if how == "SIGKILL" else "stopped answering"
    assert message.startswith(f"{engine} worker 1 (pid {victim['pid']}) {what}"), message
    assert "stopped the other processes" in message
    assert time.monotonic() - began < 120
    assert _ours(out) == []  # no orphans: every process of the run has ended


def _ours(out: Path) -> list[int]:
    """The live processes whose command line names this run's spec."""
    spec = str(out / "engine" / "spec.json").encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if spec in (entry / "cmdline").read_bytes() and process_state(int(entry.name)) not in (None, "Z"):
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids
