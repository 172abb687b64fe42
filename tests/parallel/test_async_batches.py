"""``--async-batches`` (issue 31): what is refused before anything starts, what a checkpoint must match, and how
the estimators predict split updates. The runs themselves: test_many_workers.py (every update accounted for, its
share in the summary) and test_async_lstm.py (the LSTM near one process with the defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from scaletrain.api import make_config
from scaletrain.errors import ConfigError
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.measure.sweep import SweepConfig, plan_runs, run_settings
from scaletrain.parallel.preflight import check_before_start
from scaletrain.parallel.strategies import Layout
from scaletrain.parallel.strategies.ps.async_batches import batch_share, update_batch
from scaletrain.train.checkpoint import check_compatible, checkpoint_payload
from scaletrain.train.schedule import Position
from scaletrain.train.state import check_async_split

ASYNC = dict(workers=3, strategy="ps", server="central", sync="async")


def test_a_batch_smaller_than_the_workers_is_refused_with_the_fix(tmp_path: Path) -> None:
    config = make_config("lenet", **{**ASYNC, "workers": 4}, batch_size=2, async_batches="split", out=tmp_path / "run")
    with pytest.raises(ConfigError, match=r"--batch-size 4 or more, fewer workers, or --async-batches share"):
        check_before_start(config, Layout("ps", 4, "central", "async"))
    assert not (tmp_path / "run").exists()  # nothing written
    check_async_split(4, 4)  # one sample each is enough


def test_async_batches_with_synchronous_updates_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--async-batches share .* synchronous \(--sync join\)"):
        make_config("lenet", workers=2, strategy="ps", sync="join", async_batches="share")
    with pytest.raises(ConfigError, match="option async_batches must be one of split, share"):
        make_config("lenet", **ASYNC, async_batches="halves")
    make_config("lenet", workers=2, strategy="ps", sync="join", async_batches="split")  # the default asks nothing


def test_the_update_batch_and_its_share_of_the_rate() -> None:
    split, share = make_config("lenet", **ASYNC), make_config("lenet", **ASYNC, async_batches="share")
    layout = Layout("ps", 3, "central", "async")
    assert (update_batch(split, layout, 20), batch_share(split, layout, 20)) == (6, 0.3)
    assert (update_batch(share, layout, 20), batch_share(share, layout, 20)) == (None, 1.0)
    alone = make_config("lenet", **{**ASYNC, "workers": 1})
    assert batch_share(alone, Layout("ps", 1, "central", "async"), 20) == 1.0  # one worker: local's updates


def test_a_checkpoint_resumes_only_with_the_async_batches_it_was_written_with() -> None:
    class Saved:  # what checkpoint_payload reads of a prepared run
        config = make_config("lenet", **ASYNC, batch_size=30, async_batches="share")
        workload = type("W", (), {"name": "lenet"})()
        technique = None
        strategy_label = "ps-central-async, 3 workers"
        architecture = None  # checkpoint_payload only copies it
        decided_epochs = 0
        first_losses = ()
        async_split = 1  # share: each batch one update
        schedule = type("S", (), {"to_list": lambda self: []})()

    model = nn.Linear(2, 1)
    payload = checkpoint_payload(Saved(), model, torch.optim.SGD(model.parameters(), lr=0.1), Position(), None)
    assert payload["batch_split"] == 1
    label = lambda strategy, server, sync, workers: f"{strategy}-{server}-{sync}, {workers} workers"  # noqa: E731
    split = make_config("lenet", **ASYNC, batch_size=30, async_batches="split")
    refusal = "each batch one update but this run makes it 3 workers' updates"
    with pytest.raises(ConfigError, match=refusal):
        check_compatible(payload, split, Saved.workload, label, 3)
    check_compatible(payload, Saved.config, Saved.workload, label, 1)
    older = {key: value for key, value in payload.items() if key != "batch_split"}  # written before the setting
    with pytest.raises(ConfigError, match=refusal):
        check_compatible(older, split, Saved.workload, label, 3)
    named = {**older, "async_batches": "split"}  # files that named the mode
    check_compatible(named, split, Saved.workload, label, 3)
    with pytest.raises(ConfigError, match="made each batch 3 workers' updates but this run makes it one update"):
        check_compatible(named, Saved.config, Saved.workload, label, 1)


@pytest.mark.parametrize("model", ["thesis", "refined"])
def test_split_updates_exchange_n_times_as_often(model: str) -> None:
    """Compute-bound, split and share scale alike; where the exchange dominates, split's N× exchanges per batch
    cost it, and at one worker both are the one-process run."""
    profile = Profile("toy", 30, t_grad=0.3, t_comm=0.001)
    share = Configuration.parse("ps-sharded-async")
    split = Configuration("ps", "sharded", "async", async_batches="split")
    speed = {c.async_batches: predicted_speedup(model, profile, c, 3, batches=300) for c in (share, split)}
    assert speed["split"] == pytest.approx(speed["share"], rel=0.05)
    slow = Profile("toy", 30, t_grad=0.3, t_comm=0.3)
    speed = {c.async_batches: predicted_speedup(model, slow, c, 3, batches=300) for c in (share, split)}
    assert speed["split"] < 0.8 * speed["share"]
    for c in (share, split):
        assert predicted_speedup(model, slow, c, 1, batches=300) == pytest.approx(
            predicted_speedup(model, slow, share, 1, batches=300), rel=1e-6
        )


def test_beside_foreign_engines_a_sweep_runs_downpours_whole_batches() -> None:
    """TensorFlow's and MXNet's asynchronous runs apply a whole batch per update: scaletrain's runs beside them do
    the same work; alone, a sweep runs training's default."""
    alone = SweepConfig("lenet", Path("out"), strategies=("ps-central-async",), batch_sizes=(64,))
    beside = SweepConfig("lenet", Path("out"), strategies=("ps-central-async",), batch_sizes=(64,),
                         frameworks=("scaletrain", "tensorflow"))  # fmt: skip
    [run] = [run for run in plan_runs(alone)[0] if run.workers > 1]
    assert "async_batches" not in run_settings(alone, run)
    [run] = [run for run in plan_runs(beside)[0] if run.workers > 1 and not run.foreign]
    assert run_settings(beside, run)["async_batches"] == "share"
    with pytest.raises(ConfigError, match="--async-batches: it sets how scaletrain trains"):
        SweepConfig("lenet", Path("out"), strategies=("ps-central-async",), frameworks=("scaletrain", "tensorflow"),
                    settings={"async_batches": "split"})  # fmt: skip
    SweepConfig("lenet", Path("out"), strategies=("ps-central-async",), frameworks=("scaletrain", "tensorflow"),
                settings={"async_batches": "share"})  # what the engines do: taken  # fmt: skip
