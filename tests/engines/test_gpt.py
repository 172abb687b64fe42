"""The foreign engines' ``gpt``, for real: scaletrain's small GPT trained by TensorFlow and MXNet on a tiny text in
Mikolov's format (width 16, 2 heads, windows of 8 words, a 64-word vocabulary, 10 steps of AdamW at lr 1e-2 after a
warm-up of 2 updates, cosine to 0, clipped to 0.5), compared with scaletrain's own run of the same settings.

Without dropout the runs agree: after 10 steps an engine's one process holds scaletrain's weights, and 2
synchronous workers at 4 windows each the weights of the engine's one process at 8, within ``atol 1e-5 + rtol
1e-4`` (the equivalence tests' tolerance elsewhere; measured: TensorFlow 1.9e-7, MXNet 1.6e-6 from scaletrain; 1e-7
and 8e-8 between the synchronous and the one-process run), and the test perplexity within ``rtol 1e-4`` (measured:
4e-6).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import scaletrain
from scaletrain.engines.install import installed
from scaletrain.engines.launch import check_run, run_engine
from scaletrain.engines.prepare import EngineRun
from scaletrain.engines.registry import ENGINES
from scaletrain.errors import ConfigError
from scaletrain.measure.sweep import SweepConfig, plan_runs
from scaletrain.workloads import create_workload
from scaletrain.workloads.base import count_parameters

pytestmark = pytest.mark.multiprocess

WIDTH = 16
OPTIONS = {"width": str(WIDTH), "heads": "2", "context": "8", "vocab_size": "64", "dropout": "0"}
SETTINGS = {"steps": 10, "lr": 1e-2, "lr_warmup": 2, "clip_norm": 0.5, "seed": 3, "threads": 1, "warmup_steps": 2}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1,500 words of 40 kinds (and ``<unk>``) in each of ``ptb.{train,valid,test}.txt``."""
    folder = tmp_path_factory.mktemp("engines-gpt") / "ptb"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for split in ("train", "valid", "test"):
        lines = [" ".join(f"w{word}" for word in rng.integers(0, 40, rng.integers(4, 14))) for _ in range(180)]
        (folder / f"ptb.{split}.txt").write_text(" \n".join(["<unk> w1", *lines]) + " \n")
    return folder


@pytest.fixture(scope="module")
def ours(text: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, np.ndarray]]:
    """scaletrain's own one-process run at 8 windows a batch: its summary and final weights."""
    out = tmp_path_factory.mktemp("engines-gpt") / "scaletrain"
    summary = scaletrain.train(
        "gpt", out=out, batch_size=8, options=OPTIONS, data_dir=text, progress="off", tensorboard=False, **SETTINGS
    )
    import torch

    return summary, {name: value.numpy() for name, value in torch.load(out / "model.pt", weights_only=True).items()}


def gpt(engine: str, mode: str, workers: int, batch: int, text: Path, **changes: object) -> EngineRun:
    servers = 1 if engine == "mxnet" and mode != "local" else 0
    fields = dict(
        framework=engine, workload="gpt", mode=mode, workers=workers, servers=servers, batch_size=batch,
        lr=SETTINGS["lr"], momentum=0.0, weight_decay=0.0, epochs=None, steps=SETTINGS["steps"],
        warmup_steps=SETTINGS["warmup_steps"], threads=1, seed=SETTINGS["seed"], data_dir=text,
        clip_norm=SETTINGS["clip_norm"], options=OPTIONS, lr_warmup=SETTINGS["lr_warmup"],
    )  # fmt: skip
    return EngineRun(**{**fields, **changes})


def weights(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "engine" / "final.npz") as saved:
        return dict(saved)


def assert_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    """Every weight within the module docstring's tolerances."""
    assert sorted(got) == sorted(expected)
    for name in expected:
        have, want = got[name], expected[name]
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_one_process_and_two_synchronous_workers_follow_scaletrains_own_run(
    engine: str, text: Path, ours: tuple[dict, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    summary, expected = ours
    one = run_engine(gpt(engine, "local", 1, 8, text), tmp_path / "one")
    assert (one["steps"], one["metric"], one["clip_norm"]) == (10, "test_perplexity", 0.5)
    assert one["parameters"] == summary["parameters"] == 1_024 + 128 + 3_232 + 32  # embedding, positions, block, norm
    assert one["steps_per_epoch"] == summary["steps_per_epoch"]
    recipe = ("optimizer", "lr_schedule", "lr_warmup")
    assert [one[key] for key in recipe] == [summary[key] for key in recipe] == ["AdamW", "cosine", 2]
    start = dict(np.load(tmp_path / "one" / "engine" / "init.npz"))
    assert max(np.abs(expected[name] - start[name]).max() for name in start) > 1e-2  # it trained
    assert_close(weights(tmp_path / "one"), expected)
    assert one["test_perplexity"] == pytest.approx(summary["test_perplexity"], rel=1e-4)
    assert one["test_perplexity"] < 64  # below the vocabulary's size
    worker = one["per_worker"][0]
    assert worker["last_step_loss"] < worker["first_step_loss"]

    two = run_engine(gpt(engine, "sync", 2, 4, text), tmp_path / "two")
    assert (two["mode"], two["workers"], two["worker_steps"], len(two["per_worker"])) == ("sync", 2, [10, 10], 2)
    assert_close(weights(tmp_path / "two"), weights(tmp_path / "one"))
    assert two["test_perplexity"] == pytest.approx(one["test_perplexity"], rel=1e-4)


def test_the_programs_model_has_as_many_weights_as_scaletrains_gpt() -> None:
    """The programs' shapes (``gpt_common.weight_shapes``) against scaletrain's model, at its defaults and others."""
    from scaletrain.engines.programs import gpt_common

    for options in ({}, {"layers": "2", "width": "64", "context": "32", "vocab_size": "500"}):
        workload = create_workload("gpt", options)
        model = {name: getattr(workload.options, name) for name in ("vocab_size", "width", "context", "layers")}
        count = sum(math.prod(shape) for shape in gpt_common.weight_shapes(model))
        assert count == count_parameters(workload.build_model()), options
    assert count_parameters(create_workload("gpt").build_model()) == 1_480_192


def test_asynchronous_mxnet_workers_train_with_dropout(text: Path, tmp_path: Path) -> None:
    if installed(ENGINES["mxnet"]) is None:
        pytest.skip("the mxnet engine is not installed: scaletrain engines install mxnet (CI installs it)")
    options = {**OPTIONS, "dropout": "0.2"}
    summary = run_engine(gpt("mxnet", "async", 2, 8, text, steps=None, epochs=1, options=options), tmp_path / "run")
    epoch = summary["steps_per_epoch"]
    assert summary["worker_steps"] == [epoch // 2, epoch - epoch // 2]  # each worker a chunk of the windows
    assert math.isfinite(summary["test_perplexity"]) and summary["test_perplexity"] < 64


def test_tensorflow_trains_with_dropout_and_refuses_an_asynchronous_gpt_in_one_line(text: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_run(gpt("tensorflow", "async", 2, 8, text))
    assert str(caught.value) == "the tensorflow engine trains gpt in local and sync mode, not async"
    if installed(ENGINES["tensorflow"]) is None:
        pytest.skip("the tensorflow engine is not installed: scaletrain engines install tensorflow (CI installs it)")
    summary = run_engine(
        gpt("tensorflow", "local", 1, 8, text, options={**OPTIONS, "dropout": "0.2"}), tmp_path / "run"
    )
    assert math.isfinite(summary["test_perplexity"]) and summary["test_perplexity"] < 64
    assert json.loads((tmp_path / "run" / "engine" / "quality.json").read_text())["parameters"] == 4_416


def test_a_gpt_sweep_follows_its_options_and_leaves_out_tensorflows_async() -> None:
    config = SweepConfig(
        "gpt", Path("out"), workers=(1, 2), frameworks=("tensorflow", "mxnet"),
        strategies=("allreduce-join", "ps-central-async"), options={"train_split": "valid", "width": "64"},
    )  # fmt: skip
    runs, notes = plan_runs(config)
    planned = {(run.framework, run.label, run.workers) for run in runs}
    assert planned == {
        *(("tensorflow", "allreduce-join", n) for n in (1, 2)),
        *(("mxnet", label, n) for label in ("allreduce-join", "ps-central-async") for n in (1, 2)),
    }
    assert notes == ["tensorflow left out ps-central-async: it trains gpt in local and sync mode only"]
    with pytest.raises(ConfigError, match="^-o: it sets how scaletrain trains, and mxnet would not follow"):
        SweepConfig("gpt", Path("out"), frameworks=("mxnet",), options={"num_steps": "5"})
