"""Which channels of a network must change together, and which of them are dead.

*Groups.* Removing output channel c of a convolution also removes input c of every layer that reads
it, the batch norm between them, and — across a residual sum or a concatenation — the channels the
other operands contribute at the same place. The dependency graph of Torch-Pruning (Fang et al.,
CVPR 2023; ``torch-pruning`` on PyPI, MIT licence) finds these groups for any network built from
standard layers by tracing one forward pass; we use it for the analysis only, and apply the result
with our own surgery (:mod:`scaletrain.efficient.surgery`), which carries the optimizer's momentum
and records the architecture for checkpoints.

*Dead channels* (PruneTrain's channel union, Lym et al. SC'19 §4.3): a group's channel is removed
when every layer that writes it has only weights below the threshold there (nobody produces it) or
every layer that reads it has (nobody uses it); otherwise all members keep it. Removing a channel
nobody reads never changes the network's function; removing one nobody writes drops the constant its
batch norm adds, which is zero when that norm's shift and running mean are zero.

*Blocks.* A module with ``residual`` and ``shortcut`` children (a ResNet block) whose residual branch
holds a group with every channel dead computes ``relu(shortcut(x))`` (up to those constants): the
whole branch goes (see :class:`~scaletrain.efficient.surgery.Bypass`).

The layer that produces the network's output (the classifier) keeps its outputs.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch_pruning as tp
from torch import nn

from scaletrain.efficient.cost import layers_run
from scaletrain.errors import ConfigError

__all__ = [
    "ChannelGroup",
    "Member",
    "Pruning",
    "channel_count",
    "channel_groups",
    "dead_channel_pruning",
    "is_residual_block",
    "residual_blocks",
]

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class Member:
    """One module's part in a group: ``dim`` ``"out"`` or ``"in"``; ``writes`` for a layer producing the
    channels, ``reads`` for one taking them as inputs, ``norm`` for an element-wise layer such as batch
    norm; ``indices[c]``: this module's indices along ``dim`` for the group's channel c (a flattened
    feature map gives a linear layer many inputs per channel)."""

    path: str
    dim: str
    role: str
    indices: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ChannelGroup:
    size: int
    members: tuple[Member, ...]


@dataclass(frozen=True)
class Pruning:
    """What to change: per module and dimension the indices kept, and the blocks removed whole."""

    keep: dict[str, dict[str, list[int]]]
    remove: list[str]


def channel_groups(model: nn.Module, example_inputs: Any) -> list[ChannelGroup]:
    """The groups of ``model`` (traced on a copy in eval mode, so nothing of the model changes)."""
    traced = copy.deepcopy(model).eval()
    names = {module: name for name, module in traced.named_modules()}
    try:
        graph = tp.DependencyGraph().build_dependency(traced, example_inputs=example_inputs, verbose=False)
    except Exception as exc:  # the tracer's errors come in many types
        raise ConfigError(f"cannot trace the network to find which channels depend on each other: {exc}") from None
    groups = []
    for group in graph.get_all_groups(ignored_layers=_output_layers(traced, example_inputs)):
        members = []
        for item in group:
            module = item.dep.target.module
            if module not in names or not isinstance(module, nn.Module):
                continue  # a functional operation between layers
            outward = graph.is_out_channel_pruning_fn(item.dep.handler)
            role = ("writes" if outward else "reads") if isinstance(module, _LAYERS) else "norm"
            per_channel: dict[int, list[int]] = defaultdict(list)
            for index, root in zip(item.idxs, item.root_idxs, strict=True):
                per_channel[root].append(index)
            size = max(per_channel) + 1
            indices = tuple(tuple(per_channel.get(channel, ())) for channel in range(size))
            members.append(Member(names[module], "out" if outward else "in", role, indices))
        if members:
            groups.append(ChannelGroup(max(len(m.indices) for m in members), tuple(members)))
    return groups


def _output_layers(model: nn.Module, example_inputs: Any) -> list[nn.Module]:
    """The last convolution or linear layer the forward pass runs: the network's output layer."""
    return [module for module, _ in layers_run(model, example_inputs)[-1:]]


def is_residual_block(module: nn.Module) -> bool:
    """Whether ``module`` is a residual block the surgery can remove or copy: ``residual``,
    ``shortcut`` and ``relu`` children."""
    return all(isinstance(getattr(module, name, None), nn.Module) for name in ("residual", "shortcut", "relu"))


def residual_blocks(model: nn.Module) -> list[str]:
    """Paths of the modules with ``residual`` and ``shortcut`` children."""
    return [
        name
        for name, module in model.named_modules()
        if name and isinstance(getattr(module, "residual", None), nn.Module) and hasattr(module, "shortcut")
    ]


def dead_channel_pruning(
    model: nn.Module, groups: list[ChannelGroup], threshold: float, norms: dict[str, str] | None = None
) -> Pruning:
    """The channels to remove (see the module docstring); every group keeps at least one channel
    unless its block goes whole. ``norms``: ``{layer path: path of the batch norm its outputs go
    straight into}``; a channel is dead, too, when every layer writing it is followed by one of these
    whose scale and shift are below the threshold there (it outputs zero whatever the layer computes)."""
    weights = {name: module.weight.detach() for name, module in model.named_modules() if isinstance(module, _LAYERS)}
    silent = _silent_norms(model, norms or {}, threshold)
    removed_blocks = [
        block
        for block in residual_blocks(model)
        if any(
            all(m.path.startswith(f"{block}.residual.") for m in group.members)
            and len(_dead(group.members, weights, threshold, silent)) == group.size
            for group in groups
        )
    ]
    gone = tuple(f"{block}.residual." for block in removed_blocks)
    dropped: dict[tuple[str, str], set[int]] = defaultdict(set)
    for group in groups:
        members = [m for m in group.members if not m.path.startswith(gone)]
        if not members:
            continue
        dead = _dead(members, weights, threshold, silent)
        if len(dead) == group.size:  # keep the strongest channel so every layer stays a layer
            dead.discard(max(range(group.size), key=lambda c: _strength(members, weights, c)))
        for member in members:
            for channel in dead:
                dropped[member.path, member.dim].update(member.indices[channel])
    keep: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for (path, dim), indices in sorted(dropped.items()):
        if indices:
            size = channel_count(model.get_submodule(path), dim)
            keep[path][dim] = [index for index in range(size) if index not in indices]
    return Pruning(dict(keep), removed_blocks)


def _silent_norms(model: nn.Module, norms: dict[str, str], threshold: float) -> dict[str, torch.Tensor]:
    """``{layer path: per output channel, whether the batch norm after it outputs (almost) zero}``."""
    silent = {}
    for path, norm_path in norms.items():
        norm = model.get_submodule(norm_path)
        silent[path] = (norm.weight.detach().abs() < threshold) & (norm.bias.detach().abs() < threshold)
    return silent


def _dead(
    members: list[Member] | tuple[Member, ...],
    weights: dict[str, torch.Tensor],
    threshold: float,
    silent: dict[str, torch.Tensor] | None = None,
) -> set[int]:
    size = max(len(m.indices) for m in members)
    silent = silent or {}
    dead = set()
    for channel in range(size):
        for role in ("writes", "reads"):
            sides = [m for m in members if m.role == role and m.indices[channel]]
            if sides and all(_largest(weights[m.path], m, channel) < threshold for m in sides):
                dead.add(channel)
        writers = [m for m in members if m.role == "writes" and m.indices[channel]]
        if writers and all(
            m.path in silent and all(bool(silent[m.path][i]) for i in m.indices[channel]) for m in writers
        ):
            dead.add(channel)
    return dead


def _largest(weight: torch.Tensor, member: Member, channel: int) -> float:
    axis = 0 if member.dim == "out" else 1
    return weight.index_select(axis, torch.tensor(member.indices[channel], device=weight.device)).abs().max().item()


def _strength(members: list[Member], weights: dict[str, torch.Tensor], channel: int) -> float:
    return sum(_largest(weights[m.path], m, channel) for m in members if m.role != "norm" and m.indices[channel])


def channel_count(module: nn.Module, dim: str) -> int:
    """How many channels a Linear, Conv or BatchNorm layer has along ``dim`` (``"out"`` or ``"in"``)."""
    if isinstance(module, nn.Linear):
        return module.out_features if dim == "out" else module.in_features
    if isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        return module.out_channels if dim == "out" else module.in_channels
    return module.num_features
