"""``pruning.png``: how a network that changed shape while training changed, epoch by epoch.

Two panels from ``metrics.jsonl``'s epoch records: the parameter count at each epoch's end and the
measured training seconds of each epoch, with a mark at every reconfiguration (where the parameters
drop or grow). Written next to ``summary.json`` when a technique reconfigured the network.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["PRUNING_PICTURE", "plot_reconfigurations"]

PRUNING_PICTURE = "pruning.png"


def plot_reconfigurations(metrics: Path, out: Path) -> Path | None:
    """Draw ``out`` from the records in ``metrics``; ``None`` (and nothing written) without epochs."""
    records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
    epochs = [r for r in records if r.get("kind") == "epoch" and "parameters" in r]
    if not epochs:
        return None
    # matplotlib only when drawing: every process of a run imports this module (a third of a second each)
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    changes = [r["epoch"] + 1 for r in records if r.get("kind") == "reconfiguration"]
    numbers = [r["epoch"] + 1 for r in epochs]
    figure, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(6.4, 5.6))
    top.plot(numbers, [r["parameters"] for r in epochs], marker="o")
    top.set_ylabel("parameters (end of epoch)")
    bottom.plot(numbers, [r["seconds"] for r in epochs], marker="o", color="tab:orange")
    bottom.set_ylabel("training seconds per epoch")
    bottom.set_xlabel("epoch")
    for axes in (top, bottom):
        axes.grid(alpha=0.3)
        for epoch in changes:
            axes.axvline(epoch + 0.5, color="grey", linestyle=":", linewidth=1)
    top.set_title("network size and time per epoch (dotted: reconfigurations)")
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)
    return out
