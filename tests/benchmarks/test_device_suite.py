"""``scripts/device-suite.sh --dry-run``: every part of the GPU machine's suite runs on this CPU at tiny
sizes, so the suite cannot rot between the machine's visits. Checks what comes back in ``$OUT``: at most
eight files with plain names, the figures JSON with every part and its numbers, and the report."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import REPO

PARTS = ("machine", "scaling", "gpu-tests", "precision", "gpu-vs-cpu", "prunetrain", "adaptive-batch")
SECTIONS = ("## GPU tests", "## Precision on", "## GPU against CPU", "## PruneTrain on the GPU",
            "## Batch adaptation after pruning", "## CPU scaling on", "## Pictures")  # fmt: skip
DRY_RUN_LIMIT = 180  # seconds, the promise for CI


@pytest.mark.slow
@pytest.mark.multiprocess
# Not alone: the dry run took 35 s by itself here; beside one other test it has room under the limit of 180 s
# and its parts' budgets (30 to 150 s each, for a few seconds of work at the dry run's sizes).
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
        error = sweep["errors"]["refined"]["all"]  # the refined model's mean relative error, in percent
        assert sweep["predictions"] and math.isfinite(error) and 0 <= error < 1000, (name, error)
        assert all(row["speedup_common"] > 0 for row in sweep["rows"] if row["status"] == "ok")

    report = (out / "report.md").read_text()
    for section in SECTIONS:
        assert section in report
    assert "Dry run" in report and "| scaling | ok |" in report
