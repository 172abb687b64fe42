"""``report.md``: the table of medians, the pictures, and a short generated reading of them.

The reading never ranks configurations whose batches/s differ by less than the noise: the spread of
repeated runs and of one-worker runs that do the same work, or a stated tolerance when every
configuration ran once and no two one-worker runs do the same work. One-worker runs that do the same
work are never ranked against each other at all: whatever separates them is noise.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scaletrain.measure.results import (
    OUTLIER_TOLERANCE,
    Group,
    framework_of,
    group_rows,
    reference_framework,
    works_alone,
)

__all__ = ["Noise", "rank_configurations", "reading", "scaling_limits", "text_table", "write_report"]

GAIN_THRESHOLD = 0.05  # adding workers must raise throughput by at least 5 % (or the noise) to count as scaling
NOISE_FLOOR = 0.05  # differences under 5 % are never ranked, however quiet the repeats were
SINGLE_RUN_TOLERANCE = 0.15  # the noise assumed when no configuration was repeated (seen on a busy 2-core machine)


@dataclass(frozen=True)
class Noise:
    """The relative difference in batches/s below which two configurations are not told apart."""

    level: float
    source: str  # how the level was found, for the report

    @classmethod
    def of(cls, groups: list[Group]) -> Noise:
        """The median relative range, (max − min) ÷ median, of the configurations measured two or more
        times and of each batch size's one-worker runs that do the same work (their medians; at least
        5 %); 15 % when there is neither.

        >>> def g(rates, workers=2, kind="allreduce", server=""):
        ...     rows = tuple({"batches_per_second": x, "strategy_kind": kind, "server": server} for x in rates)
        ...     return Group(f"{kind}-{server}", 8, workers, rows)
        >>> Noise.of([g((9.0, 10.0, 11.0)), g((19.0, 20.0, 21.0)), g((4.0, 5.0, 6.0))]).level  # 20 %, 10 %, 40 %
        0.2
        >>> Noise.of([g((10.0,))]).level
        0.15
        >>> Noise.of([g((21.0,), 1), g((26.0,), 1, "ps", "sharded")]).level  # one worker, same work: 5 ÷ 23.5
        0.2127659574468085
        >>> Noise.of([g((21.0,), 1), g((26.0,), 1, "ps", "central")]).level  # a server process: not the same work
        0.15
        """
        ranges = []
        for group in groups:
            rates = [row["batches_per_second"] for row in group.rows]
            if len(rates) > 1:
                ranges.append((max(rates) - min(rates)) / statistics.median(rates))
        repeated = len(ranges)
        for alone in _same_work_at_one_worker(groups).values():
            if len(alone) > 1:
                rates = [group.median("batches_per_second") for group in alone]
                ranges.append((max(rates) - min(rates)) / statistics.median(rates))
        if not ranges:
            return cls(
                SINGLE_RUN_TOLERANCE,
                f"every configuration ran once, so a stated tolerance of {_percent(SINGLE_RUN_TOLERANCE)} is used "
                "(--repeats 3 measures the noise)",
            )
        measured = statistics.median(ranges)
        parts = [f"{repeated} configuration(s) measured more than once"] if repeated else []
        if len(ranges) > repeated:
            parts.append(f"{len(ranges) - repeated} set(s) of one-worker runs that do the same work")
        source = f"the median relative range (max − min) ÷ median of {' and '.join(parts)}, {_percent(measured, 1)}"
        if measured < NOISE_FLOOR:
            source += f", raised to the floor of {_percent(NOISE_FLOOR)}"
        return cls(max(measured, NOISE_FLOOR), source)

    def __str__(self) -> str:
        return _percent(self.level)


def _percent(fraction: float, digits: int = 0) -> str:
    """``0.15`` → ``15 %``."""
    return f"{fraction * 100:.{digits}f} %"


def _same_work_at_one_worker(groups: list[Group], framework: str = "scaletrain") -> dict[int, list[Group]]:
    """By batch size: the one-worker configurations of ``framework`` that do the same work (one process,
    nothing exchanged; see :func:`~scaletrain.measure.results.works_alone`)."""
    alone = defaultdict(list)
    for group in groups:
        if group.workers == 1 and works_alone(group.rows[0]) and framework_of(group.rows[0]) == framework:
            alone[group.batch_size].append(group)
    return alone


def rank_configurations(groups: list[Group], noise: Noise) -> dict[tuple[int, int], tuple[list[Group], list[Group]]]:
    """At each (worker count, batch size): the configurations indistinguishable within ``noise`` from
    the fastest one (median batches/s), fastest first, and the slower rest.

    >>> g = lambda s, n, bps: Group(s, 8, n, ({"batches_per_second": bps},))
    >>> ranked = rank_configurations([g("a", 1, 10), g("b", 1, 11), g("c", 1, 7), g("a", 2, 19)], Noise(0.15, ""))
    >>> {key: [[x.strategy for x in part] for part in parts] for key, parts in ranked.items()}
    {(1, 8): [['b', 'a'], ['c']], (2, 8): [['a'], []]}
    """
    by_count = defaultdict(list)
    for group in groups:
        by_count[(group.workers, group.batch_size)].append(group)
    ranked = {}
    for key, items in sorted(by_count.items()):
        items.sort(key=lambda g: g.median("batches_per_second"), reverse=True)
        best = items[0].median("batches_per_second")
        tied = [g for g in items if g.median("batches_per_second") >= best * (1 - noise.level)]
        ranked[key] = (tied, [g for g in items if g not in tied])
    return ranked


def scaling_limits(groups: list[Group], min_gain: float = GAIN_THRESHOLD) -> dict[str, tuple[int, bool]]:
    """For each series (strategy, batch) measured at two or more worker counts: the count where
    throughput stopped growing by more than ``min_gain``, and whether it was still growing at the largest one."""
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
            if current.median("batches_per_second") > (1 + min_gain) * previous.median("batches_per_second"):
                stop = current.workers
            else:
                growing = False
                break
        limits[series] = (stop, growing)
    return limits


def _speedups(group: Group) -> str:
    common, own = group.median("speedup_common"), group.median("speedup")
    parts = [
        f"{common:.2f} against the common reference" if common is not None else "",
        f"{own:.2f} against its own one-worker run" if own is not None else "",
    ]
    parts = [part for part in parts if part]
    return f" (speedup {', '.join(parts)})" if parts else ""


def _rate(group: Group) -> str:
    return f"{group.median('batches_per_second'):.1f}"


def _names(groups: list[Group]) -> str:
    names = [g.strategy for g in groups]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _one_worker_line(alone: list[Group], everyone: list[Group], noise: Noise) -> str:
    """One worker at a batch size where two or more strategies do the same work: not ranked; the
    others (a server process as well) against the median of those."""
    rates = [g.median("batches_per_second") for g in alone]
    text = (
        f"not ranked — {_names(alone)} do the same work at one worker (one process, nothing exchanged), so "
        f"their {min(rates):.1f}–{max(rates):.1f} batches/s differ by noise alone"
    )
    middle = statistics.median(rates)
    mine = framework_of(alone[0].rows[0])
    others = [g for g in everyone if g not in alone]
    for heading, part in (
        ("with a server process as well", [g for g in others if framework_of(g.rows[0]) == mine]),
        ("other frameworks", [g for g in others if framework_of(g.rows[0]) != mine]),
    ):
        if part:
            text += f"; {heading}: " + ", ".join(
                f"{g.strategy} {_rate(g)} ({_percent(off)} against their median"
                f"{', within noise' if abs(off) <= noise.level else ''})"
                for g, off in ((g, g.median("batches_per_second") / middle - 1) for g in part)
            )
    return text


def _rests_on_flagged_runs(groups: list[Group]) -> bool:
    """Whether a median of ``groups`` includes a flagged run and fewer than three runs (from three on, a
    median is not moved far by one outlier)."""
    return any(len(group.rows) < 3 and any(row.get("flag") for row in group.rows) for group in groups)


def reading(rows: list[dict[str, Any]]) -> list[str]:
    """The generated reading of a sweep, one Markdown list item per line: the one-worker reference,
    the noise, the fastest configurations at each worker count (never ranked inside the noise, nor on
    a median of fewer than three runs that include a flagged one), where each series stops scaling,
    and how many runs were flagged."""
    groups = group_rows(rows)
    noise = Noise.of(groups)
    lines = []
    references = {
        row["batch_size"]: row.get("reference_batches_per_second") for row in rows if row.get("status") == "ok"
    }
    common = reference_framework(rows)
    whose = f"{common}'s " if any(framework_of(row) != common for row in rows) else ""
    for batch, reference in sorted(references.items(), key=lambda item: str(item[0])):
        ones = [
            row
            for row in rows
            if row.get("status") == "ok"
            and row["workers"] == 1
            and row["batch_size"] == batch
            and framework_of(row) == common
        ]
        same = [row for row in ones if works_alone(row)]
        which = "that do the same work (one process, nothing exchanged)" if same else "of all strategies"
        rates = [row["batches_per_second"] for row in same or ones]
        if reference is not None and rates:
            lines.append(
                f"- One-worker reference at batch {batch}: {reference:.1f} batches/s, the median of {whose}"
                f"{len(rates)} one-worker run(s) {which} ({min(rates):.1f}–{max(rates):.1f})"
            )
    lines.append(f"- Noise: ±{noise} — {noise.source}; differences within it are not ranked")
    alone = _same_work_at_one_worker(groups, common)
    for (workers, batch), (tied, slower) in rank_configurations(groups, noise).items():
        where = f"- {workers} worker{'s' if workers > 1 else ''}, batch {batch}: "
        if workers == 1 and len(alone.get(batch, [])) > 1:
            lines.append(where + _one_worker_line(alone[batch], tied + slower, noise))
            continue
        if len(tied) == 1 and not slower:
            lines.append(
                where + f"only **{tied[0].strategy}** measured, {_rate(tied[0])} batches/s{_speedups(tied[0])}"
            )
            continue
        if _rests_on_flagged_runs(tied + slower):
            listed = ", ".join(f"{g.strategy} {_rate(g)}" for g in tied + slower)
            lines.append(where + f"not ranked: flagged runs are involved ({listed} batches/s); rerun with --repeats 3")
            continue
        if len(tied) == 1:
            text = f"fastest is **{tied[0].strategy}** at {_rate(tied[0])} batches/s{_speedups(tied[0])}"
        else:
            rates = [g.median("batches_per_second") for g in tied]
            text = f"{_names(tied)} are indistinguishable within noise ({min(rates):.1f}–{max(rates):.1f} batches/s)"
        best = tied[0].median("batches_per_second")
        if slower:
            text += "; slower: " + ", ".join(
                f"{g.strategy} ({_rate(g)}, {_percent(g.median('batches_per_second') / best - 1)})" for g in slower
            )
        lines.append(where + text)
    min_gain = max(GAIN_THRESHOLD, noise.level)
    for series, (stop, growing) in scaling_limits(groups, min_gain).items():
        if growing:
            line = f"- {series}: throughput still grows at {stop} workers, the most measured"
        else:
            line = f"- {series}: throughput stops growing (by more than {_percent(min_gain)}) after {stop} worker(s)"
        if _rests_on_flagged_runs([g for g in groups if g.series == series]):
            line += " — rests on flagged runs, not trustworthy"
        lines.append(line)
    flagged = [row for row in rows if row.get("flag")]
    if flagged:
        lines.append(
            f"- {len(flagged)} run(s) flagged: batches/s more than {_percent(OUTLIER_TOLERANCE)} away from their "
            "repeats or, at one worker, from the runs that do the same work (listed under Flagged runs)"
        )
    return lines


def text_table(rows: list[dict[str, Any]]) -> str:
    """The medians of every configuration as a plain-text table for a terminal."""
    header = ("strategy", "batch", "workers", "batches/s [min–max]", "speedup", "common speedup", "flagged")
    lines = [header]
    for group in group_rows(rows):
        flagged = sum(1 for row in group.rows if row.get("flag"))
        lines.append(
            (
                group.strategy,
                str(group.batch_size),
                str(group.workers),
                _cell(group, "batches_per_second", digits=1),
                _cell(group, "speedup", with_spread=False),
                _cell(group, "speedup_common", with_spread=False),
                f"{flagged} of {len(group.rows)}" if flagged else "",
            )
        )
    widths = [max(len(line[column]) for line in lines) for column in range(len(header))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if column < 1 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(line, widths, strict=True))
        ).rstrip()
        for line in lines
    )


def _cell(group: Group, field: str, scale: float = 1.0, digits: int = 2, *, with_spread: bool = True) -> str:
    median = group.median(field)
    if median is None:
        return "–"
    low, high = group.spread(field)
    text = f"{median * scale:.{digits}f}"
    if with_spread and len(group.rows) > 1:
        text += f" [{low * scale:.{digits}f}–{high * scale:.{digits}f}]"
    return text


def write_report(rows: list[dict[str, Any]], notes: list[str], out: Path, *, title: str, pictures: list[Path]) -> Path:
    """Write ``out/report.md`` and return its path."""
    groups = group_rows(rows)
    failed = [row for row in rows if row.get("status") != "ok"]
    first = next((row for row in rows if row.get("status") == "ok"), rows[0] if rows else {})
    lines = [f"# {title}", ""]
    lines += [
        f"Measured on {first.get('cpu_model', '?')} ({first.get('isa') or 'ISA not recorded'}, "
        f"{first.get('cores', '?')} cores), torch "
        f"{first.get('torch_version', '?')}, network: {first.get('network', '?')}; "
        f"{first.get('threads_per_worker', '?')} thread(s) per process. {len(rows)} runs, {len(failed)} failed. "
        "Throughput is SPEC eq. 4.1 (batches of the batch size processed by all workers per second, warm-up "
        "left out; a short unmeasured warm-up run precedes the first measured run). Speedup is eq. 4.2 against "
        "the same strategy and batch size at one worker; common speedup is against one reference for all "
        "strategies, the median of the one-worker runs that do the same work at the batch size (one process "
        "that exchanges nothing: all-reduce and the sharded server; a central server adds a process). Cells show "
        "the median over repeats and [min–max]. A run is flagged when its batches/s is more than "
        f"{_percent(OUTLIER_TOLERANCE)} away from the median of its repeats (from the other one when there are "
        "two) or, at one worker, likewise from the one-worker runs that do the same work.",
        "",
    ]
    lines += [f"- Note: {note}" for note in notes]
    lines += ["", "## Reading", ""]
    lines += reading(rows)
    lines += ["", "## Results", ""]
    lines.append(
        "| strategy | batch | workers | batches/s | speedup | common speedup | efficiency | compute ms | comm. ms "
        "| wait ms | data ms | quality |"
    )
    lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for group in groups:
        metric = group.rows[0].get("metric", "quality")
        lines.append(
            f"| {group.strategy} | {group.batch_size} | {group.workers} "
            f"| {_cell(group, 'batches_per_second', digits=1)} "
            f"| {_cell(group, 'speedup')} | {_cell(group, 'speedup_common')} | {_cell(group, 'efficiency')} "
            f"| {_cell(group, 'compute_seconds_per_step', 1000, 1)} "
            f"| {_cell(group, 'communication_seconds_per_step', 1000, 1)} "
            f"| {_cell(group, 'wait_seconds_per_step', 1000, 1)} | {_cell(group, 'data_seconds_per_step', 1000, 1)} "
            f"| {metric} {_cell(group, 'quality', digits=3)} |"
        )
    lines += ["", "## Pictures", ""]
    lines += [f"![{path.stem}]({path.name})" for path in pictures]
    flagged = [row for row in rows if row.get("flag")]
    if flagged:
        lines += ["", "## Flagged runs", ""]
        lines += [
            f"- {row['strategy']} b{row['batch_size']} ×{row['workers']} (repeat {row.get('repeat', 0) + 1}): "
            f"{row['batches_per_second']:.1f} batches/s, {row['flag']}"
            for row in flagged
        ]
    warned = [row for row in rows if row.get("quality_warning")]
    if warned:  # at chance although the loss fell: the evaluated model does not show what training did
        lines += ["", "## Runs whose quality is at chance level", ""]
        lines += [
            f"- {row['strategy']} b{row['batch_size']} ×{row['workers']}: {row['quality_warning']}" for row in warned
        ]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {row['strategy']} b{row['batch_size']} ×{row['workers']}: {row.get('error')}" for row in failed]
    path = out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
