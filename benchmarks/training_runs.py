"""What the benchmarks share: one ``scaletrain train`` run in a fresh process, and its records."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scaletrain.data.locate import find_fashion_mnist
from scaletrain.errors import DataError

SRC = Path(__file__).resolve().parents[1] / "src"


def fashion_mnist(parser: argparse.ArgumentParser, given: Path | None) -> Path:
    """The real Fashion-MNIST's folder (never downloaded here), or the parser's one-line error."""
    try:
        return find_fashion_mnist(given, download=False)
    except DataError as exc:
        parser.error(f"this benchmark needs the real Fashion-MNIST: {exc}")


def train_run(workload: str, out: Path, flags: list[str], *, timeout: float = 24 * 3600) -> float:
    """``scaletrain train WORKLOAD FLAGS`` into ``out`` (quietly, no TensorBoard, no download); its wall
    seconds. A failed run ends the benchmark with the end of its error output."""
    command = [
        *(sys.executable, "-m", "scaletrain", "train", workload, *flags),
        *("--out", str(out), "--progress", "off", "--no-tensorboard", "--no-download"),
    ]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    began = time.time()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return time.time() - began


def run_records(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The run's ``metrics.jsonl`` records and its ``summary.json``."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return records, json.loads((out / "summary.json").read_text(encoding="utf-8"))
