"""Speedup arithmetic, grouping, the report's reading, and the results files."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.errors import ConfigError
from scaletrain.measure.report import best_per_worker_count, scaling_limits
from scaletrain.measure.results import COLUMNS, add_speedups, group_rows, read_results, write_results
from scaletrain.measure.sweep import SweepConfig, parse_strategy, plan_runs


def row(strategy: str, workers: int, bps: float, batch: int = 32, status: str = "ok") -> dict:
    return {"strategy": strategy, "workers": workers, "batch_size": batch, "batches_per_second": bps, "status": status}


def test_speedup_is_against_the_median_one_worker_run_of_the_same_strategy_and_batch() -> None:
    rows = add_speedups(
        [
            row("a", 1, 10.0),
            row("a", 1, 14.0),
            row("a", 1, 12.0),
            row("a", 4, 36.0),
            row("b", 4, 50.0),
            row("a", 4, 36.0, batch=64),
        ]
    )
    assert rows[3]["speedup"] == pytest.approx(3.0) and rows[3]["efficiency"] == pytest.approx(0.75)
    assert rows[4]["speedup"] is None  # no one-worker run of b
    assert rows[5]["speedup"] is None  # nor of a at batch 64


def test_failed_rows_are_ignored_by_baselines_and_groups() -> None:
    rows = add_speedups([row("a", 1, 10.0), row("a", 1, 0.0, status="failed"), row("a", 2, 15.0)])
    assert rows[2]["speedup"] == pytest.approx(1.5)
    assert [len(group.rows) for group in group_rows(rows)] == [1, 1]


def test_reading_best_and_where_scaling_stops() -> None:
    groups = group_rows(
        [
            row("a", 1, 10.0),
            row("a", 2, 19.0),
            row("a", 4, 19.5),
            row("b", 1, 12.0),
            row("b", 2, 13.0),
            row("b", 4, 30.0),
        ]
    )
    best = best_per_worker_count(groups)
    assert {n: g.strategy for n, g in best.items()} == {1: "b", 2: "a", 4: "b"}
    limits = scaling_limits(groups)
    assert limits["a b32"] == (2, False)  # 19 → 19.5 is under 5 %
    assert limits["b b32"] == (4, True)  # +8 %, then +130 %: still growing at the largest count


def test_results_files_round_trip(tmp_path: Path) -> None:
    rows = add_speedups([row("a", 1, 10.0), row("a", 2, 15.0)])
    write_results(rows, tmp_path)
    header = (tmp_path / "results.csv").read_text().splitlines()[0].split(",")
    assert tuple(header) == COLUMNS
    for source in (tmp_path, tmp_path / "results.csv"):
        back = read_results(source)
        assert [r["speedup"] for r in back] == pytest.approx([1.0, 1.5])
    with pytest.raises(ConfigError, match="no results"):
        read_results(tmp_path / "missing")


def test_strategy_specs() -> None:
    assert parse_strategy("allreduce-split") == ("allreduce", "central", "split")
    assert parse_strategy("PS-Central-Async") == ("ps", "central", "async")
    for bad in ("allreduce-async", "ps-ring-join", "mpi"):
        with pytest.raises(ConfigError, match="strategy spec"):
            parse_strategy(bad)


def test_plan_caps_workers_and_interleaves_repeats(tmp_path: Path) -> None:
    config = SweepConfig(
        "lenet", tmp_path, workers=(1, 2, 5), strategies=("local", "allreduce-join"), repeats=2, max_workers=2
    )
    runs, notes = plan_runs(config)
    assert {run.workers for run in runs} == {1, 2}
    assert [run.repeat for run in runs] == [0, 0, 0, 1, 1, 1]  # all configurations, then again
    assert any("5 left out" in note for note in notes) and any("local runs only at 1 worker" in n for n in notes)


def test_a_single_worker_count_says_nothing_about_scaling() -> None:
    assert scaling_limits(group_rows([row("local", 1, 10.0), row("a", 1, 10.0), row("a", 2, 19.0)])) == {
        "a b32": (2, True)
    }
