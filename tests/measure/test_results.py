"""Speedup arithmetic (own and common reference), outlier flags, noise, the report's reading, and the results files."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.errors import ConfigError
from scaletrain.measure.plots import plot_all
from scaletrain.measure.report import Noise, rank_configurations, reading, scaling_limits, text_table
from scaletrain.measure.results import (
    COLUMNS,
    add_speedups,
    flag_outliers,
    group_rows,
    read_results,
    write_results,
)
from scaletrain.measure.sweep import SweepConfig, _settings, parse_strategy, plan_runs


def row(strategy: str, workers: int, bps: float, batch: int = 32, status: str = "ok", repeat: int = 0) -> dict:
    kind, _, rest = strategy.partition("-")  # a bench spec, e.g. ps-central-join, or a bare name
    return {
        "strategy": strategy,
        "strategy_kind": kind,
        "server": rest.partition("-")[0] if kind == "ps" else "",
        "workers": workers,
        "batch_size": batch,
        "batches_per_second": bps,
        "status": status,
        "repeat": repeat,
    }


def annotated(rows: list[dict]) -> list[dict]:
    return flag_outliers(add_speedups(rows))


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


def test_ranking_and_where_scaling_stops() -> None:
    groups = group_rows(
        [
            row("a", 1, 10.5),
            row("a", 2, 19.0),
            row("a", 4, 19.5),
            row("b", 1, 12.0),
            row("b", 2, 13.0),
            row("b", 4, 30.0),
        ]
    )
    ranked = rank_configurations(groups, Noise(0.15, "stated"))
    leaders = {key: [g.strategy for g in tied] for key, (tied, _) in ranked.items()}
    assert leaders == {(1, 32): ["b", "a"], (2, 32): ["a"], (4, 32): ["b"]}  # 12 vs 10.5 is within 15 %
    assert [g.strategy for g in ranked[(2, 32)][1]] == ["b"]
    assert {key: [g.strategy for g in tied] for key, (tied, _) in rank_configurations(groups, Noise(0.1, "")).items()}[
        (1, 32)
    ] == ["b"]  # 14 % apart is outside a 10 % noise
    limits = scaling_limits(groups)
    assert limits["a b32"] == (2, False)  # 19 → 19.5 is under 5 %
    assert limits["b b32"] == (4, True)  # +8 %, then +130 %: still growing at the largest count
    assert scaling_limits(groups, min_gain=0.10)["b b32"] == (1, False)  # +8 % is inside a 10 % noise


def test_common_speedup_is_against_the_median_of_every_one_worker_run_of_the_batch() -> None:
    rows = add_speedups(
        [
            *(row("a", 1, 15.4), row("b", 1, 21.7), row("c", 1, 25.0), row("d", 1, 29.0), row("a", 2, 40.0)),
            *(row("a", 1, 100.0, batch=64), row("a", 2, 150.0, batch=64)),
        ]
    )
    reference = (21.7 + 25.0) / 2
    assert all(r["reference_batches_per_second"] == pytest.approx(reference) for r in rows[:5])
    assert rows[4]["speedup_common"] == pytest.approx(40.0 / reference)
    assert rows[4]["efficiency_common"] == pytest.approx(40.0 / reference / 2)
    assert rows[4]["speedup"] == pytest.approx(40.0 / 15.4)  # its own slow one-worker run inflates this one
    assert rows[0]["speedup_common"] == pytest.approx(15.4 / reference)
    assert rows[6]["speedup_common"] == pytest.approx(1.5)  # batch 64 has its own reference


def test_a_run_far_from_its_repeats_is_flagged_and_one_within_them_is_not() -> None:
    rows = annotated([row("a", 2, 20.0), row("a", 2, 21.0, repeat=1), row("a", 2, 14.0, repeat=2)])
    # median 20: 14 is 30 % below (flagged), 21 is 5 % above
    assert [r["flag"] != "" for r in rows] == [False, False, True]
    assert rows[2]["deviation"] == pytest.approx(14.0 / 20.0 - 1)
    assert "30 % below the median of the 3 repeats" in rows[2]["flag"]
    # two repeats: each is compared with the other, not with their mean (which would halve the distance)
    two = annotated([row("a", 2, 24.4), row("a", 2, 40.1, repeat=1)])
    assert two[0]["deviation"] == pytest.approx(24.4 / 40.1 - 1) and "below the other repeat" in two[0]["flag"]
    assert "above the other repeat" in two[1]["flag"]
    close = annotated([row("a", 2, 20.0), row("a", 2, 24.0, repeat=1)])  # 20 % apart
    assert [r["flag"] for r in close] == ["", ""]
    assert annotated([row("a", 2, 20.0)])[0]["deviation"] is None  # a single run has no repeats to differ from


def test_a_slow_first_baseline_is_flagged_against_the_other_one_worker_runs() -> None:
    rows = annotated([row("a", 1, 15.4), row("b", 1, 21.7), row("c", 1, 25.0), row("d", 1, 29.0), row("a", 2, 30.0)])
    assert [bool(r["flag"]) for r in rows] == [True, False, False, False, False]
    assert "one-worker runs at batch 32" in rows[0]["flag"]


def test_noise_is_measured_from_repeats_or_stated_for_single_runs() -> None:
    repeated = group_rows(
        [row("a", 2, 9.0), row("a", 2, 11.0, repeat=1), row("b", 2, 20.0), row("b", 2, 21.0, repeat=1)]
    )
    assert Noise.of(repeated).level == pytest.approx((0.2 + 1 / 20.5) / 2)
    assert "2 configuration(s) measured more than once" in Noise.of(repeated).source
    assert Noise.of(group_rows([row("a", 2, 10.0), row("a", 2, 10.1, repeat=1)])).level == pytest.approx(0.05)  # floor
    single = Noise.of(group_rows([row("a", 2, 10.0), row("b", 2, 12.0)]))
    assert single.level == pytest.approx(0.15) and "stated tolerance" in single.source


def test_one_worker_runs_that_do_the_same_work_measure_the_noise() -> None:
    # at one worker all-reduce and the sharded server are one process exchanging nothing: their spread is noise
    same = Noise.of(group_rows([row("allreduce-join", 1, 26.3), row("ps-sharded-join", 1, 21.4)]))
    assert same.level == pytest.approx(4.9 / 23.85)
    assert "1 set(s) of one-worker runs that do the same work" in same.source
    # a central server is a second process: not the same work, so no noise is measured from it
    other = Noise.of(group_rows([row("allreduce-join", 1, 26.3), row("ps-central-join", 1, 21.4)]))
    assert other.level == pytest.approx(0.15) and "stated tolerance" in other.source


def test_the_reading_never_ranks_one_worker_runs_that_do_the_same_work() -> None:
    # the quickstart on a fresh clone: one run each; allreduce-join was 23 % faster than ps-sharded-join at one
    # worker although both ran the same single process (the report used to call it "fastest")
    rows = annotated(
        [
            row("allreduce-join", 1, 26.3),
            row("ps-sharded-join", 1, 21.4),
            row("ps-central-async", 1, 19.6),
            row("allreduce-join", 2, 33.5),
            row("ps-sharded-join", 2, 30.8),
            row("ps-central-async", 2, 37.3),
        ]
    )
    lines = reading(rows)
    one = next(line for line in lines if line.startswith("- 1 worker, batch 32"))
    assert one.startswith("- 1 worker, batch 32: not ranked — allreduce-join and ps-sharded-join do the same work")
    assert "21.4–26.3 batches/s differ by noise alone" in one and "fastest" not in one
    assert "ps-central-async 19.6 (-18 % against their median, within noise)" in one  # 19.6 ÷ 23.85 − 1
    assert any(line.startswith("- Noise: ±21 % — ") for line in lines)  # 4.9 ÷ 23.85
    two = next(line for line in lines if line.startswith("- 2 workers, batch 32"))
    assert "indistinguishable within noise (30.8–37.3 batches/s)" in two  # 30.8 is 17 % below 37.3: inside 21 %
    assert any(line.startswith("- One-worker reference at batch 32: 23.9 batches/s, the median of 2") for line in lines)
    assert [row["reference_batches_per_second"] for row in rows] == pytest.approx([23.85] * 6)


def test_the_reading_never_names_a_winner_inside_the_noise() -> None:
    rows = annotated(
        [
            row("ps-central-join", 1, 23.0),
            row("ps-central-async", 1, 24.5),
            row("ps-central-join", 2, 41.0),
            row("ps-central-async", 2, 36.0),
            row("ps-central-split", 2, 30.0),
        ]
    )
    lines = reading(rows)
    one = next(line for line in lines if line.startswith("- 1 worker, batch 32"))
    assert "indistinguishable within noise" in one and "fastest" not in one
    two = next(line for line in lines if line.startswith("- 2 workers, batch 32"))
    # 36 is 12 % below 41: inside the 15 % tolerance; 30 is 27 % below
    assert "fastest" not in two and "ps-central-join and ps-central-async are indistinguishable" in two
    assert "slower: ps-central-split (30.0, -27 %)" in two
    assert any("stated tolerance of 15 %" in line for line in lines)
    # no one-worker run that works alone: the reference is the median of all one-worker runs
    assert any(line.startswith("- One-worker reference at batch 32: 23.8 batches/s") for line in lines)


def test_the_reading_ranks_nothing_that_rests_on_flagged_runs() -> None:
    rows = annotated([row("a", 1, 15.4), row("b", 1, 21.7), row("c", 1, 25.0), row("d", 1, 29.0)])
    rows += [row("a", 2, 30.0), row("d", 2, 31.0)]
    lines = reading(annotated(rows))
    (one,) = [line for line in lines if line.startswith("- 1 worker")]
    assert one.startswith("- 1 worker, batch 32: not ranked — a, b, c and d do the same work")
    assert "fastest" not in one and "15.4–29.0 batches/s" in one
    assert "- 2 workers, batch 32: d and a are indistinguishable within noise (30.0–31.0 batches/s)" in lines
    assert any(line.startswith("- a b32: throughput still grows") and "rests on flagged runs" in line for line in lines)
    assert any(line.startswith("- d b32:") and "flagged" not in line for line in lines)
    assert any("1 run(s) flagged" in line for line in lines)
    # three repeats: the median is not moved far by one flagged run, so the ranking stands
    repeated = annotated(
        [row("a", 2, 10.0), row("a", 2, 10.2, repeat=1), row("a", 2, 7.0, repeat=2), row("b", 2, 20.0)]
    )
    assert repeated[2]["flag"] and reading(repeated)[1].startswith("- 2 workers, batch 32: fastest is **b** at 20.0")


def test_text_table_lists_both_speedups_and_flags() -> None:
    rows = annotated([row("a", 1, 10.0), row("a", 1, 20.0, repeat=1), row("b", 1, 12.0), row("a", 2, 24.0)])
    lines = text_table(rows).splitlines()
    header = ["strategy", "batch", "workers", "batches/s", "[min–max]", "speedup", "common", "speedup", "flagged"]
    assert lines[0].split() == header
    a2 = next(line.split() for line in lines if line.startswith("a ") and line.split()[2] == "2")
    assert a2[3:6] == ["24.0", f"{24 / 15:.2f}", f"{24 / 12:.2f}"]  # own median 15; common median of 10, 12, 20
    a1 = next(line for line in lines if line.startswith("a ") and line.split()[2] == "1")
    assert "15.0 [10.0–20.0]" in a1 and a1.rstrip().endswith("2 of 2")  # 10 and 20 are 100 % apart


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
    assert parse_strategy("allreduce-split") == ("allreduce", "", "split")  # all-reduce has no server
    assert parse_strategy("ps-distributed-none") == ("ps", "sharded", "async")  # the thesis's words
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


def test_a_networked_sweep_runs_its_one_process_runs_without_the_network(tmp_path: Path) -> None:
    # one process has no links to emulate, and a run asked to emulate them is refused (issue 9)
    strategies = ("local", "allreduce-join", "ps-central-join", "ps-sharded-join")
    config = SweepConfig("lenet", tmp_path, workers=(1, 2), strategies=strategies, network="100mbit", max_workers=2)
    runs, _ = plan_runs(config)
    networks = {(run.label, run.workers): _settings(config, run, tmp_path)["network"] for run in runs}
    assert networks == {
        ("local", 1): None,
        ("allreduce-join", 1): None,
        ("allreduce-join", 2): "100mbit",
        ("ps-central-join", 1): "100mbit",  # a worker and its server: one link
        ("ps-central-join", 2): "100mbit",
        ("ps-sharded-join", 1): None,
        ("ps-sharded-join", 2): "100mbit",
    }


def test_pictures_leave_out_series_without_a_figure(tmp_path: Path) -> None:
    # a sweep whose one-worker runs failed has no speedup for its two-worker runs: drawn without them
    rows = annotated([row("a", 2, 20.0), row("a", 1, 0.0, status="failed"), row("b", 1, 10.0), row("b", 2, 18.0)])
    pictures = plot_all({"results": group_rows(rows)}, tmp_path)
    assert {path.name for path in pictures} >= {"throughput.png", "speedup.png"}


def test_a_single_worker_count_says_nothing_about_scaling() -> None:
    assert scaling_limits(group_rows([row("local", 1, 10.0), row("a", 1, 10.0), row("a", 2, 19.0)])) == {
        "a b32": (2, True)
    }
