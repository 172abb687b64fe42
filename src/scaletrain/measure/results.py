"""Result rows of a sweep: speedup and efficiency (SPEC eq. 4.2), flags, CSV/JSON lines, and medians.

Speedup is given twice: against the same strategy and batch size at one worker (``speedup``, eq. 4.2)
and against one common one-worker reference for the batch size, the median of every strategy's
one-worker runs (``speedup_common``), so that a slow baseline of one strategy cannot inflate its
speedup alone.

>>> rows = [{"strategy": s, "batch_size": 8, "workers": n, "batches_per_second": bps, "status": "ok"}
...         for s, n, bps in (("a", 1, 10.0), ("a", 1, 12.0), ("b", 1, 14.0), ("a", 2, 19.8))]
>>> [round(r["speedup"], 2) for r in add_speedups(rows)]
[0.91, 1.09, 1.0, 1.8]
>>> [round(r["speedup_common"], 2) for r in rows]  # against the median of 10, 12 and 14
[0.83, 1.0, 1.17, 1.65]
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
from scaletrain.parallel.strategies import Layout

__all__ = [
    "COLUMNS",
    "OUTLIER_TOLERANCE",
    "Group",
    "add_speedups",
    "bytes_per_step",
    "flag_outliers",
    "framework_of",
    "group_rows",
    "read_results",
    "reference_framework",
    "shown_strategy",
    "works_alone",
    "write_results",
]

COLUMNS = (
    "workload",
    "framework",
    "strategy",
    "strategy_kind",
    "server",
    "sync",
    "workers",
    "batch_size",
    "repeat",
    "status",
    "batches_per_second",
    "samples_per_second",
    "speedup",
    "efficiency",
    "reference_batches_per_second",
    "speedup_common",
    "efficiency_common",
    "deviation",
    "flag",
    "compute_seconds_per_step",
    "communication_seconds_per_step",
    "wait_seconds_per_step",
    "data_seconds_per_step",
    "train_seconds",
    "wall_seconds",
    "epoch_seconds",
    "steps",
    "steps_per_epoch",
    "bytes_sent_per_step",
    "outer_steps",
    "metric",
    "quality",
    "quality_warning",
    "threads_per_worker",
    "cpu_model",
    "isa",
    "cores",
    "torch_version",
    "torch_build",
    "host",
    "network",
    "run_dir",
    "error",
)

# A run whose batches/s is more than this fraction away from the median of its repeats (or, at one
# worker, from the common one-worker reference) is flagged as an outlier.
OUTLIER_TOLERANCE = 0.25


def bytes_per_step(workers: list[dict[str, Any]]) -> float | None:
    """The bytes a worker put on the wire per step of its own (gradients, or diloco's changes), over every worker."""
    steps = sum(worker.get("steps", 0) for worker in workers)
    return sum(worker.get("gradient_bytes_sent", 0) for worker in workers) / steps if steps else None


def framework_of(row: dict[str, Any]) -> str:
    return row.get("framework") or "scaletrain"


def reference_framework(rows: list[dict[str, Any]]) -> str:
    """Whose one-worker runs are the common reference: scaletrain's when the rows have any, else the first
    framework's (a sweep of foreign engines alone)."""
    frameworks = [framework_of(row) for row in rows]
    return "scaletrain" if "scaletrain" in frameworks or not frameworks else frameworks[0]


def shown_strategy(row: dict[str, Any]) -> str:
    """The strategy as tables and pictures name it: a foreign engine's runs carry the engine's name.

    >>> shown_strategy({"strategy": "allreduce-join", "framework": "mxnet"})
    'mxnet allreduce-join'
    >>> shown_strategy({"strategy": "allreduce-join"})  # scaletrain's own, and rows written before frameworks
    'allreduce-join'
    """
    framework = framework_of(row)
    return row["strategy"] if framework == "scaletrain" else f"{framework} {row['strategy']}"


def _key(row: dict[str, Any]) -> tuple[str, int]:
    return shown_strategy(row), row["batch_size"]


def _ok(row: dict[str, Any]) -> bool:
    return row.get("status") == "ok" and row.get("batches_per_second") is not None


def works_alone(row: dict[str, Any]) -> bool:
    """Whether a one-worker run of this row's strategy is one process that exchanges nothing (all-reduce,
    the sharded server whose only shard is the worker's own), so that all such runs do the same work; a
    central server is a second process that every step talks to (the strategy's
    :meth:`~scaletrain.parallel.strategies.Strategy.extra_processes`). A strategy this process does not
    know (a plugin not loaded) counts as working alone."""
    try:
        layout = Layout(row.get("strategy_kind") or "", 1, row.get("server") or "", row.get("sync") or "join")
    except ConfigError:
        return True
    return not layout.has_server_process


def _one_worker_rates(rows: list[dict[str, Any]]) -> dict[tuple[str, int | None], list[float]]:
    """Batches/s of the successful one-worker runs that work alone (:func:`works_alone`), by framework and
    batch size (another framework's one process does other work); where none does, of every one-worker run."""
    alone, every = defaultdict(list), defaultdict(list)
    for row in rows:
        if _ok(row) and row["workers"] == 1:
            key = (framework_of(row), row["batch_size"])
            every[key].append(row["batches_per_second"])
            if works_alone(row):
                alone[key].append(row["batches_per_second"])
    return {key: alone.get(key) or rates for key, rates in every.items()}


def add_speedups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Speedup = batches/s ÷ the median batches/s of the same strategy and batch size at one worker;
    common speedup = batches/s ÷ ``reference_batches_per_second``, the median batches/s of the
    one-worker runs that do the same work (:func:`works_alone`; every such strategy, every repeat) of
    the same batch size, scaletrain's (:func:`reference_framework`) for the rows of every framework.

    Rows without a baseline get ``None``; efficiency = speedup ÷ workers (both kinds).
    """
    baselines = defaultdict(list)
    for row in rows:
        if _ok(row) and row["workers"] == 1:
            baselines[_key(row)].append(row["batches_per_second"])
    common = reference_framework(rows)
    references = {
        batch: statistics.median(rates)
        for (framework, batch), rates in _one_worker_rates(rows).items()
        if framework == common
    }
    for row in rows:
        base, reference = baselines.get(_key(row)), references.get(row.get("batch_size"))
        ok = _ok(row)
        row["speedup"] = row["batches_per_second"] / statistics.median(base) if ok and base else None
        row["efficiency"] = row["speedup"] / row["workers"] if row["speedup"] is not None else None
        row["reference_batches_per_second"] = reference
        row["speedup_common"] = row["batches_per_second"] / reference if ok and reference else None
        row["efficiency_common"] = row["speedup_common"] / row["workers"] if row["speedup_common"] is not None else None
    return rows


def flag_outliers(rows: list[dict[str, Any]], tolerance: float = OUTLIER_TOLERANCE) -> list[dict[str, Any]]:
    """Set ``deviation`` (batches/s ÷ the median of its repeats − 1, or ÷ the other run when there are
    two; ``None`` for a configuration run once) and ``flag`` (why the run is far off, or ``""``) on
    every row.

    A run is flagged when it is more than ``tolerance`` away from the median of its repeats (from the
    other one when there are two), or — at one worker, for the strategies that then do the same work
    (:func:`works_alone`) — likewise from those strategies' one-worker runs at its batch size (of its own
    framework).

    >>> rows = [{"strategy": s, "batch_size": 8, "workers": 1, "batches_per_second": bps, "status": "ok"}
    ...         for s, bps in (("a", 15.4), ("b", 21.7), ("c", 25.0), ("d", 29.0))]
    >>> [row["flag"] for row in flag_outliers(rows)]
    ['34 % below the median of the 4 one-worker runs at batch 8', '', '', '']
    """
    repeats = defaultdict(list)
    for row in rows:
        if _ok(row):
            repeats[(*_key(row), row["workers"])].append(row["batches_per_second"])
    one_worker = _one_worker_rates(rows)
    for row in rows:
        row["deviation"], row["flag"] = None, ""
        if not _ok(row):
            continue
        rate, reasons = row["batches_per_second"], []
        mine = repeats[(*_key(row), row["workers"])]
        if len(mine) > 1:
            row["deviation"] = _deviation(rate, mine)
            if abs(row["deviation"]) > tolerance:
                reasons.append(f"{_percent(row['deviation'])} {_against(mine, 'repeat')}")
        others = one_worker.get((framework_of(row), row["batch_size"]), [])
        if row["workers"] == 1 and works_alone(row) and len(others) > 1:
            off = _deviation(rate, others)
            if abs(off) > tolerance:
                reasons.append(f"{_percent(off)} {_against(others, 'one-worker run')} at batch {row['batch_size']}")
        row["flag"] = "; ".join(reasons)
    return rows


def _deviation(rate: float, rates: list[float]) -> float:
    """Relative distance of ``rate`` (one of ``rates``) from the median of ``rates``, or from the other
    rate when there are two (whose median, their mean, would halve the distance)."""
    if len(rates) == 2:
        other = rates[1] if rates[0] == rate else rates[0]
        return rate / other - 1
    return rate / statistics.median(rates) - 1


def _against(rates: list[float], what: str) -> str:
    return f"the other {what}" if len(rates) == 2 else f"the median of the {len(rates)} {what}s"


def _percent(off: float) -> str:
    return f"{abs(off):.0%} {'below' if off < 0 else 'above'}".replace("%", " %")


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
    """Successful rows grouped by (strategy as shown, batch size, workers), sorted."""
    groups = defaultdict(list)
    for row in rows:
        if row.get("status") == "ok":
            groups[(shown_strategy(row), row["batch_size"], row["workers"])].append(row)
    return [Group(*key, rows=tuple(value)) for key, value in sorted(groups.items())]
