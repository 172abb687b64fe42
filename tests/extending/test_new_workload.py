"""A workload of one's own, in one module with one registry line (tests/extending/made_up_workload.py; its
dataset's finder and reader in tests/extending/made_up_points.py): listed, trained by two real worker
processes, and profiled by the probes, all through ``SCALETRAIN_PLUGINS``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.extending.made_up_points import write_points
from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
PLUGIN = {"SCALETRAIN_PLUGINS": "tests.extending.made_up_workload", "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}


def test_the_workload_is_listed_only_with_its_plugin() -> None:
    listed = run_cli("workloads", env=PLUGIN)
    assert listed.returncode == 0, listed.stderr
    assert "spirals" in listed.stdout
    assert "spirals" not in run_cli("workloads").stdout


@pytest.mark.multiprocess
def test_two_workers_train_it_and_the_probes_profile_it(tmp_path: Path) -> None:
    data = write_points(tmp_path / "points")
    out = tmp_path / "run"
    trained = run_cli(
        "train", "spirals", "--workers", "2", "--data-dir", str(data), "--epochs", "12", "--out", str(out),
        "--progress", "off", "--timeout", "60", env=PLUGIN,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert summary["workload"] == "spirals"
    assert summary["workers"] == 2
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    # a linear model stays near 0.5 on two interleaved spirals; the MLP learns them
    assert summary["test_accuracy"] > 0.8, summary["test_accuracy"]

    profile = tmp_path / "spirals.json"
    profiled = run_cli(
        "profile", "spirals", "--data-dir", str(data), "--out", str(profile), "--concurrency", "1",
        "--launches", "1", "--repeats", "3", "--round-trips", "3", "--timeout", "120", env=PLUGIN,
    )  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    measured = json.loads(profile.read_text(encoding="utf-8"))
    assert measured["workload"] == "spirals"
    assert measured["parameters"] == 2 * 64 + 64 + 64 * 64 + 64 + 64 * 2 + 2
    assert measured["t_grad"] > 0 and measured["t_comm"] > 0


def test_a_folder_without_its_files_is_one_line_naming_the_fix(tmp_path: Path) -> None:
    result = run_cli("train", "spirals", "--data-dir", str(tmp_path), "--steps", "1", "--out", str(tmp_path / "r"),
                     env=PLUGIN)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == f"scaletrain: error: --data-dir {tmp_path} holds no train.csv and test.csv"
