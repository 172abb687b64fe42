"""``narrow``: shrink one layer to a fraction of its width at the end of a chosen epoch.

Method card. *What*: keeps ``fraction`` of a Linear or Conv layer's output channels (the first
ones, or those of largest L2 norm) and the matching inputs of the layers that read them (through
element-wise activations, dropout and batch norm, which is narrowed too). *When it helps*: a
manual width schedule, and the simplest check of the reconfiguration machinery that PruneTrain,
Net2Net and MorphNet rest on: the network changes shape mid-run under every strategy. *Source*:
none — a utility; channel selection by norm follows the filter-pruning literature (Li et al. 2017).

Options (``--technique narrow -T layer=classifier.1 -T fraction=0.5 -T epoch=1 -T select=first``):
``layer`` (module path, required), ``fraction`` (0 < f < 1, default 0.5), ``epoch`` (after which
epoch, counted from 1; default 1), ``select`` (``first`` or ``norm``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from scaletrain.efficient.base import EpochEnd, Reconfiguration, Technique
from scaletrain.errors import ConfigError

__all__ = ["Narrow", "narrow_decision"]

_PASS_THROUGH = (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU, nn.LeakyReLU, nn.Dropout, nn.Identity, nn.ELU, nn.SiLU)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def narrow_decision(model: nn.Module, layer: str, fraction: float, select: str = "first") -> Reconfiguration:
    """The reconfiguration that keeps ``fraction`` of ``layer``'s output channels (at least one).

    >>> net = nn.Sequential(nn.Linear(4, 6), nn.ReLU(), nn.Linear(6, 2))
    >>> narrow_decision(net, "0", 0.5).keep
    {'0': {'out': [0, 1, 2]}, '2': {'in': [0, 1, 2]}}
    """
    module = model.get_submodule(layer)
    if not isinstance(module, _LAYERS):
        raise ConfigError(f"narrow: {layer} is a {type(module).__name__}; give a Linear or Conv layer")
    width = module.weight.shape[0]
    count = max(1, int(width * fraction))
    if select == "first":
        kept = list(range(count))
    elif select == "norm":
        norms = module.weight.detach().reshape(width, -1).norm(dim=1)
        kept = sorted(torch.topk(norms, count).indices.tolist())
    else:
        raise ConfigError(f"narrow: select must be first or norm, got {select!r}")
    keep: dict[str, dict[str, list[int]]] = {layer: {"out": kept}}
    followers = _followers(model, layer)
    for norm in followers[_NORMS]:
        keep[norm] = {"out": kept}
    readers = followers[_LAYERS]
    if not readers:
        raise ConfigError(f"narrow: no layer reads {layer}'s output directly; it cannot be narrowed alone")
    for reader in readers:
        keep[reader] = {"in": kept}
    return Reconfiguration(keep=keep)


def _followers(model: nn.Module, layer: str) -> dict[tuple[type, ...], list[str]]:
    """The norms and the layers reached from ``layer``'s output through element-wise modules and norms
    (one trace of the network for both)."""
    try:
        graph = fx.symbolic_trace(model).graph
    except Exception as exc:  # fx cannot trace data-dependent control flow
        raise ConfigError(f"narrow: cannot trace the network to find what reads {layer}: {exc}") from None
    start = next((node for node in graph.nodes if node.op == "call_module" and node.target == layer), None)
    if start is None:
        raise ConfigError(f"narrow: {layer} is not called in the network's forward pass")
    found: dict[tuple[type, ...], list[str]] = {_NORMS: [], _LAYERS: []}
    frontier = list(start.users)
    while frontier:
        node = frontier.pop()
        if node.op != "call_module":
            raise ConfigError(
                f"narrow: {layer}'s output goes through {node.name} ({node.op}), which cannot be followed"
            )
        module = model.get_submodule(node.target)
        for kinds, names in found.items():
            if isinstance(module, kinds):
                names.append(node.target)
        if isinstance(module, _PASS_THROUGH + _NORMS):
            frontier.extend(node.users)
        elif not isinstance(module, _LAYERS):
            raise ConfigError(f"narrow: {layer}'s output goes into {node.target} ({type(module).__name__})")
    return found


@dataclass
class Narrow(Technique):
    """The adapter: decides once, after epoch ``epoch``."""

    layer: str = ""
    fraction: float = 0.5
    epoch: int = 1
    select: str = "first"
    name = "narrow"

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if not options["layer"]:
            raise ConfigError("technique narrow needs -T layer=MODULE (a Linear or Conv layer's path)")
        if not 0 < options["fraction"] < 1:
            raise ConfigError(f"narrow: fraction must be between 0 and 1, got {options['fraction']}")
        if options["epoch"] < 1:
            raise ConfigError(f"narrow: epoch counts from 1, got {options['epoch']}")

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        if end.epoch + 1 != self.epoch:
            return None
        return narrow_decision(model, self.layer, self.fraction, self.select)
