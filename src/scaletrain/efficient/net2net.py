"""``net2net``: grow a network while it trains without changing what it computes (Chen, Goodfellow and Shlens,
"Net2Net: accelerating learning via knowledge transfer", ICLR 2016, §2.2–2.3).

**Net2WiderNet** gives a layer more output channels, each a copy of a randomly chosen existing one (its weights,
bias and batch-norm parameters and statistics), and divides the inputs of every layer that reads those channels by
how many times each was copied, so the network computes the same function; optional noise on the copies lets them
drift apart. The channels that must change together (across batch norms, residual sums, concatenations and
flattening) come from PruneTrain's dependency analysis (:func:`~scaletrain.efficient.channels.channel_groups`).
**Net2DeeperNet** inserts an identity layer into an ``nn.Sequential``: after a residual block, a copy of that block
whose last batch norm is zeroed, as Goyal et al. (2017) start residual branches (the branch adds nothing, and the
closing ReLU leaves the previous block's non-negative output as it is); elsewhere an identity convolution or linear
layer, followed by a ReLU only right after one (relu(relu(x)) = relu(x); after another activation the new layer
stays linear). Copied channels' momentum is carried and divided
like their weights; inserted layers start without momentum. It is meant for starting narrow or shallow (cheap
epochs) and growing once the small network has learned what it can; docs/techniques.md has what that bought here.

Options (``--technique net2net -T plan="2:wider:features.0:40;3:deeper:features.1" -T noise=0.01``): ``plan``,
``;``-separated, one step per epoch, epochs counted from 1: ``EPOCH:wider:LAYER:WIDTH`` (the layer's new number of
output channels), ``EPOCH:wider-all:FACTOR`` (every group of channels times FACTOR) or ``EPOCH:deeper:MODULE``
(insert after that module); ``noise`` (relative to each layer's weights' standard deviation, default 0); ``seed``.
From Python, :func:`wider_decision` and :func:`deeper_decision` return the
:class:`~scaletrain.efficient.base.Reconfiguration`; :func:`widen` and :func:`deepen` apply it.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.channels import ChannelGroup, channel_count, channel_groups, is_residual_block
from scaletrain.efficient.cost import resource
from scaletrain.efficient.surgery import reconfigure
from scaletrain.errors import ConfigError

__all__ = [
    "Net2Net",
    "applied",
    "apply_decision",
    "composed",
    "deepen",
    "deeper_decision",
    "expansion_decision",
    "parse_plan",
    "uniform_wider_decision",
    "widen",
    "wider_decision",
]

_CONVS = {nn.Conv1d: 1, nn.Conv2d: 2, nn.Conv3d: 3}
_LAYERS = (nn.Linear, *_CONVS)


def wider_decision(
    model: nn.Module, layer: str, width: int, example_inputs: Any, *, noise: float = 0.0, seed: int = 0
) -> Reconfiguration:
    """Net2WiderNet: ``layer`` (and everything that shares its output channels) gets ``width`` output
    channels, the new ones copies of randomly chosen old ones (``seed``); readers' inputs are divided
    by the copy counts. The function is unchanged when ``noise`` is 0.

    >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 1))
    >>> wider_decision(net, "0", 4, torch.zeros(1, 3), seed=1).keep["2"]
    {'in': [0, 1, 0, 0]}
    """
    group = next(
        (g for g in channel_groups(model, example_inputs) for m in g.members if (m.path, m.dim) == (layer, "out")),
        None,
    )
    if group is None:
        raise ConfigError(f"net2net: {layer} has no output channels that can grow (not a layer, or the output layer)")
    if width <= group.size:
        raise ConfigError(f"net2net: {layer} has {group.size} channels already; give a larger width than that")
    keep: dict[str, dict[str, list[int]]] = {}
    scale: dict[str, dict[str, list[float]]] = {}
    _grow_group(model, group, width, random.Random(seed), keep, scale)
    return Reconfiguration(keep=keep, scale=scale, noise=noise, seed=seed)


def uniform_wider_decision(
    model: nn.Module,
    factor: float,
    example_inputs: Any,
    *,
    noise: float = 0.0,
    seed: int = 0,
    groups: list[ChannelGroup] | None = None,
) -> Reconfiguration:
    """Net2WiderNet on every group of channels at once: each grows to ``round(size * factor)`` (a
    uniform width multiplier, as MorphNet's expansion and PruneTrain + Net2Net re-widening use);
    ``groups``: :func:`channel_groups` of ``model`` when already traced.

    >>> net = nn.Sequential(nn.Linear(3, 2), nn.ReLU(), nn.Linear(2, 4), nn.ReLU(), nn.Linear(4, 1))
    >>> decision = uniform_wider_decision(net, 1.5, torch.zeros(1, 3))
    >>> len(decision.keep["0"]["out"]), len(decision.keep["2"]["out"])
    (3, 6)
    """
    if factor <= 1:
        raise ConfigError(f"net2net: a width multiplier grows the network only above 1, got {factor}")
    generator = random.Random(seed)
    keep: dict[str, dict[str, list[int]]] = {}
    scale: dict[str, dict[str, list[float]]] = {}
    for group in groups if groups is not None else channel_groups(model, example_inputs):
        width = round(group.size * factor)
        if width > group.size:
            _grow_group(model, group, width, generator, keep, scale)
    return Reconfiguration(keep=keep, scale=scale, noise=noise, seed=seed)


def _grow_group(
    model: nn.Module,
    group: ChannelGroup,
    width: int,
    generator: random.Random,
    keep: dict[str, dict[str, list[int]]],
    scale: dict[str, dict[str, list[float]]],
) -> None:
    """Add to ``keep`` and ``scale`` what grows ``group`` to ``width`` channels (copies drawn from
    ``generator``); the groups of one network touch different (module, dimension) pairs."""
    mapping = list(range(group.size)) + [generator.randrange(group.size) for _ in range(width - group.size)]
    counts = Counter(mapping)
    for member in group.members:
        mine = [index for channel in range(group.size) for index in member.indices[channel]]
        if not mine:
            continue
        size = channel_count(model.get_submodule(member.path), member.dim)
        copies = [index for channel in mapping[group.size :] for index in member.indices[channel]]
        last = max(mine)  # the copies go right after this member's last index of the group
        order = [*range(last + 1), *copies, *range(last + 1, size)]
        keep.setdefault(member.path, {})[member.dim] = order
        if member.role == "reads":
            factor = {index: 1.0 / counts[c] for c in range(group.size) for index in member.indices[c]}
            scale.setdefault(member.path, {})[member.dim] = [factor.get(index, 1.0) for index in order]


def deeper_decision(model: nn.Module, after: str, kernel: int = 3) -> Reconfiguration:
    """Net2DeeperNet: insert an identity layer right after module ``after`` (a child of an
    ``nn.Sequential``): a zeroed copy of ``after`` when it is a residual block, else an identity
    ``kernel``-sized convolution or linear layer over the channels of the last layer up to ``after``.

    >>> net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 1))
    >>> deeper_decision(net, "1").insert
    {'2': {'kind': 'linear', 'channels': 5, 'kernel': 1, 'relu': 1}}
    """
    parent_path, _, index = after.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential) or not index.isdigit():
        raise ConfigError(f"net2net: {after} is not a module inside an nn.Sequential; name one that is")
    position = int(index)
    module = parent[position]
    target = f"{parent_path}.{position + 1}" if parent_path else str(position + 1)
    if is_residual_block(module):
        if not isinstance(module.shortcut, nn.Identity):
            raise ConfigError(
                f"net2net: block {after} changes the shape (its shortcut is a projection); deepen after a block "
                "whose shortcut is an identity"
            )
        return Reconfiguration(insert={target: {"kind": "block"}})
    layer = next(
        (
            m
            for earlier in reversed(list(parent)[: position + 1])
            for m in reversed(list(earlier.modules()))
            if isinstance(m, _LAYERS)
        ),
        None,
    )
    if layer is None:
        raise ConfigError(f"net2net: no convolution or linear layer up to {after} tells how many channels to keep")
    relu = int(isinstance(module, nn.ReLU))
    if isinstance(layer, nn.Linear):
        return Reconfiguration(
            insert={target: {"kind": "linear", "channels": layer.out_features, "kernel": 1, "relu": relu}}
        )
    if kernel < 1 or kernel % 2 == 0:
        raise ConfigError(f"net2net: the inserted convolution's kernel must be odd (it keeps the size), got {kernel}")
    spec = {"kind": "conv", "channels": layer.out_channels, "kernel": kernel, "dims": _CONVS[type(layer)]}
    return Reconfiguration(insert={target: {**spec, "relu": relu}})


def widen(model: nn.Module, layer: str, width: int, example_inputs: Any, **options: Any) -> nn.Module:
    """Apply :func:`wider_decision` to ``model`` in place (no optimizer: for use outside training)."""
    apply_decision(model, wider_decision(model, layer, width, example_inputs, **options))
    return model


def deepen(model: nn.Module, after: str, kernel: int = 3) -> nn.Module:
    """Apply :func:`deeper_decision` to ``model`` in place (no optimizer: for use outside training)."""
    apply_decision(model, deeper_decision(model, after, kernel))
    return model


def apply_decision(model: nn.Module, decision: Reconfiguration) -> None:
    """Apply ``decision`` to ``model`` in place, outside training (a throwaway optimizer)."""
    reconfigure(model, torch.optim.SGD(model.parameters(), lr=0.0), decision, lambda p: torch.optim.SGD(p, lr=0.0))


def applied(model: nn.Module, decision: Reconfiguration) -> nn.Module:
    """A copy of ``model`` as ``decision`` leaves it (``model`` itself is not changed)."""
    network = copy.deepcopy(model)
    if decision.changes_network:
        apply_decision(network, decision)
    return network


def composed(first: Reconfiguration, second: Reconfiguration) -> Reconfiguration:
    """``first`` (resizes and removals) then ``second`` (resizes of the network ``first`` leaves) as one
    decision: each module's kept indices are the first's, picked by the second's.

    >>> a = Reconfiguration(keep={"0": {"out": [0, 2, 3]}})
    >>> b = Reconfiguration(keep={"0": {"out": [0, 1, 2, 1]}}, scale={"1": {"in": [1.0, 0.5, 1.0, 0.5]}})
    >>> composed(a, b).keep
    {'0': {'out': [0, 2, 3, 2]}}
    """
    keep = {path: dict(dims) for path, dims in first.keep.items()}
    for path, dims in second.keep.items():
        for dim, order in dims.items():
            base = keep.get(path, {}).get(dim)
            keep.setdefault(path, {})[dim] = list(order) if base is None else [base[index] for index in order]
    return Reconfiguration(keep=keep, remove=first.remove, scale=second.scale, noise=second.noise, seed=second.seed)


def expansion_decision(
    model: nn.Module, example_inputs: Any, target: float, kind: str = "flops", *, steps: int = 24
) -> tuple[Reconfiguration | None, float]:
    """The uniform widening that brings ``model`` closest to ``target`` (FLOPs or parameters) without
    exceeding it by more than the rounding of one channel per group, and the resource it reaches;
    ``None`` when ``model`` costs ``target`` or more already."""
    have = resource(model, example_inputs, kind)
    if have >= target:
        return None, have
    groups = channel_groups(model, example_inputs)

    def grown(factor: float) -> tuple[Reconfiguration, float]:
        decision = uniform_wider_decision(model, factor, example_inputs, groups=groups)
        return decision, resource(applied(model, decision), example_inputs, kind)

    low, high = 1.0, 2.0
    while grown(high)[1] < target and high < 64:
        low, high = high, 2 * high
    best: tuple[Reconfiguration | None, float] = (None, have)
    for _ in range(steps):
        middle = (low + high) / 2
        decision, reached = grown(middle)
        if reached <= target:
            low, best = middle, (decision, reached)
        else:
            high = middle
    above = grown(high)
    if best[0] is None or abs(above[1] - target) < abs(best[1] - target):
        best = above
    return best


def _is_number(text: str) -> bool:
    try:
        return float(text) > 1
    except ValueError:
        return False


def parse_plan(plan: str) -> dict[int, tuple[str, ...]]:
    """``-T plan``: each epoch (counted from 1) and its change, ``("wider", LAYER, WIDTH)``, ``("deeper",
    MODULE)`` or ``("wider-all", FACTOR)``.

    >>> parse_plan("2:wider:features.0:40;3:deeper:features.1")
    {2: ('wider', 'features.0', '40'), 3: ('deeper', 'features.1')}
    """
    if not plan:
        raise ConfigError('technique net2net needs -T plan="EPOCH:wider:LAYER:WIDTH;EPOCH:deeper:MODULE"')
    steps: dict[int, tuple[str, ...]] = {}
    for entry in filter(None, (part.strip() for part in plan.split(";"))):
        parts = tuple(entry.split(":"))
        shapes = {"wider": 4, "deeper": 3, "wider-all": 3}
        if len(parts) < 3 or parts[1] not in shapes or len(parts) != shapes[parts[1]] or not parts[0].isdigit():
            raise ConfigError(
                f"net2net: plan entry {entry!r} must be EPOCH:wider:LAYER:WIDTH, EPOCH:deeper:MODULE or "
                "EPOCH:wider-all:FACTOR"
            )
        if parts[1] == "wider" and not parts[3].isdigit():
            raise ConfigError(f"net2net: plan entry {entry!r}: WIDTH must be a whole number")
        if parts[1] == "wider-all" and not _is_number(parts[2]):
            raise ConfigError(f"net2net: plan entry {entry!r}: FACTOR must be a number above 1")
        epoch = int(parts[0])
        if epoch < 1 or epoch in steps:
            raise ConfigError(f"net2net: plan entry {entry!r}: epochs count from 1, one change per epoch")
        steps[epoch] = parts[1:]
    return steps


@dataclass
class Net2Net(Technique):
    """The adapter: at the end of each planned epoch, the planned change."""

    plan: str = ""
    noise: float = 0.0
    seed: int = 0
    name = "net2net"
    _steps: dict[int, tuple[str, ...]] = field(default_factory=dict, init=False, repr=False)
    _example_inputs: Any = field(default=None, init=False, repr=False)

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        parse_plan(options["plan"])
        if options["noise"] < 0:
            raise ConfigError(f"net2net: noise must be ≥ 0, got {options['noise']}")

    def __post_init__(self) -> None:
        super().__post_init__()
        self._steps = parse_plan(self.plan)

    def start(self, model: nn.Module, context: Context) -> None:
        """Check the plan's modules before training: those named up to the first insertion (later paths
        are those of the grown network)."""
        self._example_inputs = context.example_inputs
        for epoch in sorted(self._steps):
            kind, path = self._steps[epoch][:2]
            if kind == "wider-all":
                continue
            try:
                model.get_submodule(path)
            except AttributeError:
                raise ConfigError(
                    f"net2net: plan entry for epoch {epoch}: the network has no module {path!r}"
                ) from None
            if kind == "deeper":
                break

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        step = self._steps.get(end.epoch + 1)
        if step is None:
            return None
        example = self._example_inputs() if self._example_inputs else None
        seed = self.seed + end.epoch
        if step[0] == "wider":
            return wider_decision(model, step[1], int(step[2]), example, noise=self.noise, seed=seed)
        if step[0] == "wider-all":
            return uniform_wider_decision(model, float(step[1]), example, noise=self.noise, seed=seed)
        return deeper_decision(model, step[1])
