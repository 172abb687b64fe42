"""PruneTrain in real runs: a small ResNet on Fashion-MNIST-format data shrinks while it trains, in one
process and with 2 workers (which must prune exactly as one process does), records what it did, resumes
after a reconfiguration, and leaves a ``model.pt`` that loads into the pruned network.

Settings that prune within 3 short epochs: λ from a lasso penalty ratio of 0.5, threshold 0.05,
a reconfiguration after every epoch (the paper's defaults, 0.2 / 1e-4 / 10 epochs, need far longer).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers import assert_same_weights, make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights

import scaletrain

pytestmark = pytest.mark.avx2  # CI runs this file on AVX2 kernels too (.ci/run)

RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "4"}
PRUNE = {"technique": "prunetrain", "lasso_ratio": 0.5, "prune_threshold": 0.05, "reconfigure_every": 1}
COMMON = {"epochs": 3, "lr": 0.1, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 5}


def prune_train(data: Path, out: Path, **extra) -> dict:
    return scaletrain.train("resnet", options=RESNET, data_dir=data, out=out, batch_size=12, **PRUNE, **COMMON, **extra)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("prunetrain") / "fmnist", train=192, test=32)


@pytest.fixture(scope="module")
def local_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prunetrain-local") / "run"
    prune_train(data, out)
    return out


def test_a_local_run_prunes_and_records_every_reconfiguration(local_run: Path) -> None:
    summary = json.loads((local_run / "summary.json").read_text())
    assert summary["parameters"] < summary["parameters_initial"]
    assert summary["architecture"], "the pruned network's spec is in the summary"
    assert (local_run / "pruning.png").stat().st_size > 0
    records = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    reconfigurations = [r for r in records if r["kind"] == "reconfiguration"]
    assert reconfigurations, "a reconfiguration happened"
    first = reconfigurations[0]
    assert first["parameters"] < first["parameters_before"]
    assert first["flops_per_sample"] < first["flops_per_sample_before"]
    assert {"test_accuracy", "test_loss"} <= first["quality_before"].keys() & first["quality_after"].keys()
    assert first["channels"]["features.0"] >= 1
    assert reconfigurations[-1]["parameters"] == summary["parameters"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    assert all(r["seconds"] > 0 for r in epochs)
    assert epochs[-1]["parameters"] < epochs[0]["parameters"]


def test_each_reconfiguration_predicts_the_next_epochs_step_and_the_epoch_records_it_beside_the_measured(
    local_run: Path,
) -> None:
    records = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    epochs = {r["epoch"]: r for r in records if r["kind"] == "epoch"}
    for record in (r for r in records if r["kind"] == "reconfiguration"):
        before = epochs[record["epoch"]]
        assert record["seconds_per_step_before"] == before["seconds_per_step"]
        # one process exchanges nothing: the prediction is its compute scaled by the FLOPs that remain, and its
        # wait for each batch, which the network does not change
        assert record["predicted_communication_seconds_per_step"] == 0
        compute = record["flops_per_sample"] / record["flops_per_sample_before"]
        bound = before["seconds_per_step"] * compute + before["data_seconds_per_step"]
        assert 0 < record["predicted_seconds_per_step"] <= bound + 1e-12
        after = epochs.get(record["epoch"] + 1)
        if after is not None:
            assert after["predicted_seconds_per_step"] == record["predicted_seconds_per_step"]
            assert after["seconds_per_step"] > 0 and after["steps"] == 16  # 192 samples / batch 12


def test_the_estimator_profiles_the_network_a_run_left(local_run: Path, data: Path) -> None:
    settings = {"repeats": 2, "warmup": 1, "round_trips": 2, "launches": 1, "concurrency": 1, "data_dir": data}
    pruned = scaletrain.profile("resnet", architecture_of=local_run, batch_size=12, **settings)
    summary = json.loads((local_run / "summary.json").read_text())
    assert pruned.parameters == summary["parameters"] and pruned.architecture == summary["architecture"]
    assert pruned.options == summary["options"]
    dense = scaletrain.profile("resnet", options=RESNET, batch_size=12, **settings)
    assert dense.parameters == summary["parameters_initial"] and dense.weight_bytes > pruned.weight_bytes
    with pytest.raises(scaletrain.ConfigError, match="is a run of 'resnet', not 'lenet'; profile resnet"):
        scaletrain.profile("lenet", architecture_of=local_run, **settings)


def test_model_pt_loads_into_the_network_rebuilt_from_the_saved_spec(local_run: Path) -> None:
    model = scaletrain.load_model(local_run)
    assert (
        sum(p.numel() for p in model.parameters()) == json.loads((local_run / "summary.json").read_text())["parameters"]
    )
    saved = weights(local_run)
    assert_same_weights({k: v for k, v in model.state_dict().items() if k in saved}, saved)
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


LENET_PRUNE = {**PRUNE, "prune_threshold": 0.04}
LENET = {**COMMON, "epochs": 2, "lr": 0.05}


def lenet_train(data: Path, out: Path, **extra) -> dict:
    return scaletrain.train("lenet", data_dir=data, out=out, batch_size=12, **{**LENET_PRUNE, **LENET, **extra})


@pytest.mark.multiprocess
@pytest.mark.parametrize(("strategy", "server"), [("allreduce", None), ("ps", "central"), ("ps", "sharded")])
def test_two_workers_split_prune_exactly_as_one_process(
    data: Path, tmp_path: Path, strategy: str, server: str | None
) -> None:
    """On LeNet (no batch norm): a split run computes the same gradients as one process, so it must
    end weight for weight equal, with the same pruned architecture — the flattened conv channels
    taking their 16 classifier inputs each with them. (A batch-norm network computes its statistics
    over each worker's part of the batch, as DDP does without SyncBatchNorm, so it cannot be equal.)"""
    local = lenet_train(data, tmp_path / "local")
    assert local["architecture"]["features.3"]["out"] * 16 == local["architecture"]["classifier.1"]["in"]
    layout = {"workers": 2, "strategy": strategy, "sync": "split", **({"server": server} if server else {})}
    summary = lenet_train(data, tmp_path / "run", **layout)
    assert summary["architecture"] == local["architecture"]
    assert summary["parameters"] == local["parameters"] < local["parameters_initial"]
    assert_same_weights(weights(tmp_path / "run"), weights(tmp_path / "local"))


@pytest.mark.multiprocess
def test_two_workers_of_local_sgd_at_h_1_prune_exactly_as_one_process(data: Path, tmp_path: Path) -> None:
    """diloco averages the workers' steps, so the penalty is the objective's (a subgradient step), whose average
    is the average gradient's; the proximal step shrinks each worker's weights apart, which an average does not
    undo exactly."""
    subgradient = {"technique_options": {"step": "subgradient"}}
    local = lenet_train(data, tmp_path / "local", **subgradient)
    assert local["parameters"] < local["parameters_initial"]
    layout = {"workers": 2, "strategy": "diloco", "sync": "split", "sync_every": 1}
    local_sgd = {"strategy_options": {"outer_lr": 1, "outer_momentum": 0}}
    summary = lenet_train(data, tmp_path / "run", **subgradient, **layout, **local_sgd)
    assert summary["architecture"] == local["architecture"] and summary["outer_steps"] == summary["steps"]
    assert_same_weights(weights(tmp_path / "run"), weights(tmp_path / "local"))


@pytest.mark.multiprocess
def test_a_two_worker_resnet_run_prunes_and_its_server_keeps_the_workers_batch_norm_statistics(
    data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    summary = prune_train(data, out, workers=2, strategy="ps", server="central", sync="split")
    assert summary["parameters"] < summary["parameters_initial"]
    saved = weights(out)
    # the central server trains nothing: its model.pt holds the deciding worker's running statistics
    assert not torch.equal(saved["features.1.running_mean"], torch.zeros_like(saved["features.1.running_mean"]))
    assert int(saved["features.1.num_batches_tracked"]) > 0


def test_resuming_after_a_reconfiguration_ends_like_an_uninterrupted_run(
    data: Path, local_run: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    first = prune_train(data, out, steps=40)  # stops in epoch 3, after the pruning at epoch 2's end
    assert first["parameters"] < first["parameters_initial"]
    assert torch.load(out / "checkpoint.pt", weights_only=False)["technique"]["weight"] > 0  # λ kept
    prune_train(data, out, resume=True)
    assert_same_weights(weights(out), weights(local_run))


@pytest.mark.multiprocess
def test_a_central_server_run_resumes_after_a_reconfiguration_with_the_workers_lambda(
    data: Path, tmp_path: Path
) -> None:
    """The central server takes the proximal steps and writes the checkpoints, with the λ of the workers'
    first losses."""
    layout = {"workers": 2, "strategy": "ps", "server": "central", "sync": "split", "epochs": 3}
    whole = lenet_train(data, tmp_path / "whole", **layout)
    out = tmp_path / "run"
    first = lenet_train(data, out, steps=40, **layout)  # in epoch 3, after the pruning at epoch 2's end
    assert first["parameters"] < first["parameters_initial"] and whole["parameters"] < first["parameters_initial"]
    saved = torch.load(out / "checkpoint.pt", weights_only=False)["technique"]["weight"]
    assert saved == torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=False)["technique"]["weight"]
    lenet_train(data, out, resume=True, **layout)
    assert_same_weights(weights(out), weights(tmp_path / "whole"))


@pytest.mark.multiprocess
@pytest.mark.parametrize("server", ["central", "sharded"])
def test_asynchronous_workers_prune_and_finish_every_batch(data: Path, tmp_path: Path, server: str) -> None:
    """Asynchronous updates are not one process's, but the servers shrink what they own, the network is
    pruned at the agreed boundary, and every planned batch is done."""
    layout = {"workers": 2, "strategy": "ps", "server": server, "sync": "async"}
    summary = lenet_train(data, tmp_path / "run", **layout)
    assert summary["parameters"] < summary["parameters_initial"]
    assert summary["server_updates"] == summary["steps"] == 2 * 32  # 2 epochs of 192 samples, updates of 12 // 2
    assert not summary.get("lost_workers")


def test_a_technique_flag_without_its_technique_is_one_clear_line(tmp_path: Path) -> None:
    result = run_cli("train", "resnet20", "--lasso-ratio", "0.3", "--out", str(tmp_path / "run"), timeout=120)
    assert result.returncode == 2
    assert "--lasso-ratio is an option of --technique prunetrain; add --technique prunetrain" in result.stderr
    assert "Traceback" not in result.stderr


ADAMW = {**LENET, "lr": 1e-3, "momentum": None, "optimizer": "adamw"}


@pytest.mark.multiprocess
@pytest.mark.parametrize("spec", ["allreduce-split", "ps-sharded-split"])
def test_two_workers_prune_with_adamw_as_one_process_and_its_moments_take_the_pruned_shapes(
    data: Path, tmp_path: Path, spec: str
) -> None:
    """Every per-parameter state goes through the surgery (Adam's two moments and its step count), and a sharded
    server's owners hand all of it to the workers at the reconfiguration."""
    local = lenet_train(data, tmp_path / "local", **ADAMW)
    assert local["optimizer"] == "AdamW" and local["parameters"] < local["parameters_initial"]
    summary = lenet_train(data, tmp_path / "run", workers=2, strategy=spec, **ADAMW)
    assert summary["architecture"] == local["architecture"]
    assert_same_weights(weights(tmp_path / "run"), weights(tmp_path / "local"))
    checkpoint = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)
    parameters = [value for name, value in checkpoint["model"].items() if "running" not in name]
    states = checkpoint["optimizer"]["state"]
    # a sharded run's owners step (their shard files hold their state); a worker's optimizer holds what the owners
    # handed on at the reconfiguration after the first epoch
    stepped = summary["steps"] if spec.startswith("allreduce") else summary["steps"] // 2
    assert len(states) == len(parameters) > 0
    for index, parameter in enumerate(parameters):
        assert states[index]["exp_avg"].shape == states[index]["exp_avg_sq"].shape == parameter.shape
        assert float(states[index]["step"]) == stepped
