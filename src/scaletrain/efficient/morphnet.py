"""``morphnet``: shrink under a resource-weighted penalty, then widen uniformly back to a resource target.

Method card. *What*: MorphNet (Gordon et al., CVPR 2018, "MorphNet: fast & simple resource-constrained
structure learning of deep networks"; its only public code is for TensorFlow 1). Each round: for
``every`` epochs, a sparsifying penalty on the batch norms after every convolution and linear layer —
per channel (|γ| + |β|) times what that channel costs in the chosen resource (FLOPs per sample, or
parameters: the producing layer's share for one output channel plus every reading layer's share for
one input channel), so expensive channels are pushed hardest — minimised by its proximal step where
the optimizer steps (soft-thresholding, as PruneTrain's ``batchnorm`` penalty); at the round's end,
the channels whose batch norms output zero go (PruneTrain's channel union: residual sums and
concatenations keep a channel while any member needs it), and every group of channels is widened by
one uniform multiplier (Net2WiderNet copies, the function unchanged) chosen by bisection so that the
network costs the target again. ``rounds`` rounds, then training goes on without the penalty.
*When it helps*: the same FLOPs (``target=1``) spent where they help accuracy most, or a smaller
target met with a better shape than uniform narrowing; the paper gains 2–4 % top-1 on Inception V2
at equal FLOPs. *Source*: the paper's Algorithm 1 (shrink with the resource-weighted regulariser,
expand with a width multiplier, repeat); the γ regulariser follows their "GammaFlopsRegularizer".
The penalty weight λ (``strength``) multiplies the costs normalised to a mean of 1.

Options (``--technique morphnet -T target=1.0 -T resource=flops -T strength=1e-3 -T threshold=1e-3
-T every=2 -T rounds=1``): ``target`` — the resource after each expansion, as a fraction of the
network's at the start.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.channels import channel_count, channel_groups, dead_channel_pruning
from scaletrain.efficient.cost import layer_flops, resource
from scaletrain.efficient.net2net import applied, composed, expansion_decision
from scaletrain.efficient.prunetrain import following_norms, shrink_values
from scaletrain.errors import ConfigError

__all__ = ["MorphNet", "channel_costs"]

RESOURCES = ("flops", "parameters")


def channel_costs(model: nn.Module, example_inputs: Any, kind: str = "flops") -> dict[str, float]:
    """``{batch-norm path: what one channel costs}`` for every batch norm right after a layer whose
    outputs can change: the layer's resource for one output channel plus, for every layer reading
    those channels, its resource for one input channel (FLOPs per sample, or weights).

    >>> net = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3), nn.ReLU(), nn.Linear(3, 2))
    >>> channel_costs(net, torch.zeros(2, 4))  # (2·4·3)/3 + (2·3·2)/3 FLOPs
    {'1': 12.0}
    """
    if kind == "flops":
        per_layer = layer_flops(model, example_inputs)
    else:
        per_layer = {name: float(m.weight.numel()) for name, m in model.named_modules() if hasattr(m, "weight")}
    norms = following_norms(model, example_inputs)
    costs: dict[str, float] = {}
    for group in channel_groups(model, example_inputs):
        cost = 0.0
        for member in group.members:
            if member.role == "writes" or member.role == "reads":
                module = model.get_submodule(member.path)
                indices = max(len(indices) for indices in member.indices)  # a flattened map: many inputs each
                cost += per_layer.get(member.path, 0.0) / channel_count(module, member.dim) * indices
        for member in group.members:
            if member.role == "writes" and member.path in norms:
                costs[norms[member.path]] = cost
    return costs


@dataclass
class MorphNet(Technique):
    """The adapter: the penalty's proximal step after each update during a round; shrink + expand at its end."""

    target: float = 1.0
    resource: str = "flops"
    strength: float = 1e-3
    threshold: float = 1e-3
    every: int = 2
    rounds: int = 1
    name = "morphnet"
    initial: float | None = field(default=None, init=False)  # the resource at the start
    history: list[dict[str, Any]] = field(default_factory=list, init=False)
    _costs: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    _context: Context = field(default_factory=Context, init=False, repr=False)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if options["resource"] not in RESOURCES:
            raise ConfigError(f"morphnet: resource must be one of {', '.join(RESOURCES)}, got {options['resource']!r}")
        if not options["target"] > 0 or not math.isfinite(options["target"]):
            raise ConfigError(
                f"morphnet: target is a positive fraction of the starting network, got {options['target']}"
            )
        if options["strength"] < 0 or options["threshold"] < 0 or options["every"] < 1 or options["rounds"] < 1:
            raise ConfigError("morphnet: strength and threshold must be ≥ 0, every and rounds ≥ 1")

    def start(self, model: nn.Module, context: Context) -> None:
        self._context = context
        example = context.example_inputs()
        if self.initial is None:
            self.initial = resource(model, example, self.resource)
        self._set_costs(model, example)
        if not self._costs:
            raise ConfigError("morphnet: the network has no batch norm after a layer whose width can change")

    def _set_costs(self, model: nn.Module, example: Any) -> None:
        costs = channel_costs(model, example, self.resource)
        mean = sum(costs.values()) / len(costs) if costs else 1.0
        self._costs = {norm: cost / mean for norm, cost in costs.items()}

    def shrinking(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) is in a round (every process knows its epoch, so all agree)."""
        return epoch < self.rounds * self.every

    def after_update(self, parameters: dict[str, torch.Tensor], lr: float) -> None:
        if not self.shrinking(self._context.epoch()):
            return
        base = lr * self.strength / (1 - self._context.momentum)  # as PruneTrain's proximal step weighs it
        for norm, cost in self._costs.items():
            for kind in ("weight", "bias"):
                values = parameters.get(f"{norm}.{kind}")
                if values is not None:
                    shrink_values(values, base * cost)

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        if not self.shrinking(end.epoch) or (end.epoch + 1) % self.every:
            return None
        example = self._context.example_inputs()
        norms = following_norms(model, example)
        pruning = dead_channel_pruning(model, channel_groups(model, example), self.threshold, norms)
        shrink = Reconfiguration(keep=pruning.keep, remove=pruning.remove)
        shrunk = applied(model, shrink)
        target = self.target * (self.initial or resource(model, example, self.resource))
        expand, reached = expansion_decision(shrunk, example, target, self.resource)
        self.history.append(
            {
                "epoch": end.epoch,
                "before": resource(model, example, self.resource),
                "shrunk": resource(shrunk, example, self.resource),
                "expanded": reached,
                "target": target,
            }
        )
        decision = shrink if expand is None else composed(shrink, expand)
        return decision if decision.changes_network else None

    def reconfigured(self, model: nn.Module) -> None:
        self._set_costs(model, self._context.example_inputs())

    def state_dict(self) -> dict[str, Any]:
        return {"initial": self.initial, "history": self.history}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.initial = state.get("initial")
        self.history = list(state.get("history", []))
