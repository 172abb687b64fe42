"""``scaletrain estimate`` and ``scaletrain profile`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import pytest
from tests.helpers import run_cli

from scaletrain.cli import main
from scaletrain.estimate.thesis import speedups

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_csv_prints_the_thesis_speedups_for_one_to_n_workers():
    result = run_cli(
        "estimate", "--t-grad", "0.763", "--t-comm", "0.210", "--type", "async", "--server", "central",
        "--workers", "8", "--batches", "128", "--output", "csv", "--case", "worst",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    values = [float(v) for v in result.stdout.strip().split(";")]
    expected = speedups(
        t_grad=0.763, t_comm=0.210, kind="async", server="central", workers=8, batches=128, case="worst"
    )
    assert values == pytest.approx(expected, abs=1e-4)
    # worst case by hand at N = 8: D·t_grad / ((D/N)(2N·t_comm + t_grad))
    assert values[-1] == pytest.approx(128 * 0.763 / (16 * (16 * 0.210 + 0.763)), abs=1e-4)


def test_csv_keeps_small_speedups_to_a_millionth():
    """Transfers that dwarf the gradient give speedups far below 1; the csv must not round them away."""
    settings = {"t_grad": 0.01, "t_comm": 0.6, "kind": "sync-join", "server": "central", "workers": 12, "batches": 128}
    result = run_cli(
        "estimate", "--t-grad", "0.01", "--t-comm", "0.6", "--workers", "12", "--output", "csv",
        "--case", "worst",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected = speedups(**settings, case="worst")
    assert min(expected) < 0.01  # four fixed decimals would keep two significant digits at most
    assert [float(v) for v in result.stdout.strip().split(";")] == pytest.approx(expected, rel=1e-6, abs=0)


def test_single_and_plot_outputs(tmp_path):
    single = run_cli("estimate", "--t-grad", "0.758", "--t-comm", "0.033", "--server", "distributed", "--workers", "8")
    assert single.returncode == 0, single.stderr
    assert float(single.stdout) == pytest.approx(7.4337, abs=1e-4)  # sync-join, D = 128 (thesis defaults)
    picture = tmp_path / "curve.png"
    plot = run_cli("estimate", "--t-grad", "0.758", "--t-comm", "0.033", "--workers", "4", "--output", "plot",
                   "--plot-file", str(picture))  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert picture.read_bytes()[:8] == PNG_MAGIC and picture.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--t-grad", "0.7"], "both --t-grad and --t-comm"),
        ([], "exactly one of"),
        (["--t-grad", "1", "--t-comm", "0.1", "--workers", "1,2"], "one number"),
        (["--t-grad", "1", "--t-comm", "0.1", "--recommend"], "--max-workers"),
        (["--t-grad", "1", "--t-comm", "0.1", "--strategy", "allreduce", "--type", "async"], "synchronous"),
        (["--t-grad", "1", "--t-comm", "0.1", "--validate"], "--validate runs a workload"),
    ],
)
def test_impossible_requests_exit_2_with_the_fix(args, fragment):
    result = run_cli("estimate", *args)
    assert result.returncode == 2
    assert fragment in result.stderr


NUMBERS = ["--t-grad", "0.5", "--t-comm", "0.1"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--workers", "0"], "--workers must be a whole number ≥ 1, got 0"),
        (["--workers", "-3"], "--workers must be a whole number ≥ 1, got -3"),
        (["--t-grad", "nan"], "--t-grad must be > 0"),
        (["--t-grad", "inf"], "--t-grad must be > 0"),
        (["--t-grad", "-1"], "--t-grad must be > 0"),
        (["--t-comm", "nan"], "--t-comm ≥ 0"),
        (["--t-comm", "-0.1"], "--t-comm ≥ 0"),
        (["--batches", "nan"], "--batches must be a number > 0"),
        (["--batches", "0"], "--batches must be a number > 0"),
        (["--batches", "inf"], "--batches must be a number > 0"),
        (["--cores", "0", "--model", "refined"], "--cores must be a whole number ≥ 1"),
        (["--recommend", "--max-workers", "0"], "--max-workers must be ≥ 1"),
        (["--recommend", "--max-workers", "-2"], "--max-workers must be ≥ 1"),
        (["--model", "refined", "--t-grad", "nan"], "--t-grad must be > 0"),
    ],
)
def test_numbers_that_make_no_sense_exit_2_with_one_line(args, fragment, capsys):
    """In-process through the real entry point (the subprocess case below shows there is no traceback)."""
    assert main(["estimate", *NUMBERS, *args]) == 2  # a later --t-grad replaces the one in NUMBERS
    captured = capsys.readouterr()
    assert captured.out == "" or "note:" in captured.out
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--timeout", "nan"], "--timeout must be a number of seconds > 0"),
        (["--timeout", "0"], "--timeout must be a number of seconds > 0"),
        (["--batch-size", "0"], "--batch-size must be ≥ 1"),
        (["--repeats", "0"], "--repeats"),
        (["--concurrency", "0"], "--concurrency must be ≥ 1"),
        (["--split-workers", "0"], "split worker counts must be ≥ 1"),
    ],
)
def test_profile_numbers_are_refused_before_anything_is_measured(args, fragment, capsys):
    assert main(["profile", "lenet", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--runs", "0"], "--runs and --launches must be ≥ 1"),
        (["--steps", "0"], "steps must be a whole number ≥ 1"),
        (["--lr", "nan"], "lr must be a finite number"),
        (["--momentum", "1.5"], "momentum must be in [0, 1)"),
        (["--workers", "0,2"], "--workers must be a whole number ≥ 1, got 0"),
    ],
)
def test_validation_numbers_are_refused_before_profiling(args, fragment, capsys, tmp_path):
    assert main(["estimate", "lenet", "--validate", "--out", str(tmp_path / "v"), *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err
    assert not (tmp_path / "v").exists()


def test_zero_workers_is_one_line_and_no_traceback():
    result = run_cli("estimate", *NUMBERS, "--workers", "0")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "NumPy" not in line and "_conversion" not in line]
    assert lines == ["scaletrain: error: --workers must be a whole number ≥ 1, got 0"]
    assert result.stdout == ""


def test_recommend_from_the_thesis_table_times():
    result = run_cli("estimate", "--t-grad", "0.821", "--t-comm", "0.811", "--recommend", "--max-workers", "8")
    assert result.returncode == 0, result.stderr
    # 003 §7.1: ResNet34 is best on 8 workers with the distributed server.
    assert "thesis model: 8 worker(s), ps-sharded" in result.stdout


@pytest.mark.multiprocess
def test_profile_then_refined_estimate_from_the_file(tiny_fmnist, tmp_path):
    saved = tmp_path / "lenet.json"
    profiled = run_cli(
        "profile", "lenet", "--batch-size", "32", "--data-dir", str(tiny_fmnist), "--repeats", "2",
        "--round-trips", "2", "--launches", "1", "--concurrency", "2", "--split-workers", "2", "--out", str(saved),
    )  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    assert "t_grad" in profiled.stdout and "t_comm" in profiled.stdout and str(saved) in profiled.stdout
    estimated = run_cli("estimate", "--profile", str(saved), "--model", "refined", "--type", "sync-split",
                        "--workers", "2", "--cores", "2", "--output", "csv")  # fmt: skip
    assert estimated.returncode == 0, estimated.stderr
    values = [float(v) for v in estimated.stdout.split(";")]
    assert len(values) == 2 and all(v > 0 for v in values)
    advice = run_cli("estimate", "--profile", str(saved), "--recommend", "--max-workers", "3")
    assert advice.returncode == 0, advice.stderr
    assert "thesis model:" in advice.stdout and "refined model:" in advice.stdout
