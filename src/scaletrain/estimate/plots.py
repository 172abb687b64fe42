"""Pictures of predicted speedup curves, with measured points when there are some."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display needed

import matplotlib.pyplot as plt

__all__ = ["plot_curves"]

MODEL_STYLES = {"thesis": "--", "refined": "-"}


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
    label, n)``), the measured speedups as points, and the ideal speedup = N."""
    columns = min(3, len(labels))
    rows = math.ceil(len(labels) / columns)
    figure, grid = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    workers = list(range(1, max_workers + 1))
    for index, label in enumerate(labels):
        axes = grid[index // columns][index % columns]
        axes.plot(workers, workers, color="grey", linestyle=":", linewidth=1, label="ideal")
        for model in models:
            axes.plot(
                workers,
                [predict(model, label, n) for n in workers],
                linestyle=MODEL_STYLES.get(model, "-."),
                marker=".",
                label=f"{model} model",
            )
        points = sorted((n, value) for (name, n), value in (measured or {}).items() if name == label)
        if points:
            axes.plot([n for n, _ in points], [v for _, v in points], "ko", label="measured (median)")
        axes.set_title(label, fontsize="medium")
        axes.set_xticks(workers if max_workers <= 12 else workers[:: max(1, max_workers // 12)])
        axes.set_xlabel("workers")
        axes.set_ylabel("speedup")
        axes.grid(True, alpha=0.3)
        if index == 0:
            axes.legend(fontsize="x-small")
    for index in range(len(labels), rows * columns):
        grid[index // columns][index % columns].axis("off")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
