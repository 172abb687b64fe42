"""A network that changes shape mid-run, under every strategy, with real processes on loopback.

The ``narrow`` technique halves LeNet's hidden layer (``classifier.1``, keeping its first 250 units
and the matching inputs of ``classifier.3``) at the end of epoch 1. Synchronous strategies must end
weight for weight equal to the same reconfiguration in one process (split = the same batch, join =
N× the batch); asynchronous ones must finish every batch on the narrowed network; a run stopped
after the reconfiguration and resumed must end like an uninterrupted one; and processes that hold
different networks must stop with both layouts named instead of hanging.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, assert_same_weights, make_fashion_mnist
from tests.helpers import model_weights as weights

import scaletrain

pytestmark = pytest.mark.multiprocess

NARROW = {"technique": "narrow", "technique_options": {"layer": "classifier.1", "fraction": "0.5", "epoch": "1"}}
COMMON = {"epochs": 2, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 5, **NARROW}
TRAIN = 192  # samples: 16 steps per epoch at batch 12


def train_on(data: Path, out: Path, strategy: str, server: str, sync: str, *, workers: int = 2, **extra) -> dict:
    """A run at batch 12 with the narrowing (or ``extra``'s technique) under a strategy."""
    layout = {"workers": workers, "strategy": strategy, "server": server or "central", "sync": sync}
    return scaletrain.train("lenet", data_dir=data, out=out, batch_size=12, **layout, **{**COMMON, **extra})


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("reconfigure") / "fmnist", train=TRAIN, test=32)


class Runs:
    """Runs of :func:`train_on` trained once per module: the uninterrupted run a resume test compares
    with is the very run a matching test checked against one process (each multi-process run costs
    seconds of process start-up on 2 cores)."""

    def __init__(self, data: Path, factory: pytest.TempPathFactory) -> None:
        self.data, self.factory = data, factory
        self.done: dict[tuple, tuple[dict, Path]] = {}

    def get(self, strategy: str, server: str, sync: str, *, workers: int = 2, **extra) -> tuple[dict, Path]:
        """The summary and the folder of ``train_on(...)`` with these settings, trained on first use."""
        key = (strategy, server, sync, workers, repr(sorted(extra.items())))
        if key not in self.done:
            out = self.factory.mktemp("shared-run") / "run"
            self.done[key] = (train_on(self.data, out, strategy, server, sync, workers=workers, **extra), out)
        return self.done[key]


@pytest.fixture(scope="module")
def runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(data, tmp_path_factory)


@pytest.fixture(scope="module")
def local_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    """The reconfiguration in one process, at batch 12 (= split over N) and 24 (= join of 2)."""
    runs = {}
    for batch in (12, 24):
        out = tmp_path_factory.mktemp(f"narrow-local-{batch}") / "run"
        summary = scaletrain.train("lenet", data_dir=data, out=out, batch_size=batch, **COMMON)
        assert summary["strategy"] == "local"
        runs[batch] = weights(out)
        assert runs[batch]["classifier.1.weight"].shape == (250, 800)
        assert runs[batch]["classifier.3.weight"].shape == (10, 250)
    return runs


SYNCHRONOUS = [
    ("allreduce", "", "join", 2),
    ("allreduce", "", "split", 2),
    ("ps", "central", "join", 2),
    ("ps", "central", "split", 2),
    ("ps", "sharded", "join", 2),
    ("ps", "sharded", "split", 2),
    ("ps", "sharded", "split", 3),  # ownership is planned again over three owners
]


@pytest.mark.parametrize(("strategy", "server", "sync", "workers"), SYNCHRONOUS)
def test_synchronous_reconfiguration_matches_one_process(
    strategy: str, server: str, sync: str, workers: int, runs: Runs, local_runs: dict
) -> None:
    summary, out = runs.get(strategy, server, sync, workers=workers)
    per_epoch = TRAIN // (12 * (workers if sync == "join" else 1))
    assert summary["steps"] == 2 * per_epoch
    assert summary["parameters"] == 20 * 25 + 20 + 50 * 20 * 25 + 50 + 250 * 800 + 250 + 10 * 250 + 10
    if workers == 2:
        assert_same_weights(weights(out), local_runs[12 if sync == "split" else 24])


@pytest.mark.parametrize("server", ["central", "sharded"])
def test_asynchronous_workers_finish_every_batch_on_the_new_network(server: str, data: Path, tmp_path: Path) -> None:
    summary = train_on(data, tmp_path / "run", "ps", server, "async")
    assert summary["lost_workers"] == []
    # --async-batches split: updates of 12 // 2 = 6 samples
    assert summary["server_updates"] == summary["steps"] == 2 * (TRAIN // 6)
    assert sum(worker["steps"] for worker in summary["per_worker"]) == 2 * (TRAIN // 6)
    assert weights(tmp_path / "run")["classifier.1.weight"].shape == (250, 800)


MISMATCH_SCRIPT = textwrap.dedent(
    """
    import os, sys, torch
    from torch import nn
    import scaletrain
    from scaletrain import ClassificationWorkload

    torch.manual_seed(0)
    x, y = torch.randn(96, 8), torch.randint(0, 2, (96,))
    hidden = 5 if os.environ["RANK"] == sys.argv[2] else 4  # one process builds another network
    workload = ClassificationWorkload.from_tensors(
        "mine", lambda: nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 2)), train=(x, y), test=(x, y)
    )
    try:
        scaletrain.train(workload, out=sys.argv[1], workers=2, strategy=sys.argv[3], server="central",
                         sync=sys.argv[4], epochs=1, batch_size=8, progress="off", tensorboard=False, threads=1,
                         timeout=20)
    except scaletrain.ScaletrainError as exc:  # as the CLI does: one line, and no c10d teardown at exit
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        scaletrain.exit_now(1)
    """
)


@pytest.mark.parametrize(
    ("strategy", "sync", "odd_rank"), [("ps", "async", 2), ("ps", "join", 1), ("allreduce", "join", 1)]
)
def test_processes_with_different_networks_stop_naming_both_layouts(
    strategy: str, sync: str, odd_rank: int, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    world = 3 if strategy == "ps" else 2
    script = tmp_path / "mismatch.py"
    script.write_text(MISMATCH_SCRIPT)
    processes = []
    for rank in range(world):
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO / "src"),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
        command = [sys.executable, str(script), str(tmp_path / "run"), str(odd_rank), strategy, sync]
        processes.append(subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = []
    for process in processes:
        _, stderr = process.communicate(timeout=120)  # the run's timeout is 20 s: nobody may hang
        outputs.append((process.returncode, stderr))
    assert all(code != 0 for code, _ in outputs), outputs
    # the process with the other network, and the server (or every all-reduce peer), name both layouts
    for rank in {odd_rank, 0}:
        last = outputs[rank][1].strip().splitlines()[-1]
        assert "LayoutMismatch" in last and last.count("elements)") == 2, outputs[rank][1]


def test_a_run_killed_after_the_reconfiguration_resumes_into_the_same_weights(data: Path, tmp_path: Path) -> None:
    """SIGKILL of the whole process group (launcher and workers) once a checkpoint of the narrowed network
    exists; ``--resume`` rebuilds that network and ends where an uninterrupted run ends."""
    # 16 epochs: the narrowed checkpoint appears in epoch 2, and the ~14 epochs left (~3 s on 2 idle cores,
    # a checkpoint every step) keep the run alive until it is killed; 40 made the resumed and the straight
    # run train 24 epochs more each, which checked nothing more.
    args = [
        "train", "lenet", "--data-dir", str(data), "--batch-size", "12", "--epochs", "16", "--workers", "2",
        "--momentum", "0.9", "--seed", "5", "--threads", "1", "--progress", "off", "--no-tensorboard",
        "--checkpoint-every", "1", "--technique", "narrow", "-T", "layer=classifier.1", "-T", "epoch=1",
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    killed = tmp_path / "killed"
    run = subprocess.Popen(
        [sys.executable, "-m", "scaletrain", *args, "--out", str(killed)],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 300
        while not _narrowed_checkpoint(killed / "checkpoint.pt"):
            assert run.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < end, "no checkpoint of the narrowed network within 300 s"
            time.sleep(0.05)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    resumed = subprocess.run(
        [sys.executable, "-m", "scaletrain", *args, "--out", str(killed), "--resume"],
        env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    straight = subprocess.run(
        [sys.executable, "-m", "scaletrain", *args, "--out", str(tmp_path / "straight")],
        env=environment, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert straight.returncode == 0, straight.stderr
    assert_same_weights(weights(tmp_path / "straight"), weights(killed))


def _narrowed_checkpoint(path: Path) -> bool:
    """Whether ``path`` holds a checkpoint written after the reconfiguration (read while the run writes it)."""
    try:
        checkpoint = torch.load(path, weights_only=True)
    except (OSError, RuntimeError, EOFError):
        return False
    return bool(checkpoint.get("architecture"))


REBATCH = {"epochs": 3, "technique": "rebatch", "technique_options": {"batch_size": "24", "epoch": "1"}}


@pytest.fixture(scope="module")
def rebatched_local_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, torch.Tensor]]:
    """One process doubling its batch after epoch 1 (rate doubled too): 12 → 24 (= split), 24 → 48 (= join of 2)."""
    runs = {}
    for batch in (12, 24):
        out = tmp_path_factory.mktemp(f"rebatch-local-{batch}") / "run"
        options = {"batch_size": str(2 * batch), "epoch": "1"}
        settings = {**COMMON, **REBATCH, "technique_options": options}
        summary = scaletrain.train("lenet", data_dir=data, out=out, batch_size=batch, **settings)
        steps = TRAIN // batch
        assert summary["steps"] == steps + 2 * (steps // 2)  # epoch 1 at the old batch, 2 and 3 at the new
        assert [(s["batch_size"], s["lr_scale"]) for s in summary["batch_schedule"]] == [(batch, 1.0), (2 * batch, 2.0)]
        runs[batch] = weights(out)
    return runs


@pytest.mark.parametrize(
    ("strategy", "server", "sync"),
    [("allreduce", "", "join"), ("allreduce", "", "split"), ("ps", "central", "join"), ("ps", "sharded", "split")],
)
def test_a_batch_change_matches_one_process(
    strategy: str, server: str, sync: str, runs: Runs, rebatched_local_runs: dict
) -> None:
    summary, out = runs.get(strategy, server, sync, **REBATCH)
    per_epoch = TRAIN // (12 * (2 if sync == "join" else 1))
    assert summary["steps"] == per_epoch + 2 * (per_epoch // 2)
    assert_same_weights(weights(out), rebatched_local_runs[12 if sync == "split" else 24])


def test_asynchronous_workers_follow_a_batch_change(data: Path, tmp_path: Path) -> None:
    summary = train_on(data, tmp_path / "run", "ps", "central", "async", **REBATCH)
    assert summary["lost_workers"] == []
    # --async-batches split: updates of 12 // 2 in the first epoch, of 24 // 2 after the change to 24
    assert summary["server_updates"] == summary["steps"] == 32 + 16 + 16
    assert summary["update_batch_size"] == 12


RESUMED = [
    ("narrow", "local", "", "join"),
    ("narrow", "allreduce", "", "join"),
    ("narrow", "ps", "central", "split"),
    ("narrow", "ps", "sharded", "join"),
    ("rebatch", "allreduce", "", "split"),
    ("rebatch", "ps", "central", "split"),
]


@pytest.mark.parametrize(("technique", "strategy", "server", "sync"), RESUMED)
def test_a_run_stopped_after_a_reconfiguration_resumes_into_the_same_weights(
    technique: str, strategy: str, server: str, sync: str, data: Path, runs: Runs, tmp_path: Path
) -> None:
    extra = REBATCH if technique == "rebatch" else {}
    workers = 1 if strategy == "local" else 2
    straight, straight_out = runs.get(strategy, server, sync, workers=workers, **extra)  # often a run checked above
    first_epoch = TRAIN // (12 * (workers if sync == "join" else 1))
    stop = first_epoch + 3  # three steps into the epoch after the reconfiguration
    stopped = train_on(data, tmp_path / "stopped", strategy, server, sync, workers=workers, steps=stop, **extra)
    assert stopped["steps"] == stop
    checkpoint = torch.load(tmp_path / "stopped" / "checkpoint.pt", weights_only=True)
    if technique == "narrow":
        assert checkpoint["architecture"] == {"classifier.1": {"out": 250}, "classifier.3": {"in": 250}}
    else:
        assert [segment["batch_size"] for segment in checkpoint["schedule"]] == [12, 24]
    resumed = train_on(data, tmp_path / "stopped", strategy, server, sync, workers=workers, resume=True, **extra)
    assert resumed["resumed_from_step"] == stop and resumed["steps"] == straight["steps"]
    assert_same_weights(weights(straight_out), weights(tmp_path / "stopped"))
