"""What the benchmarks share: one ``scaletrain train`` run in a fresh process, its records, and the end
of a report (the machine, the numbers as JSON, the exit status)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scaletrain.data.idx import find_fashion_mnist
from scaletrain.errors import DataError

SRC = Path(__file__).resolve().parents[1] / "src"
#: The strategies of elastic runs (``--min-workers``) as the command line names them; the central server admits
#: no worker that joins later.
ELASTIC_STRATEGIES = {
    "allreduce": ["--strategy", "allreduce"],
    "ps-central": ["--strategy", "ps", "--server", "central"],
    "ps-sharded": ["--strategy", "ps", "--server", "sharded"],
}


def fashion_mnist(parser: argparse.ArgumentParser, given: Path | None) -> Path:
    """The real Fashion-MNIST's folder (never downloaded here), or the parser's one-line error."""
    try:
        return find_fashion_mnist(given, download=False)
    except DataError as exc:
        parser.error(f"this benchmark needs the real Fashion-MNIST: {exc}")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """``--threads``, ``--seed``, ``--data-dir`` and ``--json``, as every training benchmark takes them."""
    parser.add_argument("--threads", type=int, default=2, help="torch threads of each run (they run one at a time)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dir", type=Path, help="Fashion-MNIST folder (default: found on disk)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")


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


def finish(args: argparse.Namespace, report: dict[str, Any], met: bool) -> int:
    """Print the machine's line, write ``report`` (with the settings) to ``--json`` if given; the exit status."""
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"settings": settings, **report}, indent=2) + "\n")
    return 0 if met else 1


def pid_of(out: Path, rank: int) -> int | None:
    """The process id of a run's launch rank, from ``OUT/processes/rank-K.json`` (None: not written yet)."""
    path = out / "processes" / f"rank-{rank}.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))["pid"]
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return None
