"""A finished run's trained network, made again from its folder: ``summary.json`` says which workload, with which
options and reshaped how; ``model.pt`` holds the weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaletrain.efficient.surgery import apply_architecture
from scaletrain.errors import ConfigError
from scaletrain.train.summary import MODEL_NAME, SUMMARY_NAME
from scaletrain.workloads import Workload, create_workload

__all__ = ["load_model", "run_summary"]


def load_model(out: Path | str, *, workload: str | Workload | None = None) -> nn.Module:
    """The trained network of run folder ``out``, in eval mode: the workload's network (with the
    options of ``summary.json``), resized to the architecture a technique left (``summary.json``'s
    ``architecture``: pruned channels, removed blocks), with the weights of ``model.pt``.

    The run's workload is made again from what ``summary.json`` records (``reference``: a registered
    name, an installed package's workload, or ``module:attribute``). A run of a workload object has no
    reference: pass the object (or a name or reference that makes the same network) as ``workload``.

    >>> model = scaletrain.load_model("runs/resnet20-prunetrain")  # doctest: +SKIP
    >>> model = scaletrain.load_model("runs/mine", workload=mine)  # doctest: +SKIP
    """
    folder = Path(out)
    summary = run_summary(folder)
    if workload is None:
        # a summary written before references were recorded names a registered workload
        workload = summary["reference"] if "reference" in summary else summary["workload"]
        if workload is None:
            raise ConfigError(
                f"{folder} is a run of a workload object ({summary['workload']!r}), which scaletrain cannot make "
                f"again by itself; pass it: scaletrain.load_model({str(out)!r}, workload=the_object)"
            )
    if not isinstance(workload, Workload):
        workload = create_workload(workload, summary.get("options") or {})
    if workload.name != summary["workload"]:
        raise ConfigError(
            f"{folder} is a run of workload {summary['workload']!r}, not {workload.name!r}; "
            "pass the workload it trained"
        )
    model = workload.build_model()
    apply_architecture(model, summary.get("architecture") or {})
    model.load_state_dict(torch.load(folder / MODEL_NAME, map_location="cpu", weights_only=True))
    return model.eval()


def run_summary(folder: Path) -> dict[str, Any]:
    """``summary.json`` of run folder ``folder``; a missing or unreadable one is refused naming the fix."""
    try:
        return json.loads((folder / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{folder} holds no readable {SUMMARY_NAME} ({exc}); give the folder of a finished run"
        ) from None
