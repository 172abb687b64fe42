"""``scripts/device-suite.sh --dry-run``: every part of both visits of the GPU machine's suite runs on this CPU at
tiny sizes, so the suite cannot rot between the machine's visits. Checks what comes back in ``$OUT``: at most
eight files with plain names, the figures JSON with every part and its numbers, and the report. Also: how a
visit's parts share the GPU machine's 16 cores and 450 s, and that issue 50's held-out cases are new ones."""

from __future__ import annotations

import importlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
from tests.helpers import REPO

PARTS = ("machine", "scaling", "gpu-tests", "precision", "gpu-vs-cpu", "prunetrain", "adaptive-batch",
         "mixed-precision", "holdout", "slow-link")  # fmt: skip
SECTIONS = ("## What was run", "## GPU tests", "## Precision on", "## GPU against CPU", "## PruneTrain on the GPU",
            "## Batch adaptation after pruning", "## CPU scaling on", "## Pictures", "## Mixed precision on",
            "## Prediction at scale, held out", "## Slow links with cores to spare")  # fmt: skip
DRY_RUN_LIMIT = 240  # seconds: issue 24's 180 for CI and 60 for issue 50's parts
SLOW_LINK_RUNS = ("one process", "dense all-reduce", "diloco H=2", "powersgd rank 4 overlap", "top-k 1 %")


def benchmark(name: str, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A benchmark module, imported as the suite runs it (its siblings importable)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module(name)


@pytest.mark.slow
@pytest.mark.multiprocess
# Not alone: the dry run took 79–127 s by itself on 2 shared cores (issue 24's parts alone: 49 s); beside two other
# tests it has room under the limit of 240 s and its parts' budgets (30 to 200 s each). The mixed-precision part
# took 65 s alone (34 s of it compiling gpt) and ran out of a 90 s budget beside two other tests in CI (2026-12-06).
# The slow-link part's five runs took 34 s alone and did not all fit its 150 s beside two other tests in CI
# (2026-12-06: top-k was not started); it has 200 s now, within the suite's 230.
def test_the_dry_run_runs_every_part_and_writes_the_figures_and_the_report(tmp_path: Path) -> None:
    out = tmp_path / "out"
    environment = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    began = time.monotonic()
    result = subprocess.run(
        ["bash", str(REPO / "scripts" / "device-suite.sh"), "--dry-run", "--work", str(tmp_path)],
        env=environment, capture_output=True, text=True, timeout=DRY_RUN_LIMIT + 30,
    )  # fmt: skip
    seconds = time.monotonic() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert seconds < DRY_RUN_LIMIT, f"the dry run took {seconds:.0f} s"

    files = sorted(path for path in out.rglob("*") if path.is_file())
    assert len(files) <= 8
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", path.name) and len(path.relative_to(out).parts) <= 2 for path in files)
    assert {"figures.json", "report.md", "gpu-tests.txt", "suite.log"} <= {path.name for path in files}
    assert not list(tmp_path.glob("device-suite-*")), "the scratch folder is removed"

    figures = json.loads((out / "figures.json").read_text())
    assert figures["suite"]["dry_run"] is True
    parts = figures["parts"]
    assert set(parts) == set(PARTS)
    assert {name: entry["status"] for name, entry in parts.items()} == dict.fromkeys(PARTS, "ok")

    tests = parts["gpu-tests"]["result"]
    assert tests["failed"] == [] and len(tests["skipped"]) >= 10  # no CUDA here: every GPU test skips
    precision = parts["precision"]["result"]["batches"]
    assert len(precision) == 2
    for workloads in precision.values():
        for workload in ("resnet20", "resnet32"):
            ratios = workloads[workload]["speedups"]["bf16"]
            assert set(ratios) == {"contiguous", "channels_last"} and all(r > 0 for r in ratios.values())
    timings = parts["gpu-vs-cpu"]["result"]
    assert set(timings["gpu"]) == set(timings["cpu"]) == {"lenet", "resnet20"}
    assert set(parts["prunetrain"]["result"]["runs"]) == {"dense", "prunetrain r=0.9"}
    assert parts["adaptive-batch"]["result"]["runs"]["--batch-budget"]["searches"]
    sweeps = parts["scaling"]["result"]["sweeps"]
    assert set(sweeps) == {"lenet-b32", "ptb-lstm-b4"}
    for name, sweep in sweeps.items():
        ok = {(row["strategy"], row["workers"]) for row in sweep["rows"] if row["status"] == "ok"}
        assert ("local", 1) in ok and any(workers == 2 for _, workers in ok), (name, json.dumps(sweep)[-3000:])
        check_predictions(sweep)
        assert all(row["speedup_common"] > 0 for row in sweep["rows"] if row["status"] == "ok")

    check_mixed_precision(parts["mixed-precision"]["result"])
    check_holdout(parts["holdout"]["result"])
    check_slow_link(parts["slow-link"]["result"])
    assert "loss-curves.png" in {path.name for path in files}

    report = (out / "report.md").read_text()
    for section in SECTIONS:
        assert section in report
    assert "Dry run" in report and "| scaling | ok |" in report and "| slow-link | ok |" in report


def finite_positive(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


def check_predictions(sweep: dict) -> None:
    """Every run but the one-process reference is predicted; its measured speedup is the median rate over the median
    one-process rate, each model's error is its distance from that, and the summary is their mean. How near the
    models come is not asked: a dry run's four timed steps beside CI's other tests measure contention (a CI run
    of 2026-12-07 put the 2-worker LSTM at 35 batches/s, a fifth of its rate alone, and the error at 2295 %)."""
    ok = [row for row in sweep["rows"] if row["status"] == "ok"]
    rates = {}
    for row in ok:
        rates.setdefault((row["strategy"], row["workers"]), []).append(row["batches_per_second"])
    predicted = {(row["strategy"], row["workers"]): row for row in sweep["predictions"]}
    assert set(predicted) == {key for key in rates if key[0] != "local"}, (sorted(predicted), sorted(rates))
    local = statistics.median(rates["local", 1])
    for key, row in predicted.items():
        measured = statistics.median(rates[key]) / local
        assert row["measured_speedup"] == pytest.approx(measured), key
        for model in ("thesis", "refined"):
            assert finite_positive(row[f"{model}_speedup"]), (key, model)
            error = abs(row[f"{model}_speedup"] - measured) / measured * 100
            assert row[f"{model}_error_percent"] == pytest.approx(error), (key, model)
    for model in ("thesis", "refined"):
        errors = [row[f"{model}_error_percent"] for row in sweep["predictions"]]
        assert sweep["errors"][model]["all"] == pytest.approx(statistics.mean(errors)), model


def check_mixed_precision(result: dict) -> None:
    """Every model in fp32 and bf16, eager at the full and half batch; the compiled row; curves; two profiles."""
    assert result["errors"] == [] and result["not_run"] == []
    rows = {(row["workload"], row["precision"], row["compiled"], row["batch_size"]): row for row in result["rows"]}
    for model in result["models"]:
        for precision in ("fp32", "bf16"):
            for batch in (model["batch_size"], model["batch_size"] // 2):
                row = rows[model["workload"], precision, False, batch]
                assert finite_positive(row["step_seconds"]) and finite_positive(row["speedup_over_fp32"])
                assert finite_positive(row["samples_per_second"]) and math.isfinite(row["last_loss"])
            assert all(math.isfinite(loss) for loss in result["curves"][model["workload"]][precision])
        assert len(result["curves"][model["workload"]]["fp32"]) == 4
        assert 0.5 < result["quality"][model["workload"]]["bf16_against_fp32"] < 2
    gpt = rows["gpt", "fp32", True, 4]  # compiled: the step timed, its compilation counted
    assert gpt["speedup_over_fp32"] == 1.0 and finite_positive(gpt["compile_seconds"])
    assert finite_positive(rows["gpt", "bf16", False, 4]["tokens_per_second"])
    assert [(p["workload"], p["precision"]) for p in result["profiles"]] == [("resnet34", "fp32"), ("resnet34", "bf16")]
    for profile in result["profiles"]:
        assert profile["top"] and 0 < profile["matrix_share"] <= 1
        assert abs(sum(row["share"] for row in profile["top"]) - 1) < 0.2  # the top rows hold most of the step
    assert finite_positive(result["verdict"]["best"]["speedup_over_fp32"])


def check_holdout(result: dict) -> None:
    assert result["chosen_on"] == "2026-11-28" and result["held_out"] is False  # the dry run's case is not held out
    (sweep,) = result["sweeps"].values()
    ok = {(row["strategy"], row["workers"]) for row in sweep["rows"] if row["status"] == "ok"}
    assert ok == {("local", 1), ("allreduce-join", 2), ("ps-central-async", 2)}, json.dumps(sweep)[-3000:]
    assert len(sweep["predictions"]) == 2 and set(sweep["ranking"]) == {"2"}
    check_predictions(sweep)


def check_slow_link(result: dict) -> None:
    """Every run trained the same steps; DiLoCo sent the dense all-reduce's bytes, and batch norm's running
    statistics, once in H steps, and the statistics once more at the end (estimated afresh for the final weights)."""
    runs = result["runs"]
    assert tuple(runs) == SLOW_LINK_RUNS and result["not_run"] == []
    assert result["link"] in ("50mbit", "loopback") and result["link_note"]
    assert (result["link"] == "50mbit") == result["link_note"].startswith("emulated")
    for name, run in runs.items():
        assert run.get("status") != "failed", (name, run.get("error"))
        assert run["steps"] == 4 and finite_positive(run["seconds_per_step"]) and finite_positive(run["speedup"])
        assert 0 <= run["test_accuracy"] <= 1 and run["weights_agree"]
    dense = runs["dense all-reduce"]["bytes_per_step"]
    assert dense == 4 * 272_186  # ResNet-20's parameters in float32
    diloco = runs["diloco H=2"]
    statistics = 4 * 2 * (7 * 16 + 7 * 32 + 7 * 64)  # float32 mean and variance of its 21 batch norms' channels
    assert diloco["outer_steps"] == 2 and diloco["bytes_per_step"] * 4 == 2 * (dense + statistics) + statistics
    assert (
        runs["top-k 1 %"]["bytes_per_step"] < dense / 20 and runs["powersgd rank 4 overlap"]["bytes_per_step"] < dense
    )


@pytest.mark.parametrize(("visit", "lanes"), [("issue50", [range(2, 10), range(10, 16)]), ("issue24", [range(2, 16)])])
def test_a_visit_splits_the_sixteen_cores_among_its_lanes(
    visit: str, lanes: list[range], monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = benchmark("device_suite", monkeypatch)
    monkeypatch.setattr(suite.os, "sched_getaffinity", lambda _: set(range(16)))
    gpu, cores = suite.core_split(suite.VISITS[visit])
    assert gpu == {0, 1} and cores == [set(lane) for lane in lanes]
    monkeypatch.setattr(suite.os, "sched_getaffinity", lambda _: {0, 1})
    assert suite.core_split(suite.VISITS[visit]) == (None, [None] * len(lanes))


def test_the_default_visit_fits_the_gpu_machines_450_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    suite = benchmark("device_suite", monkeypatch)
    visit, budget = suite.VISITS["issue50"], suite.DEVICE
    machine = 15  # seconds: 14 to 16 on the three visits so far
    assert machine + sum(budget.parts[name] for name in visit.gpu) <= budget.suite
    for lane in visit.lanes:
        assert machine + sum(budget.parts[name] for name in lane.parts) <= budget.suite


def test_the_held_out_cases_are_at_least_three_and_none_ran_before(monkeypatch: pytest.MonkeyPatch) -> None:
    holdout, scaling = benchmark("device_holdout", monkeypatch), benchmark("device_scaling", monkeypatch)
    cases = holdout.HOLDOUT_PLAN.sweeps
    assert len(cases) >= 3 and holdout.CHOSEN_ON == "2026-11-28"
    ran = {(sweep.workload, sweep.batch_size) for sweep in scaling.DEVICE_PLAN.sweeps}
    assert not ran & {(case.workload, case.batch_size) for case in cases}
    for case in cases:
        assert min(case.workers) > 1 and max(case.workers) <= 14 and len(case.strategies) >= 3
