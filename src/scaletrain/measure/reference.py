"""The one-process reference as a run measures it: short real training runs of one process, timed as a sweep's
one-worker run is (its batches per second past the warm-up), each in a fresh process as the sweep starts it.

Every predicted speedup is a rate over this reference, so an error in it moves every row of a validation alike.
Modelled as the probe's t_grad + t_update, it missed what one-process runs took a batch by −25 % to +12 % on one
machine (held-out round 7, 2026-12-06) and by +5 to +7 % on another the same day, while the 2-worker steps were
predicted within a few per cent: the probe times forward and backward of one fixed batch back to back, where a run
also fetches a fresh batch, clears the gradients, checks the loss, steps its schedule and keeps its books, in a
process started as the sweep starts it. docs/prediction.md says more.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from scaletrain.measure.sweep import train_in_fresh_process

__all__ = ["REFERENCE_STEPS", "time_reference"]

#: measured steps of each reference run, past its warm-up (at least the profile's ``repeats``)
REFERENCE_STEPS = 20


def reference_settings(config: Any, batch_size: int, out: Path) -> dict[str, Any]:
    """The :func:`scaletrain.train` settings of one reference run of ``config`` (a
    :class:`~scaletrain.measure.profile.ProfileConfig`, which imports this module).

    >>> from scaletrain.measure.profile import ProfileConfig
    >>> settings = reference_settings(ProfileConfig("lenet", warmup=3, repeats=10), 64, Path("out"))
    >>> [settings[key] for key in ("workers", "batch_size", "steps", "warmup_steps", "threads")]
    [1, 64, 23, 3, 1]
    """
    chosen = {
        "lr": config.lr,
        "momentum": config.momentum,
        "optimizer": config.optimizer,
        "optimizer_options": dict(config.optimizer_options) or None,
    }
    return {
        **{key: value for key, value in chosen.items() if value is not None},
        "workers": 1,
        "batch_size": batch_size,
        "steps": config.warmup + max(config.repeats, REFERENCE_STEPS),
        "warmup_steps": config.warmup,
        "threads": config.threads,
        "options": dict(config.options),
        "data_dir": config.data_dir,
        "download": config.download,
        "precision": config.precision,
        "memory_format": config.memory_format,
        "device": config.device,
        "progress": "off",
        "tensorboard": False,
        "out": out,
    }


def time_reference(config: Any, batch_size: int) -> list[float]:
    """Seconds a batch of one process training alone, one value per launch (``config.launches`` runs); empty for a
    profile of a network a run left (``architecture``): training starts from the workload's own network."""
    if config.architecture:
        return []
    seconds = []
    for _ in range(config.launches):
        with tempfile.TemporaryDirectory(prefix="scaletrain-reference-") as folder:
            summary = train_in_fresh_process(config.workload, reference_settings(config, batch_size, Path(folder)))
        seconds.append(1.0 / summary["batches_per_second"])
    return seconds
