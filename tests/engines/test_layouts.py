"""Which foreign runs a sweep plans for each scaletrain strategy, and how its rows are told apart."""

from __future__ import annotations

from pathlib import Path

from scaletrain.engines.layouts import engine_run
from scaletrain.measure.results import add_speedups, group_rows
from scaletrain.measure.sweep import SweepConfig, plan_runs


def test_a_foreign_engine_runs_the_strategies_it_has_a_counterpart_for() -> None:
    config = SweepConfig(
        "lenet", Path("out"), workers=(1, 2), frameworks=("scaletrain", "mxnet"),
        strategies=("allreduce-join", "allreduce-split", "ps-central-async"),
    )  # fmt: skip
    runs, notes = plan_runs(config)
    planned = {(run.framework, run.label, run.workers) for run in runs}
    ours = ("allreduce-join", "allreduce-split", "ps-central-async")
    assert planned == {
        *(("scaletrain", label, n) for label in ours for n in (1, 2)),
        *(("mxnet", label, n) for label in ("allreduce-join", "ps-central-async") for n in (1, 2)),
    }
    foreign = "local, allreduce-join, ps-central-async, ps-sharded-async"
    assert notes == [f"mxnet left out allreduce-split: a foreign engine runs {foreign}"]
    folders = {run.folder() for run in runs}
    assert "mxnet-allreduce-join-bdefault-w2-r0" in folders and "allreduce-join-bdefault-w2-r0" in folders


def test_the_foreign_run_takes_the_workloads_defaults_and_the_sweeps_settings() -> None:
    run = engine_run("tensorflow", "lenet", "ps-sharded-async", 4, {"batch_size": None, "steps": 30, "lr": 0.05})
    assert (run.mode, run.workers, run.servers) == ("async", 4, 4)
    assert (run.batch_size, run.lr, run.momentum, run.steps, run.epochs) == (32, 0.05, 0.9, 30, None)
    assert engine_run("mxnet", "lenet", "allreduce-join", 1, {"epochs": 2}).mode == "local"


def test_each_framework_is_its_own_series_with_its_own_one_worker_reference() -> None:
    def row(framework: str, workers: int, rate: float) -> dict:
        return {
            "framework": framework, "strategy": "allreduce-join", "strategy_kind": "allreduce", "server": None,
            "sync": "join", "batch_size": 32, "workers": workers, "batches_per_second": rate, "status": "ok",
        }  # fmt: skip

    rows = [row("scaletrain", 1, 10.0), row("scaletrain", 2, 17.0), row("mxnet", 1, 5.0), row("mxnet", 2, 6.0)]
    rows = add_speedups(rows)
    assert [(r["framework"], r["workers"], r["speedup"]) for r in rows] == [
        ("scaletrain", 1, 1.0), ("scaletrain", 2, 1.7), ("mxnet", 1, 1.0), ("mxnet", 2, 1.2),
    ]  # fmt: skip
    # against the common reference, scaletrain's one process (another framework's does other work), too
    assert [r["speedup_common"] for r in rows] == [1.0, 1.7, 0.5, 0.6]
    assert [g.strategy for g in group_rows(rows)] == ["allreduce-join"] * 2 + ["mxnet allreduce-join"] * 2


def test_the_engines_follow_a_cpu_device_and_refuse_another() -> None:
    """They train on the CPU: a validation's ``device="cpu"`` passes; a GPU is refused in one line."""
    import pytest

    from scaletrain.errors import ConfigError

    both = ("scaletrain", "tensorflow")
    SweepConfig("lenet", Path("out"), workers=(1, 2), frameworks=both, settings={"device": "cpu", "lr": 0.05})
    with pytest.raises(ConfigError, match="^--device: it sets how scaletrain trains, and tensorflow would not follow"):
        SweepConfig("lenet", Path("out"), workers=(1, 2), frameworks=both, settings={"device": "cuda"})
