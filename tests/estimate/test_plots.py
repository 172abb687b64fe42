"""The speedup picture stays readable: the whole title inside the figure, few x ticks that never run together."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import pytest

from scaletrain.estimate.plots import draw_curves, plot_curves
from scaletrain.estimate.thesis import speedups

LONG_TITLE = "Predicted speedup (thesis model, mean case, D = 128) of a rather long configuration name"


def curve(workers: int) -> list[float]:
    return speedups(t_grad=0.821, t_comm=0.811, kind="sync-join", server="distributed", workers=workers, batches=128)


def tick_labels(axes, renderer):
    low, high = axes.get_xlim()
    return [
        label.get_window_extent(renderer)
        for label, tick in zip(axes.get_xticklabels(), axes.get_xticks(), strict=True)
        if label.get_text() and low <= tick <= high
    ]


@pytest.mark.parametrize(("workers", "panels"), [(10_000, 1), (10_000, 4), (3, 1), (12, 2)])
def test_title_inside_and_ticks_apart(workers, panels):
    values = curve(workers)
    labels = [f"ps-sharded-join-{index}" for index in range(panels)]
    figure = draw_curves(
        labels=labels, max_workers=workers, predict=lambda model, label, n: values[n - 1], title=LONG_TITLE
    )
    try:
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        title = figure.get_suptitle()
        extent = figure._suptitle.get_window_extent(renderer)
        assert title.replace("\n", " ") == LONG_TITLE
        assert figure.bbox.x0 <= extent.x0 and extent.x1 <= figure.bbox.x1
        assert figure.bbox.y0 <= extent.y0 and extent.y1 <= figure.bbox.y1
        for axes in figure.axes[:panels]:
            ticks = tick_labels(axes, renderer)
            assert 2 <= len(ticks) <= 8
            for left, right in itertools.pairwise(ticks):
                assert left.x1 < right.x0, "tick labels overlap"
            assert all(float(label.get_text().replace("−", "-")).is_integer() for label in axes.get_xticklabels())
    finally:
        plt.close(figure)


def test_plot_file_is_a_png(tmp_path):
    values = curve(50)
    path = plot_curves(tmp_path / "deep" / "curve.png", labels=["ps-sharded-join"], max_workers=50,
                       predict=lambda model, label, n: values[n - 1], models=("thesis",))  # fmt: skip
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
