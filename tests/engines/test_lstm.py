"""The foreign engines' ``ptb-lstm``, for real: the LSTM language model trained by TensorFlow and MXNet on a tiny
text in Mikolov's format (16 units, a 64-word vocabulary, windows of 5 words, 10 steps, lr 1.0, clipped to 0.5 so
that the clipping acts at every step), compared with scaletrain's own run of the same settings.

Tolerances (``atol 1e-5 + rtol 1e-4``, the equivalence tests' elsewhere): after 10 steps an engine's one process
holds scaletrain's weights within them (measured: TensorFlow 1.2e-7, MXNet 4.8e-7 at most), and 2 synchronous
workers at 4 rows each hold the weights of the engine's one process at 8 rows (measured: 1.2e-7 and 6e-8; the
gradients are summed in another order). The test perplexity agrees within ``rtol 1e-4`` (measured: 1e-7). The
gradient's norm is 0.85-0.98 at these steps: every step is clipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import scaletrain
from scaletrain.engines.launch import check_run, run_engine
from scaletrain.engines.prepare import EngineRun
from scaletrain.errors import ConfigError
from scaletrain.measure.sweep import SweepConfig, plan_runs

pytestmark = pytest.mark.multiprocess

OPTIONS = {"hidden_size": "16", "vocab_size": "64", "num_steps": "5"}
SETTINGS = {"steps": 10, "lr": 1.0, "clip_norm": 0.5, "seed": 3, "threads": 1, "warmup_steps": 2}


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 1,500 words of 40 kinds (and ``<unk>``) in each of ``ptb.{train,valid,test}.txt``."""
    folder = tmp_path_factory.mktemp("engines-lstm") / "ptb"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for split in ("train", "valid", "test"):
        lines = [" ".join(f"w{word}" for word in rng.integers(0, 40, rng.integers(4, 14))) for _ in range(180)]
        (folder / f"ptb.{split}.txt").write_text(" \n".join(["<unk> w1", *lines]) + " \n")
    return folder


@pytest.fixture(scope="module")
def ours(text: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, np.ndarray]]:
    """scaletrain's own one-process run at 8 rows: its summary and final weights."""
    out = tmp_path_factory.mktemp("engines-lstm") / "scaletrain"
    summary = scaletrain.train(
        "ptb-lstm", out=out, batch_size=8, options=OPTIONS, data_dir=text, progress="off", tensorboard=False, **SETTINGS
    )
    import torch

    return summary, {name: value.numpy() for name, value in torch.load(out / "model.pt", weights_only=True).items()}


def lstm(engine: str, mode: str, workers: int, batch: int, text: Path, **changes: object) -> EngineRun:
    servers = 1 if engine == "mxnet" and mode != "local" else 0
    fields = dict(
        framework=engine, workload="ptb-lstm", mode=mode, workers=workers, servers=servers, batch_size=batch,
        lr=SETTINGS["lr"], momentum=0.0, weight_decay=0.0, epochs=None, steps=SETTINGS["steps"],
        warmup_steps=SETTINGS["warmup_steps"], threads=1, seed=SETTINGS["seed"], data_dir=text,
        clip_norm=SETTINGS["clip_norm"], options=OPTIONS,
    )  # fmt: skip
    return EngineRun(**{**fields, **changes})


def weights(out: Path) -> dict[str, np.ndarray]:
    with np.load(out / "engine" / "final.npz") as saved:
        return dict(saved)


def assert_close(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_one_process_and_two_synchronous_workers_follow_scaletrains_own_run(
    engine: str, text: Path, ours: tuple[dict, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    summary, expected = ours
    one = run_engine(lstm(engine, "local", 1, 8, text), tmp_path / "one")
    assert (one["steps"], one["metric"], one["clip_norm"]) == (10, "test_perplexity", 0.5)
    assert one["steps_per_epoch"] == summary["steps_per_epoch"]
    start = dict(np.load(tmp_path / "one" / "engine" / "init.npz"))
    assert max(np.abs(expected[name] - start[name]).max() for name in start) > 1e-2  # it trained
    assert_close(weights(tmp_path / "one"), expected)
    quality = json.loads((tmp_path / "one" / "engine" / "quality.json").read_text())
    assert one["test_perplexity"] == quality["test_perplexity"]
    assert one["test_perplexity"] == pytest.approx(summary["test_perplexity"], rel=1e-4)
    test_words = len(np.load(tmp_path / "one" / "engine" / "tokens.npz")["test"])
    assert (test_words // 10 - 1) % 5  # the evaluation's last window is a shorter one

    two = run_engine(lstm(engine, "sync", 2, 4, text), tmp_path / "two")
    assert (two["mode"], two["workers"], two["worker_steps"], len(two["per_worker"])) == ("sync", 2, [10, 10], 2)
    assert_close(weights(tmp_path / "two"), weights(tmp_path / "one"))
    assert two["test_perplexity"] == pytest.approx(one["test_perplexity"], rel=1e-4)


def test_asynchronous_mxnet_workers_train_their_own_windows(text: Path, tmp_path: Path) -> None:
    from scaletrain.engines.install import installed
    from scaletrain.engines.registry import ENGINES

    if installed(ENGINES["mxnet"]) is None:
        pytest.skip("the mxnet engine is not installed: scaletrain engines install mxnet (CI installs it)")
    summary = run_engine(lstm("mxnet", "async", 2, 8, text, steps=None, epochs=1), tmp_path / "run")
    epoch = summary["steps_per_epoch"]
    assert summary["worker_steps"] == [epoch // 2, epoch - epoch // 2]  # each worker a chunk of the windows
    assert 1.0 < summary["test_perplexity"] < 64.0  # it learnt something of the 41 words


def test_tensorflow_refuses_an_asynchronous_lstm_in_one_line(text: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        check_run(lstm("tensorflow", "async", 2, 8, text))
    assert str(caught.value) == "the tensorflow engine trains ptb-lstm in local and sync mode, not async"


def test_bench_passes_the_options_the_engines_follow_and_refuses_the_others() -> None:
    followed = {"train_split": "valid", "hidden-size": "16"}
    SweepConfig("ptb-lstm", Path("out"), frameworks=("scaletrain", "mxnet"), options=followed)
    with pytest.raises(ConfigError, match="^-o: it sets how scaletrain trains, and mxnet would not follow"):
        SweepConfig("ptb-lstm", Path("out"), frameworks=("scaletrain", "mxnet"), options={"dropout": "0.5"})
    with pytest.raises(ConfigError, match="^-o: it sets how scaletrain trains, and tensorflow would not follow"):
        SweepConfig("lenet", Path("out"), frameworks=("tensorflow",), options={"hidden_size": "16"})


def test_a_sweep_leaves_out_the_asynchronous_lstm_tensorflow_does_not_run() -> None:
    config = SweepConfig(
        "ptb-lstm", Path("out"), workers=(1, 2), frameworks=("tensorflow", "mxnet"),
        strategies=("allreduce-join", "ps-central-async"),
    )  # fmt: skip
    runs, notes = plan_runs(config)
    planned = {(run.framework, run.label, run.workers) for run in runs}
    assert planned == {
        *(("tensorflow", "allreduce-join", n) for n in (1, 2)),
        *(("mxnet", label, n) for label in ("allreduce-join", "ps-central-async") for n in (1, 2)),
    }
    assert notes == ["tensorflow left out ps-central-async: it trains ptb-lstm in local and sync mode only"]
