"""A workload made from torch datasets (Fashion-MNIST read image by image from the IDX file,
tests/parallel/lazy_fashion.py), read through a ``DataLoader`` with two worker processes in every training
process, on 2 workers under every strategy (issue 25 item 4):

- every synchronous strategy ends weight for weight where one process ends (split: the same batch; join:
  twice the batch), so each worker got exactly its share of each global batch;
- a split run stopped inside the epoch and resumed without loader workers ends where the uninterrupted run
  ends: the order depends on the seed and the epoch only;
- ``summary.json``'s step split has the data part, measured in each worker, and compute is what is left;
- each training process read through loader workers of its own (the pids the dataset leaves behind);
- the local launcher's processes train it as a registered workload (``SCALETRAIN_PLUGINS``), and Ctrl-C
  stops them and every loader worker.

Each job's processes train all their legs one after the other (tests/jobs/datasets_job.py), so that
torch is imported once per process, not once per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import torch
from tests import helpers
from tests.helpers import REPO, assert_same_weights, free_ports, make_fashion_mnist
from tests.helpers import model_weights as weights
from tests.jobs import datasets_job
from tests.parallel.lazy_fashion import BATCH, ENV_READERS, LOADER_WORKERS, PLUGIN_MODULE, workload

import scaletrain
from scaletrain.data.sampler import epoch_permutation
from scaletrain.parallel.strategies import all_specs

pytestmark = pytest.mark.multiprocess

SPECS = [spec for spec in all_specs(predicted_only=True) if spec != "local"]
SYNCHRONOUS = [spec for spec in SPECS if not spec.endswith("-async")]
RESUMED = "allreduce-split"
TRAIN, TEST = 96, 32  # 8 split steps of a batch of 12, 4 join steps of 2 × 12


def lazy_data(folder: Path) -> Path:
    """Tiny Fashion-MNIST files, the image files uncompressed (read by offset), the labels gzipped."""
    data = make_fashion_mnist(folder, train=TRAIN, test=TEST)
    for prefix in ("train", "t10k"):
        packed = data / f"{prefix}-images-idx3-ubyte.gz"
        subprocess.run(["gunzip", str(packed)], check=True)
    return data


def run_job(data: Path, out: Path, legs: list[str]) -> None:
    """The job's 3 processes with the torchrun variables, each training ``legs`` in turn."""
    ports = free_ports(len(legs))
    variables = [{"RANK": str(rank), "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"} for rank in range(3)]
    args = [str(data), str(out), ",".join(map(str, ports)), ",".join(legs)]
    helpers.run_job(datasets_job.__name__, args, variables, out=out / "job", unset=(ENV_READERS,))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The job's run folders, and the data they read."""
    root = tmp_path_factory.mktemp("loader-workers")
    data = lazy_data(root / "data")
    # the central server's legs first: they need the third process, which then leaves
    legs = sorted(SPECS, key=lambda spec: not spec.startswith("ps-central"))
    run_job(data, root, [*legs, f"{RESUMED}:steps", f"{RESUMED}:resumed"])
    return root, data


@pytest.fixture(scope="module")
def one_process(runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict]:
    """One process's weights over global batches of 12 (split's) and 24 (join's), read with loader workers too."""
    _, data = runs
    references = {}
    for batch in (BATCH, 2 * BATCH):
        out = tmp_path_factory.mktemp(f"one-process-{batch}") / "run"
        scaletrain.train(workload(data), out=out, batch_size=batch, **datasets_job.SETTINGS)
        references[batch] = weights(out)
    return references


def summary(root: Path, folder: str) -> dict:
    return json.loads((root / folder / "summary.json").read_text())


@pytest.mark.parametrize("spec", SPECS)
def test_every_strategy_trains_with_two_loader_workers_and_shows_the_data_part(spec: str, runs) -> None:
    root, _ = runs
    run = summary(root, spec)
    assert (run["workers"], run["loader_workers"]) == (2, LOADER_WORKERS)
    # split and async (--async-batches split: updates of BATCH // 2) train every sample once an epoch
    steps = {"split": TRAIN // BATCH, "async": TRAIN // (BATCH // 2)}.get(spec.rsplit("-", 1)[-1], TRAIN // (2 * BATCH))
    assert run["steps"] == steps
    # the step split: each worker's measured wait for its batches, and compute is the step less all the rest
    measured = [worker for worker in run["per_worker"] if worker["measured_steps"]]
    assert len(measured) == 2 and all(worker["data_seconds"] > 0 for worker in measured)
    assert run["data_seconds_per_step"] > 0 and run["compute_seconds_per_step"] > 0
    parts = ("compute", "communication", "wait", "data")
    split = sum(run[f"{part}_seconds_per_step"] for part in parts)
    assert split == pytest.approx(sum(w["measured_seconds"] / w["measured_steps"] for w in measured) / 2, rel=1e-9)
    # each worker's loader workers read exactly its share of the epoch's global batches, and nothing else
    records = [json.loads(path.read_text()) for path in (root / spec / "processes").glob("rank-*.json")]
    workers = {record["pid"] for record in records if record["role"] == "worker"}
    read, loaders = read_by(root / spec / "readers", workers)
    assert {frozenset(indices) for indices in read.values()} == shares(spec)
    assert all(len(indices) == TRAIN // 2 for indices in read.values())  # each sample once
    assert all(len(loaders[worker]) == LOADER_WORKERS for worker in workers)


def read_by(notes: Path, trainers: set[int]) -> tuple[dict[int, list[int]], dict[int, set[int]]]:
    """The training samples the loader workers of each of ``trainers`` read, and those workers' pids."""
    read, loaders = defaultdict(list), defaultdict(set)
    for path in notes.glob("train-*"):
        _, parent, pid = path.name.split("-")
        if int(parent) in trainers:
            read[int(parent)] += [int(index) for index in path.read_text().split()]
            loaders[int(parent)].add(int(pid))
    return read, loaders


def shares(spec: str) -> set[frozenset[int]]:
    """The two workers' samples of the epoch: split, each half of every batch of 12; join, each half of every
    global batch of 24; async, each its half of the epoch's batches of 6 (split's updates)."""
    order = epoch_permutation(TRAIN, seed=datasets_job.SETTINGS["seed"], epoch=0).tolist()
    if spec.endswith("async"):
        return {frozenset(order[: TRAIN // 2]), frozenset(order[TRAIN // 2 :])}
    size = BATCH if spec.endswith("split") else 2 * BATCH
    return {
        frozenset(i for begin in range(0, TRAIN, size) for i in order[begin + part * size // 2 :][: size // 2])
        for part in range(2)
    }


@pytest.mark.parametrize("spec", SYNCHRONOUS)
def test_synchronous_strategies_match_one_process(spec: str, runs, one_process) -> None:
    root, _ = runs
    assert_same_weights(weights(root / spec), one_process[BATCH if spec.endswith("split") else 2 * BATCH])


def test_a_run_resumed_mid_epoch_without_loader_workers_ends_where_the_uninterrupted_one_does(runs) -> None:
    root, _ = runs
    resumed = summary(root, f"{RESUMED}-resumed")
    assert resumed["resumed_from_step"] == datasets_job.STEPS_INSIDE and resumed["loader_workers"] == 0
    uninterrupted = weights(root / RESUMED)
    for name, value in weights(root / f"{RESUMED}-resumed").items():
        torch.testing.assert_close(value, uninterrupted[name], rtol=1e-5, atol=1e-6)


def test_the_local_launcher_trains_it_and_ctrl_c_leaves_no_loader_worker(runs, tmp_path: Path) -> None:
    """Through ``scaletrain train`` with its own processes: the workload registered by a plug-in, its files
    read lazily by 2 loader workers per process; Ctrl-C once all of them have read."""
    _, data = runs
    out, readers = tmp_path / "run", tmp_path / "readers"
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}",
        "SCALETRAIN_OFFLINE": "1",
        "SCALETRAIN_PLUGINS": PLUGIN_MODULE,
        ENV_READERS: str(readers),
    }
    arguments = [
        "train", "lazy-fashion", "--data-dir", str(data), "--workers", "2", "--strategy", "allreduce-split",
        "--epochs", "1000", "--out", str(out), "--progress", "off", "--no-tensorboard", "--threads", "1",
    ]  # fmt: skip
    run = subprocess.Popen(
        [sys.executable, "-m", "scaletrain", *arguments],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        trainers, loaders = set(), {}
        deadline = time.monotonic() + 120
        # until each worker has read through its loader workers
        while len(trainers) < 2 or len(loaders) < 2 or min(map(len, loaders.values())) < LOADER_WORKERS:
            assert run.poll() is None, run.communicate()[1]
            assert time.monotonic() < deadline, f"the run in {out} did not read through its loader workers in 120 s"
            time.sleep(0.05)
            trainers = {json.loads(p.read_text())["pid"] for p in out.glob("processes/rank-*.json")}
            loaders = read_by(readers, trainers)[1]
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, stderr
    assert "Traceback" not in stderr
    everyone = trainers | {int(path.name.split("-")[2]) for path in readers.glob("*")}
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in everyone) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in everyone if alive(pid)]


def alive(pid: int) -> bool:
    """Running, or stopped; a zombie waiting for its parent counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()
