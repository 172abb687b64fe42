"""Pictures of a sweep: throughput, speedup and training time over workers, and where the time goes.

Several result sets (``scaletrain compare``) are drawn into the same axes, told apart by line style.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed

import matplotlib.pyplot as plt

from scaletrain.measure.results import Group

__all__ = ["plot_all"]

STYLES = ("-", "--", ":", "-.")


def _series(groups: list[Group]) -> dict[str, list[Group]]:
    by_series = defaultdict(list)
    for group in groups:
        by_series[group.series].append(group)
    return {name: sorted(items, key=lambda g: g.workers) for name, items in sorted(by_series.items())}


def _errors(items: list[Group], field: str) -> list[list[float]]:
    lows, highs = [], []
    for group in items:
        median, (low, high) = group.median(field), group.spread(field)
        lows.append(median - low)
        highs.append(high - median)
    return [lows, highs]


def _line_plot(
    sets: dict[str, list[Group]], path: Path, *, field: str, ylabel: str, title: str, ideal: str | None = None
) -> None:
    figure, axes = plt.subplots(figsize=(8, 5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color_of: dict[str, str] = {}
    max_workers = 1
    counts: set[int] = set()
    for index, (set_name, groups) in enumerate(sets.items()):
        style = STYLES[index % len(STYLES)]
        for name, every in _series(groups).items():
            items = [g for g in every if g.median(field) is not None]  # e.g. no speedup without a one-worker run
            if not items:
                continue
            color = color_of.setdefault(name, colors[len(color_of) % len(colors)])
            workers = [g.workers for g in items]
            counts.update(workers)
            max_workers = max(max_workers, *workers)
            values = [g.median(field) for g in items]
            tag = f"{name} ({set_name})" if len(sets) > 1 else name
            axes.errorbar(
                workers,
                values,
                yerr=_errors(items, field),
                color=color,
                linestyle=style,
                marker="o",
                capsize=3,
                label=tag,
            )
            if ideal == "linear" and items[0].workers == 1 and index == 0:
                axes.plot(
                    [1, max(workers)],
                    [values[0], values[0] * max(workers)],
                    color=color,
                    linestyle=":",
                    linewidth=1,
                    alpha=0.6,
                )
    if ideal == "diagonal":
        axes.plot([1, max_workers], [1, max_workers], color="grey", linestyle=":", label="ideal (speedup = N)")
    if ideal == "linear":
        axes.plot([], [], color="grey", linestyle=":", label="ideal (N × one worker)")
    axes.set_xticks(sorted(counts))
    axes.set_xlabel("workers")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    if axes.get_legend_handles_labels()[0]:  # nothing drawn: no series had this figure
        axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _split_plot(sets: dict[str, list[Group]], path: Path) -> None:
    bars = [(set_name, g) for set_name, groups in sets.items() for g in groups]
    figure, axes = plt.subplots(figsize=(max(6, 0.55 * len(bars) + 2), 5))
    labels, bottoms = [], [0.0] * len(bars)
    for field, name, color in (
        ("compute_seconds_per_step", "compute", "#4c72b0"),
        ("communication_seconds_per_step", "communication", "#dd8452"),
        ("wait_seconds_per_step", "waiting", "#c44e52"),
        ("data_seconds_per_step", "data", "#55a868"),
    ):
        values = [(g.median(field) or 0.0) * 1000 for _, g in bars]
        axes.bar(range(len(bars)), values, bottom=bottoms, color=color, label=name)
        bottoms = [b + v for b, v in zip(bottoms, values, strict=True)]
    for set_name, group in bars:
        prefix = f"{set_name}: " if len(sets) > 1 else ""
        labels.append(f"{prefix}{group.series} ×{group.workers}")
    axes.set_xticks(range(len(bars)), labels, rotation=60, ha="right", fontsize="small")
    axes.set_ylabel("milliseconds per step (median)")
    axes.set_title("Where a worker's step goes")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot_all(sets: dict[str, list[Group]], out: Path) -> list[Path]:
    """Write throughput.png, speedup.png, time.png and split.png into ``out``; returns their paths."""
    paths = [out / name for name in ("throughput.png", "speedup.png", "time.png", "split.png")]
    _line_plot(
        sets,
        paths[0],
        field="batches_per_second",
        ylabel="batches per second (all workers)",
        title="Throughput (SPEC eq. 4.1)",
        ideal="linear",
    )
    _line_plot(
        sets,
        paths[1],
        field="speedup",
        ylabel="speedup over one worker",
        title="Speedup (SPEC eq. 4.2)",
        ideal="diagonal",
    )
    _line_plot(
        sets,
        paths[2],
        field="epoch_seconds",
        ylabel="seconds per epoch (projected from throughput)",
        title="Training time per epoch",
    )
    _split_plot(sets, paths[3])
    return paths
