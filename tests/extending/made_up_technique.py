"""A technique of one's own, in one module with one registry line: an L2 penalty on every weight, added to
the objective — (strength / 2) · Σ w² — so its gradient adds strength · w to every weight's gradient, which
is exactly what SGD's own ``weight_decay`` does (that is how a test can tell it worked).

Chosen with ``--technique l2 --l2-strength 1e-2`` (or ``-T strength=1e-2``; from Python
``scaletrain.train(..., technique="l2", l2_strength=1e-2)``) once ``SCALETRAIN_PLUGINS`` names this module;
the flag, its help and its type come from the option declared below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from scaletrain.efficient import TECHNIQUES, Technique, option
from scaletrain.errors import ConfigError


@dataclass
class L2Penalty(Technique):
    """The objective gains (strength / 2) · Σ w² over every parameter."""

    name = "l2"
    strength: float = option(0.0, flag="l2_strength", help="the objective gains strength/2 times every weight squared")

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if not options["strength"] > 0:
            raise ConfigError(f"l2: strength must be > 0, got {options['strength']}")

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        penalty = sum(parameter.pow(2).sum() for parameter in model.parameters())
        return loss + (self.strength / 2) * penalty


TECHNIQUES["l2"] = L2Penalty
