"""Result rows of a sweep: speedup and efficiency (SPEC eq. 4.2), CSV/JSON lines, and medians.

>>> rows = [{"strategy": "s", "batch_size": 8, "workers": n, "batches_per_second": bps, "status": "ok"}
...         for n, bps in ((1, 10.0), (1, 12.0), (2, 19.8))]
>>> [round(r["speedup"], 2) for r in add_speedups(rows)]
[0.91, 1.09, 1.8]
"""

from __future__ import annotations

import csv
import json
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError

__all__ = ["COLUMNS", "Group", "add_speedups", "group_rows", "read_results", "write_results"]

COLUMNS = (
    "workload", "strategy", "strategy_kind", "server", "sync", "workers", "batch_size", "repeat", "status",
    "batches_per_second", "samples_per_second", "speedup", "efficiency", "compute_seconds_per_step",
    "communication_seconds_per_step", "wait_seconds_per_step", "train_seconds", "wall_seconds", "epoch_seconds",
    "steps", "steps_per_epoch", "metric", "quality", "threads_per_worker", "cpu_model", "cores", "torch_version",
    "host", "network", "run_dir", "error",
)  # fmt: skip


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return row["strategy"], row["batch_size"]


def add_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speedup = batches/s ÷ the median batches/s of the same strategy and batch size at one worker.

    Rows without a one-worker baseline get ``None``; efficiency = speedup ÷ workers.
    """
    baselines = defaultdict(list)
    for row in rows:
        if row.get("status") == "ok" and row["workers"] == 1:
            baselines[_key(row)].append(row["batches_per_second"])
    for row in rows:
        base = baselines.get(_key(row))
        ok = row.get("status") == "ok" and base
        row["speedup"] = row["batches_per_second"] / statistics.median(base) if ok else None
        row["efficiency"] = row["speedup"] / row["workers"] if row["speedup"] is not None else None
    return rows


def write_results(rows: list[dict[str, Any]], out: Path) -> None:
    """``results.jsonl`` (every field) and ``results.csv`` (the columns above)."""
    with (out / "results.jsonl").open("w", encoding="utf-8") as file:
        for row in rows:
            file.write(json.dumps(row) + "\n")
    with (out / "results.csv").open("w", encoding="utf-8", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def read_results(path: Path) -> list[dict[str, Any]]:
    """Rows of a sweep from its folder, its ``results.jsonl`` or its ``results.csv``."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.jsonl"
    if not path.exists():
        raise ConfigError(f"no results at {path}; give a bench output folder or its results.jsonl/results.csv")
    if path.suffix == ".csv":
        with path.open(encoding="utf-8") as file:
            return [_typed(row) for row in csv.DictReader(file)]
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                raise ConfigError(f"{path}:{number} is not a JSON line; the results file is damaged") from None
    return rows


def _typed(row: dict[str, str]) -> dict[str, Any]:
    typed: dict[str, Any] = {}
    for key, value in row.items():
        if value == "":
            typed[key] = None
            continue
        try:
            typed[key] = int(value)
        except ValueError:
            try:
                typed[key] = float(value)
            except ValueError:
                typed[key] = value
    return typed


@dataclass(frozen=True)
class Group:
    """The repeats of one configuration: medians and spread."""

    strategy: str
    batch_size: int
    workers: int
    rows: tuple[dict[str, Any], ...]

    def median(self, field: str) -> float | None:
        values = [row[field] for row in self.rows if row.get(field) is not None]
        return statistics.median(values) if values else None

    def spread(self, field: str) -> tuple[float, float] | None:
        values = [row[field] for row in self.rows if row.get(field) is not None]
        return (min(values), max(values)) if values else None

    @property
    def series(self) -> str:
        return f"{self.strategy} b{self.batch_size}"


def group_rows(rows: list[dict[str, Any]]) -> list[Group]:
    """Successful rows grouped by (strategy, batch size, workers), sorted."""
    groups = defaultdict(list)
    for row in rows:
        if row.get("status") == "ok":
            groups[(row["strategy"], row["batch_size"], row["workers"])].append(row)
    return [Group(*key, rows=tuple(value)) for key, value in sorted(groups.items())]
