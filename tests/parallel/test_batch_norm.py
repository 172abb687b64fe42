"""Synchronised batch norm in real runs (issue 25): with ``sync_batchnorm``, 2 workers that split each batch
train a user's residual network with batch norm to the one process's weights and running statistics,
under all-reduce and both parameter servers, and with PruneTrain to the same pruned network; 2 join
workers train to one process's weights over their joined batch. Without it, the split run ends elsewhere,
and says so in one line at its start.

The multi-process trainings run in jobs started with the torchrun variables (tests/jobs/batch_norm_job.py,
which defines the network), all 2-process trainings in one job; the one-process references run here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from tests import helpers
from tests.helpers import REPO, free_ports, run_cli
from tests.jobs import batch_norm_job

import scaletrain

pytestmark = [pytest.mark.multiprocess, pytest.mark.avx2]  # CI runs it on AVX2 kernels too

TWO_PROCESSES = [
    "allreduce-split",
    "allreduce-split-plain",
    "allreduce-split-prunetrain",
    "allreduce-join",
    "ps-sharded-split",
    "ps-sharded-split-prunetrain",
]
THREE_PROCESSES = ["ps-central-split"]  # the central server's process and 2 workers
WARNING = "warning: each of the 2 workers normalises its batch norms over its own share of each batch (8 of 16"


def run_job(out: Path, names: list[str], processes: int) -> dict[str, str]:
    """All processes of one job; what rank 0 printed during each training, by name."""
    ports = free_ports(len(names))
    variables = [
        {"RANK": str(rank), "WORLD_SIZE": str(processes), "MASTER_ADDR": "127.0.0.1"} for rank in range(processes)
    ]
    args = [str(out), ",".join(map(str, ports)), ",".join(names)]
    outputs = helpers.run_job(batch_norm_job.__name__, args, variables, out=out / f"job-{processes}")
    sections = outputs[0].split("=== ")[1:]
    return {section.split("\n", 1)[0]: section.split("\n", 1)[1] for section in sections}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    out = tmp_path_factory.mktemp("sync-batchnorm")
    for name in ("local", "local-prunetrain"):
        batch_norm_job.train(name, out)
    printed = run_job(out, TWO_PROCESSES, 2)
    printed.update(run_job(out, THREE_PROCESSES, 3))
    return out, printed


def saved(out: Path, name: str) -> tuple[dict[str, torch.Tensor], dict]:
    folder = out / name
    return torch.load(folder / "model.pt", weights_only=True), json.loads((folder / "summary.json").read_text())


def largest_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """max |Δ| over every floating-point tensor: weights and running statistics."""
    assert first.keys() == second.keys()
    return max(float((first[k] - second[k]).abs().max()) for k in first if first[k].is_floating_point())


@pytest.mark.parametrize(
    "name",
    [
        "allreduce-split",
        "allreduce-join",
        "ps-sharded-split",
        "ps-central-split",
        "allreduce-split-prunetrain",
        "ps-sharded-split-prunetrain",
    ],
)
def test_synchronised_workers_train_what_one_process_trains(runs, name: str) -> None:
    out, printed = runs
    model, summary = saved(out, name)
    reference, reference_summary = saved(out, "local-prunetrain" if name.endswith("prunetrain") else "local")
    assert summary["sync_batchnorm"] is True and summary["workers"] == 2
    assert summary["steps"] == reference_summary["steps"] == 2 * batch_norm_job.STEPS_PER_EPOCH
    assert summary["architecture"] == reference_summary["architecture"]
    assert summary["parameters"] == reference_summary["parameters"]
    assert largest_difference(model, reference) <= 1e-4
    for key in model:  # the counters too: one update of the running statistics per step
        if not model[key].is_floating_point():
            assert torch.equal(model[key], reference[key]), key
    assert "warning:" not in printed[name]


@pytest.mark.parametrize("name", ["allreduce-split-prunetrain", "ps-sharded-split-prunetrain"])
def test_prunetrain_pruned_the_synchronised_network(runs, name: str) -> None:
    out, _ = runs
    _, summary = saved(out, name)
    assert summary["architecture"], "the reconfiguration removed channels"
    assert summary["parameters"] < summary["parameters_initial"]


def test_without_it_a_split_run_ends_elsewhere_and_says_so_once(runs) -> None:
    out, printed = runs
    model, summary = saved(out, "allreduce-split-plain")
    reference, _ = saved(out, "local")
    assert summary["sync_batchnorm"] is False
    assert largest_difference(model, reference) > 1e-2  # each worker normalised over 8 of 16 samples
    assert printed["allreduce-split-plain"].count("warning:") == 1
    assert WARNING in printed["allreduce-split-plain"]
    assert "add --sync-batchnorm" in printed["allreduce-split-plain"]


def test_through_the_api_and_the_command_line_too(runs, tmp_path: Path) -> None:
    """Issue 25's first line: the user's network, PruneTrain, 2 workers splitting each batch with
    synchronised batch norm, through the API (the object) and the command line (``module:factory``), ends
    as one process does; ``load_model`` rebuilds both pruned networks (the object's with ``workload=``)."""
    out, _ = runs
    reference, reference_summary = saved(out, "local-prunetrain")
    settings = {**batch_norm_job.SETTINGS, **batch_norm_job.TRAININGS["allreduce-split-prunetrain"]}
    scaletrain.train(batch_norm_job.workload(), out=tmp_path / "api", **settings)
    result = run_cli(
        "train", "tests.jobs.batch_norm_job:workload", "--workers", "2", "--strategy", "allreduce-split",
        "--sync-batchnorm", "--technique", "prunetrain", "--lasso-ratio", "0.5", "--prune-threshold", "0.12",
        "--reconfigure-every", "1", "--epochs", "2", "--lr", "0.05", "--momentum", "0.9", "--threads", "1",
        "--seed", "7", "--timeout", "60", "--no-tensorboard", "--progress", "off", "--out", str(tmp_path / "cli"),
        env={"PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning:" not in result.stderr
    loaded = {
        "api": scaletrain.load_model(tmp_path / "api", workload=batch_norm_job.workload()),
        "cli": scaletrain.load_model(tmp_path / "cli"),
    }
    for name, model in loaded.items():
        _, summary = saved(tmp_path, name)
        assert summary["architecture"] == reference_summary["architecture"] and summary["sync_batchnorm"] is True
        assert largest_difference(model.state_dict(), reference) <= 1e-4, name
