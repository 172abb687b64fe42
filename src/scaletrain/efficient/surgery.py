"""Applying a :class:`~scaletrain.efficient.base.Reconfiguration` to a network and its optimizer.

Each named module is replaced by a copy whose parameters (and batch-norm statistics) keep the
chosen channels; the SGD momentum of what is kept is carried over, so training continues as if the
dropped channels had never existed. The cumulative sizes (the *architecture*) go into checkpoints,
so a resumed run rebuilds the reconfigured network before loading its weights.

Linear, Conv1d/2d/3d (ungrouped) and BatchNorm1d/2d/3d layers can be resized — shrunk, or grown by
repeating channels (Net2WiderNet), with a factor per channel on the weights and their momentum; anything
else is an error naming the module. A residual block (a module with ``residual`` and ``shortcut``
children and a ``relu``) can be removed: it becomes a :class:`Bypass` that keeps its shortcut under the
same name, so paths into the shortcut stay valid. A module can be inserted into an ``nn.Sequential``
(Net2DeeperNet); the siblings after it move up one. The architecture records a removed block as
``{"removed": 1}`` and an inserted module as ``{"inserted": 1, **spec}``, every path as it is after
all changes; a resume applies insertions first (outer before inner, in ascending position), then
removals, then sizes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.efficient.channels import channel_count, is_residual_block
from scaletrain.efficient.well_formed import check_well_formed, own_copy
from scaletrain.errors import ConfigError

__all__ = [
    "Architecture",
    "Bypass",
    "apply_architecture",
    "identity_module",
    "reconfigure",
    "reshaped_copy",
    "resized_architecture",
]

#: ``{module path: {"out": size, "in": size}}`` (or ``{"removed": 1}`` for a block that went, or
#: ``{"inserted": 1, "kind": ...}`` for a module Net2DeeperNet added) — how the network differs from
#: the workload's own.
Architecture = dict[str, dict[str, int | str]]
REMOVED, INSERTED = "removed", "inserted"


class Bypass(nn.Module):
    """What is left of a residual block whose residual branch was removed: ``relu(shortcut(x))``."""

    def __init__(self, shortcut: nn.Module, relu: nn.Module) -> None:
        super().__init__()
        self.shortcut, self.relu = shortcut, relu

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.relu(self.shortcut(inputs))


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def reconfigure(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    decision: Reconfiguration,
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> torch.optim.Optimizer:
    """Resize ``model``'s modules in place as ``decision`` says; returns a new optimizer over the new
    parameters with the kept part of each parameter's momentum (and every other state tensor of the
    same shape, scaled as the weights are) and the old one's learning rate. Inserted modules start
    without optimizer state."""
    if decision.insert and (decision.keep or decision.remove):
        raise ConfigError("a reconfiguration inserts modules or resizes and removes them, not both at once")
    carried: dict[nn.Parameter, tuple[nn.Parameter, Selection]] = {}
    produced: list[nn.Module] = []
    for path, spec in sorted(decision.insert.items(), key=lambda item: _insertion_order(item[0])):
        produced.append(_insert(model, path, spec))
    for path in decision.remove:
        produced.append(_remove_block(model, path).relu)
    generator = torch.Generator().manual_seed(decision.seed)
    for path, keep in decision.keep.items():
        old = _module(model, path)
        new, mapping = _resized(old, path, keep, decision.scale.get(path, {}))
        if decision.noise and "out" in keep and isinstance(new, (nn.Linear, *_CONVS)):
            _perturb_copies(new, keep["out"], decision.noise, generator)
        _replace(model, path, new)
        produced.append(new)
        carried.update(mapping)
    renewed = make_optimizer(list(model.parameters()))
    for old_group, new_group in zip(optimizer.param_groups, renewed.param_groups, strict=True):
        new_group["lr"] = old_group["lr"]
    old_of = {new: (old, selection) for old, (new, selection) in carried.items()}
    for parameter in model.parameters():
        old, selection = old_of.get(parameter, (parameter, Selection()))
        state = optimizer.state.get(old)
        if not state:
            continue
        renewed.state[parameter] = {
            key: selection.apply(value) if torch.is_tensor(value) and value.shape == old.shape else value
            for key, value in state.items()
        }
    _start_momentum(renewed)
    states = [renewed.state.get(p, {}) for module in produced for p in module.parameters()]
    check_well_formed(
        [(f"{type(m).__name__}.{n}", t) for m in produced for n, t in (*m.named_parameters(), *m.named_buffers())]
        + [(f"optimizer state {key}", v) for state in states for key, v in state.items() if torch.is_tensor(v)]
    )
    return renewed


def reshaped_copy(
    model: nn.Module,
    values: list[torch.Tensor],
    optimizer: torch.optim.Optimizer,
    decision: Reconfiguration,
    make_optimizer: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> tuple[list[nn.Parameter], torch.optim.Optimizer]:
    """``values`` (a tensor per parameter of ``model``, in order) and ``optimizer``'s state over them, reshaped as
    ``decision`` reshapes ``model``: a copy of the network holding ``values`` goes through the same surgery, which
    carries the optimizer's state (momentum: kept channels keep theirs, copied ones are scaled as their weights
    are); its new parameters, and the new optimizer over them. diloco's anchor and outer optimizer go through a
    decision this way.

    >>> net = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1))
    >>> anchor = [nn.Parameter(p.detach().clone()) for p in net.parameters()]
    >>> outer = torch.optim.SGD(anchor, lr=0.7, momentum=0.9)
    >>> for p in anchor:
    ...     outer.state[p]["momentum_buffer"] = torch.arange(p.numel(), dtype=torch.float).reshape(p.shape)
    >>> keep = Reconfiguration(keep={"0": {"out": [0, 2]}, "1": {"in": [0, 2]}})
    >>> new, stepper = reshaped_copy(net, anchor, outer, keep, lambda ps: torch.optim.SGD(ps, lr=0.7, momentum=0.9))
    >>> [tuple(p.shape) for p in new], stepper.state[new[1]]["momentum_buffer"].tolist()
    ([(2, 2), (2,), (1, 2), (1,)], [0.0, 2.0])
    """
    twin = copy.deepcopy(model)
    parameters = list(twin.parameters())
    with torch.no_grad():
        for parameter, value in zip(parameters, values, strict=True):
            parameter.copy_(value)
    stepper = make_optimizer(parameters)
    stepper.load_state_dict(optimizer.state_dict())
    stepper = reconfigure(twin, stepper, decision, make_optimizer)
    return list(twin.parameters()), stepper


def _start_momentum(optimizer: torch.optim.Optimizer) -> None:
    """Fused SGD steps only when every parameter has a momentum buffer or none has: a parameter that
    starts now (an inserted layer) gets a zero buffer, which its next step fills with its gradient just
    as a first step would (``momentum * 0 + gradient``; our SGD has no dampening)."""
    if not any("momentum_buffer" in state for state in optimizer.state.values()):
        return
    for group in optimizer.param_groups:
        if group.get("momentum") and not group.get("dampening"):
            for parameter in group["params"]:
                if optimizer.state[parameter].get("momentum_buffer") is None:
                    optimizer.state[parameter]["momentum_buffer"] = torch.zeros_like(parameter)


def apply_architecture(model: nn.Module, architecture: Architecture) -> None:
    """Resize a freshly built network to ``architecture`` (weights to be loaded afterwards)."""
    inserted = sorted((path for path, sizes in architecture.items() if INSERTED in sizes), key=_insertion_order)
    produced = []
    for path in inserted:
        spec = {key: value for key, value in architecture[path].items() if key != INSERTED}
        produced.append(_insert(model, path, spec))
    for path, sizes in architecture.items():
        if REMOVED in sizes:
            _remove_block(model, path)
    for path, sizes in architecture.items():
        if REMOVED in sizes or INSERTED in sizes:
            continue
        module = _module(model, path)
        # a grown layer takes its extra channels from the first ones: the weights are loaded next anyway
        dims = {dim: [index % channel_count(module, dim) for index in range(size)] for dim, size in sizes.items()}
        new, _ = _resized(module, path, dims)
        _replace(model, path, new)
        produced.append(new)
    check_well_formed(
        [(f"{type(m).__name__}.{n}", t) for m in produced for n, t in (*m.named_parameters(), *m.named_buffers())]
    )


def resized_architecture(architecture: Architecture, decision: Reconfiguration) -> Architecture:
    """``architecture`` after ``decision``: the sizes of every module resized so far."""
    merged = {path: dict(sizes) for path, sizes in architecture.items()}
    for path, spec in sorted(decision.insert.items(), key=lambda item: _insertion_order(item[0])):
        merged = {_moved_up(key, path): sizes for key, sizes in merged.items()}
        merged[path] = {INSERTED: 1, **spec}
        if spec.get("kind") == "block":  # a copy of the block before it: the same sizes inside
            parent, _, index = path.rpartition(".")
            source = f"{parent}.{int(index) - 1}." if parent else f"{int(index) - 1}."
            for key, sizes in list(merged.items()):
                if key.startswith(source):
                    merged[f"{path}.{key[len(source) :]}"] = dict(sizes)
    for block in decision.remove:
        branch = f"{block}.residual."
        merged = {path: sizes for path, sizes in merged.items() if not path.startswith(branch)}
        merged[block] = {REMOVED: 1}
    for path, keep in decision.keep.items():
        merged.setdefault(path, {}).update({dim: len(indices) for dim, indices in keep.items()})
    return merged


class Selection:
    """Which old indices each new index of a tensor takes, per dimension, and the factors on them."""

    def __init__(
        self, dims: dict[int, list[int]] | None = None, factors: dict[int, torch.Tensor] | None = None
    ) -> None:
        self.dims, self.factors = dims or {}, factors or {}

    def apply(self, tensor: torch.Tensor) -> torch.Tensor:
        selected = _select(tensor, self.dims)
        for dim, factor in self.factors.items():
            shape = [1] * selected.dim()
            shape[dim] = -1
            selected = selected * factor.to(selected.device, selected.dtype).view(shape)
        return selected.contiguous()


def _insertion_order(path: str) -> tuple[int, str, int]:
    """Outer modules first, then by parent, then by position (the order that rebuilds the final paths)."""
    parent, _, index = path.rpartition(".")
    return (path.count("."), parent, int(index) if index.isdigit() else -1)


def _moved_up(key: str, inserted: str) -> str:
    """``key`` after a module was inserted at ``inserted``: siblings at or after it, and what is inside
    them, move up one position."""
    parent, _, index = inserted.rpartition(".")
    prefix = f"{parent}." if parent else ""
    if not key.startswith(prefix):
        return key
    head, dot, tail = key[len(prefix) :].partition(".")
    if head.isdigit() and int(head) >= int(index):
        return f"{prefix}{int(head) + 1}{dot}{tail}"
    return key


def identity_module(spec: dict[str, int | str], previous: nn.Module) -> nn.Module:
    """The module :func:`scaletrain.efficient.net2net.deeper_decision`'s ``spec`` describes (one
    Net2DeeperNet inserts), computing the identity on what ``previous`` (the module before it) outputs."""
    kind = spec.get("kind")
    if kind == "block":
        if not is_residual_block(previous):
            raise ConfigError("net2net: a residual block is inserted only right after one")
        block = own_copy(previous)
        last_norm = [m for m in block.residual.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)][-1]
        with torch.no_grad():
            last_norm.weight.zero_()
            last_norm.bias.zero_()
            last_norm.running_mean.zero_()
            last_norm.running_var.fill_(1.0)
        return block
    channels, relu = int(spec["channels"]), bool(spec.get("relu", 0))
    if kind == "linear":
        layer: nn.Module = nn.Linear(channels, channels)
    elif kind == "conv":
        kernel, dims = int(spec["kernel"]), int(spec.get("dims", 2))
        convolution = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[dims]
        layer = convolution(channels, channels, kernel, padding=kernel // 2)
    else:
        raise ConfigError(f"net2net: unknown inserted module kind {kind!r}")
    with torch.no_grad():
        layer.weight.zero_()
        layer.bias.zero_()
        centre = (slice(None), slice(None), *(layer.weight.shape[2] // 2 for _ in layer.weight.shape[2:]))
        layer.weight[centre] = torch.eye(channels)
    return nn.Sequential(layer, nn.ReLU()) if relu else nn.Sequential(layer)


def _insert(model: nn.Module, path: str, spec: dict[str, int | str]) -> nn.Module:
    parent_path, _, index = path.rpartition(".")
    parent = _module(model, parent_path) if parent_path else model
    if not isinstance(parent, nn.Sequential) or not index.isdigit() or not 0 < int(index) <= len(parent):
        raise ConfigError(
            f"cannot insert a module at {path}: it must be a position after the first inside an nn.Sequential"
        )
    layers = list(parent)
    inserted = identity_module(spec, layers[int(index) - 1])
    layers.insert(int(index), inserted)
    for key in list(parent._modules):
        del parent._modules[key]
    for position, layer in enumerate(layers):
        parent.add_module(str(position), layer)
    return inserted


def _perturb_copies(module: nn.Module, kept: list[int], noise: float, generator: torch.Generator) -> None:
    """Add noise (``noise`` times the weights' standard deviation) to the output channels that repeat an
    earlier one, so that copies can drift apart (Chen et al. 2015, §2.3)."""
    seen: set[int] = set()
    copies = []
    for position, index in enumerate(kept):
        if index in seen:
            copies.append(position)
        seen.add(index)
    if not copies:
        return
    with torch.no_grad():
        rows = module.weight[copies]
        spread = noise * float(module.weight.std())
        # the generator is the CPU's (the same noise on every device): drawn there, then moved
        module.weight[copies] = rows + spread * torch.randn(rows.shape, generator=generator).to(rows.device)


def _module(model: nn.Module, path: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ConfigError(f"the network has no module {path!r}; its modules: {_names(model)}") from None


def _remove_block(model: nn.Module, path: str) -> Bypass:
    block = _module(model, path)
    if not is_residual_block(block):
        raise ConfigError(f"module {path} is no residual block (one with residual, shortcut and relu children)")
    activation = copy.deepcopy(block.relu)
    if hasattr(activation, "inplace"):  # an identity shortcut hands over its input, which backward needs
        activation.inplace = False
    bypass = Bypass(block.shortcut, activation)
    _replace(model, path, bypass)
    return bypass


def _names(model: nn.Module) -> str:
    return ", ".join(name for name, module in model.named_modules() if name and not list(module.children()))


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def _resized(
    module: nn.Module, path: str, keep: dict[str, list[int]], scale: dict[str, list[float]] | None = None
) -> tuple[nn.Module, dict[nn.Parameter, tuple[nn.Parameter, Selection]]]:
    """A copy of ``module`` keeping channels ``keep["out"]`` / ``keep["in"]`` (an index may repeat), its
    weights along a dimension of ``scale`` multiplied by the factors there, and for each old parameter
    its successor with its :class:`Selection`."""
    scale = scale or {}
    unknown = set(keep) - {"out", "in"}
    if unknown:
        raise ConfigError(f"module {path}: resize dimensions are 'out' and 'in', not {', '.join(sorted(unknown))}")
    if isinstance(module, nn.Linear):
        sizes = {"out": ("out_features", 0), "in": ("in_features", 1)}
    elif isinstance(module, _CONVS) and module.groups == 1:
        sizes = {"out": ("out_channels", 0), "in": ("in_channels", 1)}
    elif isinstance(module, _NORMS):
        if "in" in keep:
            raise ConfigError(f"module {path} ({type(module).__name__}) has one channel dimension: give 'out' only")
        sizes = {"out": ("num_features", 0)}
    else:
        raise ConfigError(
            f"module {path} is a {type(module).__name__}; only Linear, ungrouped Conv and BatchNorm layers "
            "can be resized"
        )
    new = own_copy(module)
    mapping = {}
    for name, old in module.named_parameters(recurse=False):
        axis = {d: sizes[d][1] if old.dim() > 1 else 0 for d in keep}
        if old.dim() == 1:  # a bias or a norm's scale: only the output channels
            axis = {"out": 0} if "out" in keep else {}
        selection = Selection(
            {axis[d]: keep[d] for d in axis},
            {axis[d]: torch.as_tensor(scale[d]) for d in axis if d in scale and (old.dim() > 1 or d == "out")},
        )
        fresh = nn.Parameter(selection.apply(old.detach()), requires_grad=old.requires_grad)
        setattr(new, name, fresh)
        mapping[old] = (fresh, selection)
    for name, buffer in module.named_buffers(recurse=False):
        if buffer is not None and buffer.dim() == 1 and "out" in keep:  # running mean / variance
            new.register_buffer(name, _select(buffer, {0: keep["out"]}).clone())
    for dim, (attribute, _) in sizes.items():
        if dim in keep:
            setattr(new, attribute, len(keep[dim]))
    return new, mapping


def _select(tensor: torch.Tensor, dims: dict[int, list[int]]) -> torch.Tensor:
    """The kept indices of ``tensor``, always in a storage of its own: a tensor kept whole is copied too, since it
    may be a view into a buffer its old owner frees (a parameter server's flat buffer of the old network)."""
    if not dims:
        return tensor.clone(memory_format=torch.contiguous_format)
    for dim, indices in dims.items():
        tensor = tensor.index_select(dim, torch.as_tensor(indices, dtype=torch.long, device=tensor.device))
    return tensor.contiguous()
