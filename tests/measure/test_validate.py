"""Validation: the comparison arithmetic, and one tiny real run end to end."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path

import pytest

from scaletrain.errors import ConfigError
from scaletrain.estimate.intervals import speedup_range
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.measure.cases import CASES, Case, run_cases
from scaletrain.measure.ranking import coverage
from scaletrain.measure.validate import ValidationConfig, compare, mean_errors, run_validation
from scaletrain.measure.validation_report import markdown
from scaletrain.measure.validation_rows import validated

PROFILE = Profile("lenet", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(10**6,))


def rows(label, workers, rates):
    return [{"status": "ok", "strategy": label, "workers": workers, "batches_per_second": r} for r in rates]


def test_measured_speedup_is_against_the_median_local_run():
    results = [
        *rows("local", 1, [10.0, 9.0, 11.0]),
        *rows("allreduce-join", 2, [18.0, 19.0, 30.0]),
        {"status": "failed", "strategy": "allreduce-join", "workers": 2},
    ]
    table = compare(PROFILE, results, steps=20, cores=None, network="loopback")
    assert len(table) == 1
    row = table[0]
    assert row["runs"] == 3
    assert row["measured_speedup"] == pytest.approx(19.0 / 10.0)
    for model in ("thesis", "refined"):
        predicted = predicted_speedup(model, PROFILE, Configuration.parse("allreduce-join"), 2, batches=40)
        assert row[f"{model}_speedup"] == pytest.approx(predicted)
        assert row[f"{model}_error_percent"] == pytest.approx(abs(predicted - 1.9) / 1.9 * 100)
    assert mean_errors(table)["thesis"] == pytest.approx(table[0]["thesis_error_percent"])


def test_a_step_s_parts_are_set_beside_the_refined_model_s():
    split = {"compute_seconds_per_step": 0.12, "wait_seconds_per_step": 0.02, "communication_seconds_per_step": 0.05}
    results = [
        *rows("local", 1, [10.0]),
        *({**row, **split, "compute_seconds_per_step": compute}
          for row, compute in zip(rows("allreduce-join", 2, [18.0, 19.0, 17.0]), (0.12, 0.14, 0.10), strict=True)),
        *rows("ps-central-async", 2, [15.0]),
    ]  # fmt: skip
    table = {row["strategy"]: row for row in compare(PROFILE, results, steps=20, cores=2, network="loopback")}
    synchronous = table["allreduce-join"]
    assert synchronous["measured_compute_seconds"] == pytest.approx(0.12)  # the median of three runs
    assert synchronous["measured_exchange_seconds"] == pytest.approx(0.05)
    # Predicted: t_grad under the contention of 2 processes on 2 cores (none measured: ×1), no straggler
    # samples (no wait), and the ring all-reduce of 1 MB at the profile's 100 MB/s: 0.01 s.
    assert synchronous["refined_compute_seconds"] == pytest.approx(0.1)
    assert synchronous["refined_wait_seconds"] == pytest.approx(0.0)
    assert synchronous["refined_exchange_seconds"] == pytest.approx(0.01)
    # an asynchronous worker's cycle is split too (its run reported none here): the gradient, and the push, update
    # and reply as if alone (1 MB each way at 100 MB/s, no latency or update measured), its queueing as the wait
    asynchronous = table["ps-central-async"]
    assert asynchronous["measured_compute_seconds"] is None
    assert asynchronous["refined_compute_seconds"] == pytest.approx(0.1)
    assert asynchronous["refined_exchange_seconds"] == pytest.approx(2 * 0.01)
    assert 0 < asynchronous["refined_wait_seconds"] < asynchronous["refined_exchange_seconds"]


def test_runs_the_bench_flagged_are_named_beside_the_speedups_that_rest_on_them():
    far = "32 % above the other repeat"
    results = [
        *rows("local", 1, [22.0]), {**rows("local", 1, [29.0])[0], "repeat": 1, "flag": far},
        *rows("allreduce-join", 2, [14.4, 15.1]), *rows("ps-central-async", 2, [8.2]),
    ]  # fmt: skip
    table = {row["strategy"]: row for row in compare(PROFILE, results, steps=20, cores=2, network="loopback")}
    # the reference's flag stands beside every row measured against it
    assert table["allreduce-join"]["flagged_runs"] == table["ps-central-async"]["flagged_runs"] == f"local r1: {far}"
    # an asynchronous run trained N × the steps (bench: each worker the steps of a synchronous one)
    thesis = predicted_speedup("thesis", PROFILE, Configuration.parse("ps-central-async"), 2, batches=40, cores=2)
    assert table["ps-central-async"]["thesis_speedup"] == pytest.approx(thesis)
    report = markdown(PROFILE, list(table.values()), mean_errors(list(table.values())), {}, 0.05)
    assert f"Runs the bench flagged (the measured speedups rest on them): local r1: {far}." in report
    # a bench flag with two reasons stays whole, and each run is named once in the table's order
    both = f"{far}; 32 % above the other one-worker run at batch 16"
    results[1] = {**results[1], "flag": both}
    results[3] = {**results[3], "repeat": 0, "flag": "31 % below the other repeat"}
    flagged = compare(PROFILE, results, steps=20, cores=2, network="loopback")
    report = markdown(PROFILE, flagged, mean_errors(flagged), {}, 0.05)
    assert f"rest on them): allreduce-join r0: 31 % below the other repeat · local r1: {both}." in report
    unflagged = compare(PROFILE, [*rows("local", 1, [22.0]), *rows("allreduce-join", 2, [14.4])], steps=20, cores=2,
                        network="loopback")  # fmt: skip
    assert unflagged[0]["flagged_runs"] == ""
    assert "flagged" not in markdown(PROFILE, unflagged, mean_errors(unflagged), {}, 0.05)


def test_no_local_run_means_no_reference():
    with pytest.raises(ConfigError, match="no successful local run"):
        compare(PROFILE, rows("allreduce-join", 2, [5.0]), steps=10, cores=None, network="loopback")


def test_validation_config_refuses_local_and_too_few_steps(tmp_path):
    with pytest.raises(ConfigError, match="reference"):
        ValidationConfig("lenet", tmp_path, strategies=("local",))
    with pytest.raises(ConfigError, match="--steps"):
        ValidationConfig("lenet", tmp_path, steps=5, warmup_steps=5)


def test_a_batch_the_workers_cannot_split_is_refused_before_profiling_and_before_any_case_runs(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="a batch of 25 cannot be split over 2 workers .*pick a multiple"):
        ValidationConfig("lenet", tmp_path, batch_size=25, workers=(1, 2))
    with pytest.raises(ConfigError, match="a batch of 20 cannot be split over 3 workers"):  # the LSTM's default batch
        ValidationConfig("ptb-lstm", tmp_path, workers=(1, 2, 3))
    ValidationConfig("lenet", tmp_path, batch_size=25, workers=(1,))  # one worker splits nothing
    # a selection of cases whose last cannot be split: refused before the first one's profile
    bad = Case("bad", "lenet", False, "a batch 2 workers cannot split", batch_size=25, workers=(1, 2))
    monkeypatch.setitem(CASES, "bad", bad)
    with pytest.raises(ConfigError, match="cannot be split"):
        run_cases("lenet-loopback,bad", tmp_path)
    assert not list(tmp_path.iterdir())


def test_validation_refuses_a_wire_one_of_its_strategies_cannot_carry_before_profiling(tmp_path):
    with pytest.raises(ConfigError, match="--wire powersgd needs all-reduce .* or --wire topk with a parameter server"):
        ValidationConfig("lenet", tmp_path, strategies=("allreduce-join", "ps-central-join"), wire="powersgd")
    with pytest.raises(ConfigError, match="ratio"):
        ValidationConfig("lenet", tmp_path, wire="topk", wire_options={"ratio": "2"})
    assert not tmp_path.joinpath("profile.json").exists()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tiny_validation_end_to_end(tiny_fmnist, tmp_path):
    """Compressed (top-k 10 %): the profile times the codec, every run trains with it, the rows say so.
    The float32 path is the same code with the wire left out (its profile: tests/measure/test_profile.py)."""
    config = ValidationConfig(
        "lenet", tmp_path / "val", workers=(2,), strategies=("allreduce-join", "ps-central-async"),
        batch_size=32, steps=8, warmup_steps=2, repeats=1, data_dir=tiny_fmnist, launches=1,
        wire="topk", wire_options={"ratio": "0.1"},
    )  # fmt: skip
    result = run_validation(config)
    out = tmp_path / "val"
    table = list(csv.DictReader((out / "validation.csv").open()))
    assert {(r["strategy"], r["workers"]) for r in table} == {("allreduce-join", "2"), ("ps-central-async", "2")}
    # The measured speedups are the bench's own rows divided by its local run, which ran alone at one worker.
    bench = list(csv.DictReader((out / "bench" / "results.csv").open()))
    assert {r["strategy"] for r in bench if r["workers"] == "1"} == {"local"}
    local = statistics.median(float(r["batches_per_second"]) for r in bench if r["strategy"] == "local")
    for row in table:
        rate = [float(r["batches_per_second"]) for r in bench
                if r["strategy"] == row["strategy"] and r["workers"] == row["workers"]]  # fmt: skip
        assert float(row["measured_speedup"]) == pytest.approx(rate[0] / local)
    assert set(result["mean_absolute_percentage_error"]) == {"thesis", "refined"}
    assert (out / "validation.png").read_bytes()[:4] == b"\x89PNG"
    assert "Mean absolute percentage error" in (out / "validation.md").read_text()
    assert "| allreduce-join | 2 |" in (out / "validation.md").read_text().split("A step's parts")[1]
    profile = Profile.load(out / "profile.json")
    assert profile.batch_size == 32 and (profile.wire, profile.wire_options) == ("topk", {"ratio": "0.1"})
    assert set(profile.codec_seconds) == {"allreduce", "compress", "decompress"}
    assert {row["wire"] for row in table} == {"topk ratio=0.1"}
    for row in bench:
        summary = json.loads((Path(row["run_dir"]) / "summary.json").read_text())
        assert (summary["wire"], summary["wire_options"]) == ("topk", {"ratio": "0.1"}), row["strategy"]
    assert "wire topk ratio=0.1" in (out / "validation.md").read_text().splitlines()[0]


#: PROFILE with samples: two launches of t_grad, five round trips, and the machine that measured them
SAMPLED = Profile(
    "lenet", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(10**6,),
    samples={"t_grad": [0.095] * 5 + [0.105] * 5, "launches": 2, "round_trip": [0.018, 0.019, 0.02, 0.021, 0.022]},
    machine={"cpu_model": "Made-up CPU 9000", "isa": "AVX512", "cores": 64, "torch_version": "2.13.0+cpu"},
)  # fmt: skip


def test_each_row_holds_the_refined_range_and_whether_the_measured_speedup_is_inside():
    results = [*rows("local", 1, [10.0]), *rows("allreduce-join", 2, [17.0]), *rows("ps-sharded-join", 2, [5.0])]
    table = {row["strategy"]: row for row in compare(SAMPLED, results, steps=20, cores=None, network="loopback")}
    for label, row in table.items():
        low, point, high = speedup_range(SAMPLED, validated(label), 2, batches=40)
        assert (row["refined_speedup_low"], row["refined_speedup"], row["refined_speedup_high"]) == pytest.approx(
            (low, point, high)
        )
        assert row["machine"] == "Made-up CPU 9000 (AVX512), 64 cores, torch 2.13.0+cpu"
    # measured 1.7 against a range around 1.78 (about 1.52–2.07): inside; 0.5 is far below the sharded one's
    assert table["allreduce-join"]["refined_inside"] is True and table["ps-sharded-join"]["refined_inside"] is False
    held = coverage(list(table.values()))
    assert (held["inside"], held["ranged"], held["coverage"]) == (1, 2, 0.5)
    report = markdown(SAMPLED, list(table.values()), mean_errors(list(table.values())), {}, 0.05)
    assert "Machine: Made-up CPU 9000 (AVX512), 64 cores, torch 2.13.0+cpu." in report
    assert "Refined model's range (nominal 90 %): 1 of 2 measured speedups inside (coverage 50 %)" in report
    row = table["allreduce-join"]
    assert f"| {row['refined_speedup_low']:.3f}–{row['refined_speedup_high']:.3f} | yes |" in report
    # a profile without samples: no range, and the report says so
    plain = compare(PROFILE, results, steps=20, cores=None, network="loopback")
    assert all(row["refined_inside"] is None and row["machine"] == "machine not recorded" for row in plain)
    report = markdown(PROFILE, plain, mean_errors(plain), {}, 0.05)
    assert "Machine: machine not recorded." in report and "range: none (the profile measured no spread)" in report


def test_coverage_by_hand_on_planted_rows():
    def row(low, point, high, measured):
        return {"refined_speedup_low": low, "refined_speedup": point, "refined_speedup_high": high,
                "measured_speedup": measured, "refined_inside": low <= measured <= high}  # fmt: skip

    planted = [row(0.9, 1.0, 1.1, 1.05), row(1.8, 2.0, 2.4, 1.7), row(0.45, 0.5, 0.55, 0.5), row(1.0, 1.0, 1.0, 1.0)]
    planted.append({"refined_speedup": 1.3, "refined_inside": None})  # no range: not counted
    held = coverage(planted)
    assert (held["inside"], held["ranged"], held["coverage"]) == (3, 4, 0.75)
    # widths over the point: 20 %, 30 %, 20 %, 0 %
    assert held["mean_width_percent"] == pytest.approx((20 + 30 + 20 + 0) / 4)
    # as read back from validation.csv: strings
    as_read = [{key: str(value) for key, value in entry.items()} for entry in planted[:2]]
    assert coverage(as_read)["inside"] == 1 and coverage(as_read)["mean_width_percent"] == pytest.approx(25)
    assert coverage([])["coverage"] is None
