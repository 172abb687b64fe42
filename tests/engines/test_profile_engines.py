"""``scaletrain profile --framework``: a foreign engine's profile, timed by its own program, predicts its runs;
its bench rows are validated against it beside scaletrain's (short: few repeats, one launch, 20 steps)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from scaletrain.cli import main
from scaletrain.engines.layouts import FOREIGN_STRATEGIES
from scaletrain.errors import ConfigError
from scaletrain.estimate.foreign import ENGINE_SPECS, kvstore_exchange
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.refined import Terms, step_split
from scaletrain.measure.profile import ProfileConfig, run_profile
from scaletrain.measure.sweep import SweepConfig, run_sweep
from scaletrain.measure.validate import compare
from tests.helpers import make_fashion_mnist

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("engines") / "fmnist", train=640, test=64)


def test_an_engine_profile_predicts_its_runs_and_validates_a_bench_row(engine: str, tiny: Path, tmp_path: Path) -> None:
    config = ProfileConfig("lenet", batch_size=16, framework=engine, data_dir=tiny, repeats=3, warmup=2,
                           round_trips=3, launches=1, concurrency=1, download=False)  # fmt: skip
    profile = run_profile(config, out=tmp_path / "profile.json")
    assert profile.framework == engine and profile.t_grad > 0 and profile.t_comm > 0 and profile.t_update > 0
    assert Profile.load(tmp_path / "profile.json") == profile
    assert profile.default_path().name == f"lenet-b16-{engine}.json"
    assert profile.allreduce if engine == "tensorflow" else profile.kvstore  # the engine's own exchange at 2
    sync = Configuration.parse("allreduce-join")
    for model in ("thesis", "refined"):
        assert 0 < predicted_speedup(model, profile, sync, 2, batches=128, cores=2) < 2
    with pytest.raises(ConfigError, match=f"{engine} engine's runs"):
        predicted_speedup("refined", profile, Configuration.parse("ps-central-join"), 2, batches=128)
    sweep = SweepConfig("lenet", tmp_path / "bench", workers=(1, 2), strategies=("allreduce-join",),
                        batch_sizes=(16,), steps=20, warmup_steps=3, data_dir=tiny, frameworks=(engine,),
                        warmup_run=False)  # fmt: skip
    rows, _ = run_sweep(sweep)
    table = {row["workers"]: row for row in compare({engine: profile}, rows, steps=20, cores=2, network="loopback")}
    assert sorted(table) == [1, 2]  # one worker is the engine's one process, its own reference
    row = table[2]
    assert (row["framework"], row["strategy"], row["workers"]) == (engine, "allreduce-join", 2)
    assert row["measured_speedup"] > 0 and row["refined_speedup"] > 0 and row["thesis_speedup"] > 0


def test_each_engine_mode_is_predicted_by_the_terms_of_what_it_does() -> None:
    assert all(set(runs) == set(FOREIGN_STRATEGIES) - {"local"} for runs in ENGINE_SPECS.values())
    # MXNet's dist_sync: LeNet's keys 0, 2, 4, 6 (nearly all bytes) on server 0 of 2: its link carries 2 × its share
    tensors = (2000, 80, 100_000, 200, 1_600_000, 2000, 20_000, 40)
    profile = Profile("lenet", 16, t_grad=0.01, t_comm=0.001, latency=0.0, bandwidth=1e9, t_update=0.0,
                      weight_bytes=sum(tensors), tensor_bytes=tensors, framework="mxnet")  # fmt: skip
    [one, two] = kvstore_exchange(Terms(profile, None), np.array([1, 2])).tolist()
    assert one == 0.0 and two == pytest.approx(2 * 2 * 1_722_000 / 1e9)  # out and back, 2 × server 0's bytes
    calibrated = dataclasses.replace(profile, kvstore={2: 0.01})
    assert kvstore_exchange(Terms(calibrated, None), np.array([2])).tolist() == pytest.approx([0.01])
    # the refined model's dist_sync step takes that term, not the ring all-reduce's
    assert step_split(calibrated, strategy="allreduce", sync="join", workers=2)["exchange"] == pytest.approx(0.01)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["profile", "lenet", "--framework", "nosuch"], "--framework takes scaletrain, tensorflow, mxnet"),
        (["profile", "ptb-lstm", "--framework", "tensorflow"], "measures lenet, not ptb-lstm"),
        (["profile", "lenet", "--framework", "tensorflow,mxnet"], "--framework takes one name here"),
        (["profile", "lenet", "--framework", "mxnet", "--wire", "bf16"], "does not take --wire"),
    ],
)
def test_what_an_engine_profile_does_not_measure_is_one_line(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    error = capsys.readouterr().err.strip()
    assert said in error and "\n" not in error


def test_a_foreign_profile_refuses_a_strategy_its_engine_does_not_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = Profile("lenet", 16, t_grad=0.01, t_comm=0.001, framework="tensorflow").save(tmp_path / "p.json")
    assert main(["estimate", "--profile", str(path), "--strategy", "allreduce-join", "--workers", "2"]) == 0
    assert float(capsys.readouterr().out) > 1
    assert main(["estimate", "--profile", str(path), "--strategy", "ps-sharded-join", "--workers", "2"]) == 2
    error = capsys.readouterr().err.strip()
    assert "tensorflow engine's runs" in error and "\n" not in error
