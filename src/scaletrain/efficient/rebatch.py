"""``rebatch``: a new batch size from a chosen epoch on, with the learning rate scaled to match.

Method card. *What*: at the end of epoch ``epoch`` the batch becomes ``batch_size`` (per worker for
``join``, the global one otherwise); the learning rate is multiplied by the ratio of the batch sizes
(``scaling=linear``, Goyal et al. 2017), its square root (``sqrt``, Krizhevsky 2014), or kept
(``none``). *When it helps*: raising the batch instead of decaying the rate (Smith et al., ICLR 2018)
keeps the hardware busier as training goes on; after pruning, a smaller network leaves room for a
larger batch (004 §3.2.2). The steps per epoch, the position and the rate schedule follow the change
on every process, under every strategy.

Options (``--technique rebatch -T batch_size=64 -T epoch=1 -T scaling=linear``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torch import nn

from scaletrain.efficient.base import EpochEnd, Reconfiguration, Technique
from scaletrain.errors import ConfigError

__all__ = ["Rebatch", "rebatch_decision"]

SCALINGS = ("linear", "sqrt", "none")


def rebatch_decision(old_batch: int, new_batch: int, scaling: str = "linear") -> Reconfiguration:
    """The reconfiguration to batch ``new_batch`` with the learning rate scaled as ``scaling`` says.

    >>> rebatch_decision(32, 128, "sqrt").lr_scale
    2.0
    """
    ratio = new_batch / old_batch
    scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[scaling]
    return Reconfiguration(batch_size=new_batch, lr_scale=scale)


@dataclass
class Rebatch(Technique):
    """The adapter: decides once, after epoch ``epoch`` (counted from 1)."""

    batch_size: int = 0
    epoch: int = 1
    scaling: str = "linear"
    name = "rebatch"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if options["batch_size"] < 1:
            raise ConfigError("technique rebatch needs -T batch_size=N (the new --batch-size, ≥ 1)")
        if options["epoch"] < 1:
            raise ConfigError(f"rebatch: epoch counts from 1, got {options['epoch']}")
        if options["scaling"] not in SCALINGS:
            raise ConfigError(f"rebatch: scaling must be one of {', '.join(SCALINGS)}, got {options['scaling']!r}")

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        if end.epoch + 1 != self.epoch:
            return None
        return rebatch_decision(end.batch_size, self.batch_size, self.scaling)
