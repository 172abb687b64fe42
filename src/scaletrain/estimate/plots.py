"""Pictures of predicted speedup curves, with measured points when there are some."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed

import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

__all__ = ["draw_curves", "plot_curves"]

MODEL_STYLES = {"thesis": "--", "refined": "-"}
TITLE_POINTS = 12


def plot_curves(
    path: Path,
    *,
    labels: list[str],
    max_workers: int,
    predict: Callable[[str, str, int], float],
    measured: dict[tuple[str, int], float] | None = None,
    models: tuple[str, ...] = ("thesis", "refined"),
    title: str = "Predicted speedup",
) -> Path:
    """One panel per configuration label: each model's curve over 1..max_workers (``predict(model,
    label, n)``), the measured speedups as points, and the ideal speedup = N. Written as a PNG."""
    figure = draw_curves(
        labels=labels, max_workers=max_workers, predict=predict, measured=measured, models=models, title=title
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def draw_curves(
    *,
    labels: list[str],
    max_workers: int,
    predict: Callable[[str, str, int], float],
    measured: dict[tuple[str, int], float] | None = None,
    models: tuple[str, ...] = ("thesis", "refined"),
    title: str = "Predicted speedup",
) -> Figure:
    """The figure :func:`plot_curves` writes (the caller closes it)."""
    columns = min(3, len(labels))
    rows = math.ceil(len(labels) / columns)
    # Constrained layout keeps the titles, labels and ticks inside the figure.
    figure, grid = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False, layout="constrained")
    workers = list(range(1, max_workers + 1))
    marker = "." if max_workers <= 40 else None  # thousands of markers would smear into one thick line
    for index, label in enumerate(labels):
        axes = grid[index // columns][index % columns]
        axes.plot(workers, workers, color="grey", linestyle=":", linewidth=1, label="ideal")
        for model in models:
            axes.plot(
                workers,
                [predict(model, label, n) for n in workers],
                linestyle=MODEL_STYLES.get(model, "-."),
                marker=marker,
                label=f"{model} model",
            )
        points = sorted((n, value) for (name, n), value in (measured or {}).items() if name == label)
        if points:
            axes.plot([n for n, _ in points], [v for _, v in points], "ko", label="measured (median)")
        axes.set_title(label, fontsize="medium")
        # Whole worker counts only, and few enough ticks that their labels never run together.
        axes.xaxis.set_major_locator(MaxNLocator(nbins=6, integer=True, min_n_ticks=1))
        axes.set_xlabel("workers")
        axes.set_ylabel("speedup")
        axes.grid(True, alpha=0.3)
        if index == 0:
            axes.legend(fontsize="x-small")
    for index in range(len(labels), rows * columns):
        grid[index // columns][index % columns].axis("off")
    # Wrapped to the figure's width (about 0.6 em per character) so that no end is cut off.
    characters = max(20, int(figure.get_figwidth() * 72 / (TITLE_POINTS * 0.6)))
    figure.suptitle("\n".join(textwrap.wrap(title, characters)), fontsize=TITLE_POINTS)
    return figure
