"""The training loop: outputs, determinism, exact resume, refusal to overwrite, a user's own model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tests.helpers import assert_identical_weights
from torch import nn

import scaletrain
from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.train.state import learning_rate

SUMMARY_KEYS = {
    "workload",
    "steps",
    "epochs",
    "batch_size",
    "wall_seconds",
    "batches_per_second",
    "samples_per_second",
    "warmup_steps_excluded",
    "parameters",
    "test_accuracy",
    "throughput_note",
}


def small_lenet(data: Path, out: Path, **settings):
    defaults = {
        "batch_size": 16,
        "epochs": 2,
        "threads": 1,
        "progress": "off",
        "log_every": 4,
        "checkpoint_every": 5,
    }
    return scaletrain.train("lenet", data_dir=data, out=out, **{**defaults, **settings})


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_outputs_of_a_run(tiny_fmnist: Path, tmp_path: Path) -> None:
    summary = small_lenet(tiny_fmnist, tmp_path / "run")
    out = tmp_path / "run"
    written = json.loads((out / "summary.json").read_text())
    assert written.keys() >= SUMMARY_KEYS
    assert written["steps"] == 2 * (256 // 16) and written["epochs"] == 2.0
    assert written["parameters"] == 431_080
    assert written["samples_per_second"] == pytest.approx(written["batches_per_second"] * 16)
    assert summary["test_accuracy"] == written["test_accuracy"]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["kind"] == "step"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert [r["step"] for r in steps] == list(range(4, 33, 4))
    assert [r["epoch"] for r in epochs] == [0, 1] and all("test_accuracy" in r for r in epochs)
    assert epochs[-1]["test_accuracy"] == written["test_accuracy"]  # final weights evaluated once
    model = scaletrain.create_workload("lenet").build_model()
    model.load_state_dict(load_weights(out / "model.pt"))
    assert list((out / "tb").glob("events.out.tfevents.*"))
    assert (out / "checkpoint.pt").exists()
    assert not list(out.glob(".*.tmp"))


def test_the_tiny_task_is_learned(tiny_fmnist: Path, tmp_path: Path) -> None:
    summary = small_lenet(tiny_fmnist, tmp_path / "run", epochs=6, tensorboard=False)
    assert summary["test_accuracy"] >= 0.9  # the squares are easy; chance is 0.1


def test_same_seed_gives_bitwise_identical_weights(tiny_fmnist: Path, tmp_path: Path) -> None:
    for name in ("a", "b"):
        small_lenet(tiny_fmnist, tmp_path / name, seed=11, tensorboard=False)
    small_lenet(tiny_fmnist, tmp_path / "c", seed=12, tensorboard=False)
    first, second = load_weights(tmp_path / "a/model.pt"), load_weights(tmp_path / "b/model.pt")
    assert_identical_weights(first, second)
    assert (tmp_path / "a/model.pt").read_bytes() == (tmp_path / "b/model.pt").read_bytes()
    other = load_weights(tmp_path / "c/model.pt")
    assert not torch.equal(first["classifier.3.weight"], other["classifier.3.weight"])


@pytest.mark.parametrize("workload", ["lenet", "ptb-lstm"])
def test_resume_mid_epoch_reproduces_an_uninterrupted_run(
    workload: str, tiny_fmnist: Path, tiny_ptb: Path, tmp_path: Path
) -> None:
    data = tiny_fmnist if workload == "lenet" else tiny_ptb
    options = {} if workload == "lenet" else {"num_steps": "4", "vocab_size": "100", "hidden_size": "16"}
    settings = dict(
        data_dir=data,
        batch_size=8,
        epochs=2,
        threads=1,
        progress="off",
        tensorboard=False,
        options=options,
        momentum=0.9,
        checkpoint_every=1000,
    )
    straight = scaletrain.train(workload, out=tmp_path / "straight", **settings)
    stopped = scaletrain.train(workload, out=tmp_path / "split", steps=straight["steps_per_epoch"] + 3, **settings)
    assert stopped["steps"] == straight["steps_per_epoch"] + 3  # stopped inside the second epoch
    resumed = scaletrain.train(workload, out=tmp_path / "split", resume=True, **settings)
    assert resumed["resumed_from_step"] == stopped["steps"] and resumed["steps"] == straight["steps"]
    assert_identical_weights(load_weights(tmp_path / "straight/model.pt"), load_weights(tmp_path / "split/model.pt"))
    steps_logged = [json.loads(line)["step"] for line in (tmp_path / "split/metrics.jsonl").read_text().splitlines()]
    assert steps_logged == sorted(steps_logged)  # no record twice after the resume


def test_existing_run_is_not_overwritten_and_resume_needs_a_checkpoint(tiny_fmnist: Path, tmp_path: Path) -> None:
    small_lenet(tiny_fmnist, tmp_path / "run", steps=3, tensorboard=False)
    before = (tmp_path / "run/checkpoint.pt").read_bytes()
    with pytest.raises(ConfigError, match="already holds a run.*--resume"):
        small_lenet(tiny_fmnist, tmp_path / "run", steps=3)
    assert (tmp_path / "run/checkpoint.pt").read_bytes() == before
    with pytest.raises(ScaletrainError, match="no checkpoint"):
        small_lenet(tiny_fmnist, tmp_path / "empty", resume=True)
    with pytest.raises(ConfigError, match="written with batch size 16 but this run asks for 32"):
        small_lenet(tiny_fmnist, tmp_path / "run", resume=True, batch_size=32)


def test_batch_larger_than_the_dataset_is_a_clear_error(tiny_fmnist: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="smaller --batch-size"):
        small_lenet(tiny_fmnist, tmp_path / "run", batch_size=1024)


def test_learning_rate_decays_like_zaremba() -> None:
    config = TrainConfig("ptb-lstm", lr=1.0, lr_decay=0.5, lr_decay_start=4)
    assert [learning_rate(config, epoch) for epoch in range(6)] == [1.0, 1.0, 1.0, 1.0, 0.5, 0.25]


def test_a_users_own_model_and_data(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(512, 6, generator=generator)
    labels = (inputs[:, 0] > 0).long()  # learnable: the sign of the first feature
    workload = scaletrain.ClassificationWorkload.from_tensors(
        "sign",
        lambda: nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)),
        train=(inputs[:400], labels[:400]),
        test=(inputs[400:], labels[400:]),
        batch_size=20,
        lr=0.1,
        epochs=5,
    )
    summary = scaletrain.train(workload, out=tmp_path / "mine", progress="off", tensorboard=False)
    assert summary["workload"] == "sign" and summary["steps"] == 5 * 20
    assert summary["test_accuracy"] >= 0.9
    assert (tmp_path / "mine/model.pt").exists()
