"""A tiny sweep end to end, the thesis presets shortened, and compare — real runs, real files."""

from __future__ import annotations

import csv
import json
import re
import statistics
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
from tests.helpers import make_fashion_mnist, run_cli

pytestmark = pytest.mark.multiprocess

PICTURES = ("throughput.png", "speedup.png", "time.png", "split.png")


def assert_real_png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 200 and image.shape[1] > 300
    assert image.std() > 0.01  # not a blank canvas


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    root = tmp_path_factory.mktemp("bench")
    data = make_fashion_mnist(root / "data", train=512, test=64)
    out = root / "out"
    result = run_cli(
        "bench",
        "lenet",
        "--workers",
        "1,2",
        "--strategies",
        "allreduce-join,ps-central-async",
        "--batch-sizes",
        "16",
        "--steps",
        "12",
        "--repeats",
        "2",
        "--warmup-steps",
        "2",
        "--data-dir",
        str(data),
        "--out",
        str(out),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "8 runs (0 failed)" in result.stdout
    return out, result


@pytest.fixture(scope="module")
def sweep(sweep_run: tuple[Path, subprocess.CompletedProcess]) -> Path:
    return sweep_run[0]


def test_csv_has_one_row_per_run_with_the_documented_columns(sweep: Path) -> None:
    with (sweep / "results.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 8
    for column in (
        "workload",
        "strategy",
        "sync",
        "workers",
        "batch_size",
        "repeat",
        "batches_per_second",
        "samples_per_second",
        "speedup",
        "efficiency",
        "compute_seconds_per_step",
        "communication_seconds_per_step",
        "wait_seconds_per_step",
        "wall_seconds",
        "quality",
        "cpu_model",
        "cores",
        "torch_version",
        "network",
    ):
        assert all(row[column] != "" for row in rows), column
    assert {row["server"] for row in rows} == {"", "central"}  # the server type only for a parameter server
    assert {(row["strategy"], row["workers"]) for row in rows} == {
        ("allreduce-join", "1"),
        ("allreduce-join", "2"),
        ("ps-central-async", "1"),
        ("ps-central-async", "2"),
    }


def test_speedup_arithmetic_matches_the_rows(sweep: Path) -> None:
    rows = [json.loads(line) for line in (sweep / "results.jsonl").read_text().splitlines()]
    # the common reference: the median of the one-worker runs that do the same work (all-reduce: one
    # process exchanging nothing; the central server's runs add a server process), both repeats
    alone = [r["batches_per_second"] for r in rows if r["workers"] == 1 and r["strategy"] == "allreduce-join"]
    assert len(alone) == 2
    reference = statistics.median(alone)
    for r in rows:
        assert r["reference_batches_per_second"] == pytest.approx(reference)
        assert r["speedup_common"] == pytest.approx(r["batches_per_second"] / reference)
        assert r["efficiency_common"] == pytest.approx(r["speedup_common"] / r["workers"])
        other = next(
            o["batches_per_second"]
            for o in rows
            if (o["strategy"], o["workers"]) == (r["strategy"], r["workers"]) and o["repeat"] != r["repeat"]
        )
        assert r["deviation"] == pytest.approx(r["batches_per_second"] / other - 1)  # two repeats: against the other
        assert bool(r["flag"]) == (abs(r["deviation"]) > 0.25 or "one-worker runs" in r["flag"])
    for strategy in ("allreduce-join", "ps-central-async"):
        mine = [r for r in rows if r["strategy"] == strategy]
        baseline = statistics.median(r["batches_per_second"] for r in mine if r["workers"] == 1)
        for r in mine:
            assert r["speedup"] == pytest.approx(r["batches_per_second"] / baseline)
            assert r["efficiency"] == pytest.approx(r["speedup"] / r["workers"])
            assert r["samples_per_second"] == pytest.approx(r["batches_per_second"] * 16)
        # every run really trained: its own summary agrees with the row
        summary = json.loads((Path(mine[-1]["run_dir"]) / "summary.json").read_text())
        assert summary["batches_per_second"] == mine[-1]["batches_per_second"]


def test_pictures_and_report(sweep: Path) -> None:
    for name in PICTURES:
        assert_real_png(sweep / name)
    report = (sweep / "report.md").read_text()
    assert "| allreduce-join | 16 | 2 |" in report and "| common speedup |" in report
    assert "- Noise: ±" in report and "- One-worker reference at batch 16:" in report
    assert "- 2 workers, batch 16: " in report  # a winner or "indistinguishable within noise", as measured
    assert all(f"({name})" in report for name in PICTURES)


def test_progress_while_it_runs_and_the_table_and_reading_at_the_end(
    sweep_run: tuple[Path, subprocess.CompletedProcess],
) -> None:
    out, result = sweep_run
    progress = result.stderr.splitlines()
    # one unmeasured warm-up run first, in a throw-away folder: only the 8 measured runs are under runs/
    assert progress[0] == "warm-up: allreduce-join, batch 16, 1 worker, 12 steps, not measured …"
    assert len(list((out / "runs").iterdir())) == 8
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    for index, row in enumerate(rows, 1):
        workers = f"{row['workers']} worker{'s' if row['workers'] > 1 else ''}"
        start = f"[{index}/8] {row['strategy']}, batch 16, {workers}, repeat {row['repeat'] + 1} of 2 …"
        done = next(line for line in progress if line.startswith(f"[{index}/8] ") and "batches/s" in line)
        assert progress.index(start) < progress.index(done)
        assert done.startswith(f"[{index}/8] {row['batches_per_second']:.1f} batches/s")
        if row["workers"] > 1:  # the speedup as far as known: against the one-worker runs finished before it
            ones = [r for r in rows[:index] if r["workers"] == 1]
            alone = [r["batches_per_second"] for r in ones if r["strategy"] == "allreduce-join"]  # no server process
            before = alone or [r["batches_per_second"] for r in ones]
            own = [
                r["batches_per_second"] for r in rows[:index] if r["workers"] == 1 and r["strategy"] == row["strategy"]
            ]
            speedups = f"{row['batches_per_second'] / statistics.median(own):.2f} (own one-worker run), "
            assert speedups + f"{row['batches_per_second'] / statistics.median(before):.2f} (common reference)" in done
    # stdout: the table of medians, the reading (no Markdown), the summary line
    table = result.stdout.split("\n\n")[0].splitlines()
    assert table[0].split()[:4] == ["strategy", "batch", "workers", "batches/s"] and "common speedup" in table[0]
    assert len(table) == 5  # header + 4 configurations
    allreduce_two = statistics.median(
        r["batches_per_second"] for r in rows if (r["strategy"], r["workers"]) == ("allreduce-join", 2)
    )
    assert re.search(rf"^allreduce-join\s+16\s+2\s+{allreduce_two:.1f} \[", table[2])
    assert "- One-worker reference at batch 16:" in result.stdout and "- Noise: ±" in result.stdout
    assert "**" not in result.stdout
    assert f"report: {out / 'report.md'}" in result.stdout


def test_compare_overlays_two_result_sets(sweep: Path, tmp_path: Path) -> None:
    result = run_cli("compare", str(sweep), str(sweep / "results.csv"), "--names", "a,b", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    for name in PICTURES:
        assert_real_png(tmp_path / name)
    assert "[a]" in (tmp_path / "report.md").read_text() and "[b]" in (tmp_path / "report.md").read_text()


@pytest.mark.parametrize("preset", ["thesis-cnn", "thesis-rnn", "thesis-gpt"])
def test_thesis_presets_run_shortened(preset: str, tmp_path: Path, real_ptb: Path) -> None:
    if preset == "thesis-cnn":
        data = make_fashion_mnist(tmp_path / "data", train=1536, test=64)
        extra = ["--data-dir", str(data)]
    elif preset == "thesis-rnn":
        # the preset's batches, workers and rate on the real text, with a tiny LSTM (the 2×200 one took 65 s of CI)
        extra = ["--data-dir", str(real_ptb), "-o", "train_split=valid", "-o", "hidden_size=16"]
    else:  # a narrow transformer, as the LSTM above
        extra = ["--data-dir", str(real_ptb), "-o", "train_split=valid", "-o", "width=16", "-o", "heads=2"]
    # One of the preset's two strategies keeps CI short; its batch sizes and worker counts stay.
    shorten = ["--quick", "--strategies", "ps-central-async", "--max-workers", "2"]
    result = run_cli("bench", "--preset", preset, *shorten, "--out", str(tmp_path / "o"), *extra, timeout=900)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "o/results.jsonl").read_text().splitlines()]
    assert rows and all(row["status"] == "ok" for row in rows)
    assert {row["workers"] for row in rows} == {1, 2}
    assert "left out" in result.stdout  # 5, 10, 25, 50 workers capped, with a note
    expected_batches = {512, 256, 128} if preset == "thesis-cnn" else {20, 5}
    assert {row["batch_size"] for row in rows} == expected_batches
