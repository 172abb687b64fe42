"""``--strategy diloco``: H inner steps on each worker, then an outer step with the averaged change. With H = 1 and
an outer SGD step at rate 1 without momentum it is the synchronous all-reduce; a run stopped between two outer
steps resumes to the uninterrupted weights, also after a technique changed the network at an epoch's end (an outer
step then); the change travels through any codec (PowerSGD here); what is not built is refused in one line. Real
processes on loopback, LeNet on generated Fashion-MNIST files."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from tests import helpers
from tests.helpers import free_ports, make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights
from tests.jobs import diloco_buffers_job

import scaletrain
from scaletrain.data.sampler import Part
from scaletrain.workloads import create_workload

pytestmark = pytest.mark.multiprocess

COMMON = {"epochs": 1, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "seed": 4, "threads": 1}
COMMON |= {"progress": "off", "tensorboard": False}
LOCAL_SGD = {"outer_lr": 1, "outer_momentum": 0}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("diloco") / "fmnist", train=192, test=32)


def test_one_inner_step_and_a_plain_outer_step_is_the_synchronous_all_reduce(data: Path, tmp_path: Path) -> None:
    scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "allreduce", workers=2, strategy="allreduce-split", **COMMON
    )
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "diloco", workers=2, strategy="diloco-split", sync_every=1,
        strategy_options=LOCAL_SGD, **COMMON,
    )  # fmt: skip
    assert summary["outer_steps"] == summary["steps"] == 12
    reference = weights(tmp_path / "allreduce")
    for name, tensor in weights(tmp_path / "diloco").items():
        torch.testing.assert_close(tensor, reference[name], rtol=0, atol=1e-6, msg=name)


def test_a_run_stopped_between_outer_steps_resumes_to_the_uninterrupted_weights(data: Path, tmp_path: Path) -> None:
    settings = {"workers": 2, "strategy": "diloco", "sync_every": 3, "epochs": 2, **COMMON} | {"epochs": 2}
    whole = scaletrain.train("lenet", data_dir=data, out=tmp_path / "whole", **settings)
    assert whole["outer_steps"] == 4 and whole["steps"] == 12  # join: 2 × 16 a step, 6 steps an epoch
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", steps=5, **settings)  # two inner steps past one
    resumed = scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", resume=True, **settings)
    assert resumed["resumed_from_step"] == 5 and resumed["outer_steps"] == 4
    reference = weights(tmp_path / "whole")
    for name, tensor in weights(tmp_path / "cut").items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="needs root and iproute2 (tc)")
@pytest.mark.parametrize("outer_exchange", ["allreduce", "sharded"])
def test_an_outer_step_after_the_last_inner_step_counts_as_training_time(
    outer_exchange: str, data: Path, tmp_path: Path
) -> None:
    """H = 20 over 6 steps behind 20 Mbit/s links: the only outer step is the one the run owes at its end, LeNet's
    1.7 MB of change, about 0.7 s on the wire. Its seconds count in every worker's training time (they were left
    out: a worker then measured 0.02 s for its 4 timed steps, and a short run at a large H looked faster than it
    was)."""
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "run", workers=2, strategy="diloco-split", sync_every=20, steps=6,
        warmup_steps=2, network="20mbit", strategy_options={"outer_exchange": outer_exchange}, **COMMON,
    )  # fmt: skip
    assert summary["outer_steps"] == 1 and summary["steps"] == 6
    for worker in summary["per_worker"]:  # measured at 0.73 s and more
        assert worker["measured_seconds"] > 0.4 and worker["communication_seconds"] + worker["wait_seconds"] > 0.4


def test_the_change_travels_through_powersgd(data: Path, tmp_path: Path) -> None:
    summary = scaletrain.train(
        "lenet", data_dir=data, out=tmp_path / "run", workers=2, strategy="diloco", sync_every=2, wire="powersgd",
        **COMMON,
    )  # fmt: skip
    assert summary["wire"] == "powersgd" and summary["outer_steps"] == 3 and summary["steps"] == 6


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--sync-every", "0"], "--sync-every must be 1 or more"),
        (["-S", "outer_exchange=sharded", "--min-workers", "1"], "outer_exchange=sharded does not work with --min"),
        (["-S", "outer_exchange=central"], "option outer_exchange must be one of allreduce, sharded"),
        (["--overlap"], "--overlap reduces gradients during backward under all-reduce, not --strategy diloco"),
        (["-S", "outer_optimizer=lion"], "unknown optimizer 'lion'"),
        (["--strategy", "allreduce", "--sync-every", "4"], "--sync-every is an option of --strategy diloco"),
        (["--technique", "rebatch", "-T", "batch_size=8", "--min-workers", "1"], "--technique and --min-workers"),
        (["--technique", "rebatch", "-T", "batch_size=8", "-S", "outer_exchange=sharded"], "sharded does not work w"),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(flags: list[str], message: str, tmp_path: Path) -> None:
    done = run_cli("train", "lenet", "--workers", "2", "--strategy", "diloco", "--out", str(tmp_path / "run"), *flags)
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr
    assert not (tmp_path / "run").exists()


GROW = {"technique": "net2net", "technique_options": {"plan": "1:wider:features.0:26;2:deeper:classifier.2"}}


def test_a_technique_decides_at_an_outer_step_and_a_run_resumed_after_its_change_ends_as_the_whole_run(
    data: Path, tmp_path: Path
) -> None:
    """Net2Net widens LeNet after epoch 1 and deepens it after epoch 2 (6 steps an epoch, H = 4, Nesterov outer
    step): each epoch's end is an outer step too (at 4, 6, 8, 12, 16 and 18), the grown network's anchor and outer
    momentum are saved with it, and a run cut two inner steps past the outer step at 8 resumes to the whole run's
    weights."""
    settings = {"workers": 2, "strategy": "diloco", "sync_every": 4, **COMMON, "epochs": 3, **GROW}
    whole = scaletrain.train("lenet", data_dir=data, out=tmp_path / "whole", **settings)
    assert whole["outer_steps"] == 6 and whole["steps"] == 18  # without the technique: 5
    assert whole["parameters"] > whole["parameters_initial"] and "classifier.3" in whole["architecture"]
    assert len({worker["weights_digest"] for worker in whole["per_worker"]}) == 1
    records = [json.loads(line) for line in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    changes = [record for record in records if record["kind"] == "reconfiguration"]
    assert [change["step"] for change in changes] == [6, 12]
    for change in changes:  # made on the shared weights, the function unchanged
        assert change["quality_after"]["test_loss"] == pytest.approx(change["quality_before"]["test_loss"], rel=1e-5)
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", steps=10, **settings)
    resumed = scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", resume=True, **settings)
    assert resumed["resumed_from_step"] == 10 and resumed["outer_steps"] == 6
    reference = weights(tmp_path / "whole")
    cut = weights(tmp_path / "cut")
    assert cut.keys() == reference.keys()
    for name, tensor in cut.items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_outer_step_averages_the_workers_batch_norm_statistics(tmp_path: Path) -> None:
    """Two real processes, each with running statistics of its own (1 and 2; 10 and 20): after an outer step
    both hold their mean, and the same weights; the buffers' bytes count among those sent."""
    port = free_ports(1)[0]
    variables = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for rank in range(2)
    ]
    helpers.run_job(diloco_buffers_job.__name__, [str(tmp_path)], variables, out=tmp_path / "job")
    ranks = [json.loads((tmp_path / f"rank-{rank}.json").read_text()) for rank in range(2)]
    for record in ranks:
        assert record["outer_steps"] == 1
        assert record["running_mean"] == pytest.approx([1.5] * 4)
        assert record["running_var"] == pytest.approx([15.0] * 4)
    assert ranks[0]["weights"] == ranks[1]["weights"]
    parameters = 3 * 4 + 4 + 4 + 4 + 4 + 1  # two linear layers and batch norm's weight and bias
    assert ranks[0]["sent_bytes"] == 4 * parameters + 4 * (4 + 4)  # the change, then both running statistics


RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "4"}


@pytest.mark.parametrize("exchange", ["allreduce", "sharded"])
def test_batch_norms_statistics_are_estimated_afresh_for_the_final_weights(
    exchange: str, data: Path, tmp_path: Path
) -> None:
    """The outer step moves the weights past the statistics the inner steps gathered (evaluated at chance before):
    each worker re-estimates them over its share of H batches and the workers take the mean, which is the
    cumulative average of the batch statistics of all 2·H shares, recomputed here from the saved weights."""
    settings = {**COMMON, "workers": 2, "strategy": "diloco-split", "sync_every": 3, "lr": 0.02}
    summary = scaletrain.train("resnet", options=RESNET, data_dir=data, out=tmp_path / "run",
                               strategy_options={"outer_exchange": exchange}, **settings)  # fmt: skip
    assert summary["outer_steps"] == 4  # 12 inner steps
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    workload = create_workload("resnet", RESNET)
    model = workload.build_model()
    model.load_state_dict(saved)
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    loaded = workload.load_data(data)
    with torch.no_grad():
        for index in range(2):
            for batch in workload.train_batches(loaded, epoch=0, batch_size=16, seed=4, part=Part(index, 2),
                                                numbers=range(3)):  # fmt: skip
                workload.training_loss(model, batch, None)
    for name, value in model.state_dict().items():
        if "running" in name:
            torch.testing.assert_close(saved[name], value, rtol=1e-4, atol=1e-5, msg=name)
