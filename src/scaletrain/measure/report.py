"""``report.md``: the table of medians, the pictures, and a short generated reading of them."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from scaletrain.measure.results import Group, group_rows

__all__ = ["best_per_worker_count", "scaling_limits", "write_report"]

GAIN_THRESHOLD = 1.05  # adding workers must raise throughput by at least 5 % to count as scaling


def best_per_worker_count(groups: list[Group]) -> dict[int, Group]:
    """The configuration with the highest median batches/s at each worker count.

    >>> g = lambda s, n, bps: Group(s, 8, n, ({"batches_per_second": bps},))
    >>> {n: b.strategy for n, b in best_per_worker_count([g("a", 1, 5), g("b", 1, 6), g("a", 2, 9)]).items()}
    {1: 'b', 2: 'a'}
    """
    best: dict[int, Group] = {}
    for group in groups:
        current = best.get(group.workers)
        if current is None or group.median("batches_per_second") > current.median("batches_per_second"):
            best[group.workers] = group
    return dict(sorted(best.items()))


def scaling_limits(groups: list[Group]) -> dict[str, tuple[int, bool]]:
    """For each series (strategy, batch) measured at two or more worker counts: the count where
    throughput stopped growing by ≥ 5 %, and whether it was still growing at the largest one."""
    by_series = defaultdict(list)
    for group in groups:
        by_series[group.series].append(group)
    limits = {}
    for series, items in sorted(by_series.items()):
        if len(items) < 2:
            continue  # one worker count says nothing about scaling
        items.sort(key=lambda g: g.workers)
        stop, growing = items[0].workers, True
        for previous, current in itertools.pairwise(items):
            if current.median("batches_per_second") >= GAIN_THRESHOLD * previous.median("batches_per_second"):
                stop = current.workers
            else:
                growing = False
                break
        limits[series] = (stop, growing)
    return limits


def _cell(group: Group, field: str, scale: float = 1.0, digits: int = 2) -> str:
    median = group.median(field)
    if median is None:
        return "–"
    low, high = group.spread(field)
    text = f"{median * scale:.{digits}f}"
    if len(group.rows) > 1:
        text += f" [{low * scale:.{digits}f}–{high * scale:.{digits}f}]"
    return text


def write_report(rows: list[dict[str, Any]], notes: list[str], out: Path, *, title: str, pictures: list[Path]) -> Path:
    """Write ``out/report.md`` and return its path."""
    groups = group_rows(rows)
    failed = [row for row in rows if row.get("status") != "ok"]
    first = next((row for row in rows if row.get("status") == "ok"), rows[0] if rows else {})
    lines = [f"# {title}", ""]
    lines += [
        f"Measured on {first.get('cpu_model', '?')} ({first.get('cores', '?')} cores), torch "
        f"{first.get('torch_version', '?')}, network: {first.get('network', '?')}; "
        f"{first.get('threads_per_worker', '?')} thread(s) per process. {len(rows)} runs, {len(failed)} failed. "
        "Throughput is SPEC eq. 4.1 (batches of the batch size processed by all workers per second, warm-up "
        "left out); speedup is eq. 4.2 against the same strategy and batch size at one worker. Cells show "
        "the median over repeats and [min–max].",
        "",
    ]
    lines += [f"- Note: {note}" for note in notes]
    lines += ["", "## Reading", ""]
    for workers, group in best_per_worker_count(groups).items():
        lines.append(
            f"- {workers} worker(s): fastest is **{group.series}** at {group.median('batches_per_second'):.1f} "
            "batches/s" + (f" (speedup {group.median('speedup'):.2f})" if group.median("speedup") else "")
        )
    for series, (stop, growing) in scaling_limits(groups).items():
        if growing:
            lines.append(f"- {series}: throughput still grows at {stop} workers, the most measured")
        else:
            lines.append(f"- {series}: throughput stops growing (by ≥ 5 %) after {stop} worker(s)")
    lines += ["", "## Results", ""]
    lines.append(
        "| strategy | batch | workers | batches/s | speedup | efficiency | compute ms | comm. ms | wait ms | quality |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for group in groups:
        metric = group.rows[0].get("metric", "quality")
        lines.append(
            f"| {group.strategy} | {group.batch_size} | {group.workers} "
            f"| {_cell(group, 'batches_per_second', digits=1)} "
            f"| {_cell(group, 'speedup')} | {_cell(group, 'efficiency')} "
            f"| {_cell(group, 'compute_seconds_per_step', 1000, 1)} "
            f"| {_cell(group, 'communication_seconds_per_step', 1000, 1)} "
            f"| {_cell(group, 'wait_seconds_per_step', 1000, 1)} | {metric} {_cell(group, 'quality', digits=3)} |"
        )
    lines += ["", "## Pictures", ""]
    lines += [f"![{path.stem}]({path.name})" for path in pictures]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {row['strategy']} b{row['batch_size']} ×{row['workers']}: {row.get('error')}" for row in failed]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
