"""Applying a :class:`~scaletrain.efficient.base.Reconfiguration` to a network and its optimizer.

Each named module is replaced by a copy whose parameters (and batch-norm statistics) keep the
chosen channels; the SGD momentum of what is kept is carried over, so training continues as if the
dropped channels had never existed. The cumulative sizes (the *architecture*) go into checkpoints,
so a resumed run rebuilds the reconfigured network before loading its weights.

Linear, Conv1d/2d/3d (ungrouped) and BatchNorm1d/2d/3d layers can be resized; anything else is an
error naming the module. A residual block (a module with ``residual`` and ``shortcut`` children and a
``relu``) can be removed: it becomes a :class:`Bypass` that keeps its shortcut under the same name, so
paths into the shortcut stay valid. The architecture records a removed block as ``{"removed": 1}``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.errors import ConfigError

__all__ = ["Architecture", "Bypass", "apply_architecture", "reconfigure", "resized_architecture"]

#: ``{module path: {"out": size, "in": size}}`` (or ``{"removed": 1}`` for a block that went) — how the
#: network differs from the workload's own.
Architecture = dict[str, dict[str, int]]
REMOVED = "removed"


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
    same shape) and the old one's learning rate."""
    carried: dict[nn.Parameter, tuple[nn.Parameter, dict[int, list[int]]]] = {}
    for path in decision.remove:
        _remove_block(model, path)
    for path, keep in decision.keep.items():
        old = _module(model, path)
        new, mapping = _resized(old, path, keep)
        _replace(model, path, new)
        carried.update(mapping)
    renewed = make_optimizer(list(model.parameters()))
    for old_group, new_group in zip(optimizer.param_groups, renewed.param_groups, strict=True):
        new_group["lr"] = old_group["lr"]
    old_of = {new: (old, dims) for old, (new, dims) in carried.items()}
    for parameter in model.parameters():
        old, dims = old_of.get(parameter, (parameter, {}))
        state = optimizer.state.get(old)
        if not state:
            continue
        renewed.state[parameter] = {
            key: _select(value, dims) if torch.is_tensor(value) and value.shape == old.shape else value
            for key, value in state.items()
        }
    return renewed


def apply_architecture(model: nn.Module, architecture: Architecture) -> None:
    """Resize a freshly built network to ``architecture`` (weights to be loaded afterwards)."""
    for path, sizes in architecture.items():
        if REMOVED in sizes:
            _remove_block(model, path)
    keep = {
        path: {dim: list(range(size)) for dim, size in sizes.items()}
        for path, sizes in architecture.items()
        if REMOVED not in sizes
    }
    for path, dims in keep.items():
        new, _ = _resized(_module(model, path), path, dims)
        _replace(model, path, new)


def resized_architecture(architecture: Architecture, decision: Reconfiguration) -> Architecture:
    """``architecture`` after ``decision``: the sizes of every module resized so far."""
    merged = {path: dict(sizes) for path, sizes in architecture.items()}
    for block in decision.remove:
        branch = f"{block}.residual."
        merged = {path: sizes for path, sizes in merged.items() if not path.startswith(branch)}
        merged[block] = {REMOVED: 1}
    for path, keep in decision.keep.items():
        merged.setdefault(path, {}).update({dim: len(indices) for dim, indices in keep.items()})
    return merged


def _module(model: nn.Module, path: str) -> nn.Module:
    try:
        return model.get_submodule(path)
    except AttributeError:
        raise ConfigError(f"the network has no module {path!r}; its modules: {_names(model)}") from None


def _remove_block(model: nn.Module, path: str) -> None:
    block = _module(model, path)
    if not all(isinstance(getattr(block, name, None), nn.Module) for name in ("residual", "shortcut", "relu")):
        raise ConfigError(f"module {path} is no residual block (one with residual, shortcut and relu children)")
    activation = copy.deepcopy(block.relu)
    if hasattr(activation, "inplace"):  # an identity shortcut hands over its input, which backward needs
        activation.inplace = False
    _replace(model, path, Bypass(block.shortcut, activation))


def _names(model: nn.Module) -> str:
    return ", ".join(name for name, module in model.named_modules() if name and not list(module.children()))


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


def _resized(
    module: nn.Module, path: str, keep: dict[str, list[int]]
) -> tuple[nn.Module, dict[nn.Parameter, tuple[nn.Parameter, dict[int, list[int]]]]]:
    """A copy of ``module`` keeping channels ``keep["out"]`` / ``keep["in"]``, and for each old parameter
    its successor with the kept indices per dimension."""
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
    new = copy.deepcopy(module)
    mapping = {}
    for name, old in module.named_parameters(recurse=False):
        dims = {sizes[d][1] if old.dim() > 1 else 0: indices for d, indices in keep.items()}
        if old.dim() == 1:  # a bias or a norm's scale: only the output channels
            dims = {0: keep["out"]} if "out" in keep else {}
        fresh = nn.Parameter(_select(old.detach(), dims), requires_grad=old.requires_grad)
        setattr(new, name, fresh)
        mapping[old] = (fresh, dims)
    for name, buffer in module.named_buffers(recurse=False):
        if buffer is not None and buffer.dim() == 1 and "out" in keep:  # running mean / variance
            new.register_buffer(name, _select(buffer, {0: keep["out"]}).clone())
    for dim, (attribute, _) in sizes.items():
        if dim in keep:
            setattr(new, attribute, len(keep[dim]))
    return new, mapping


def _select(tensor: torch.Tensor, dims: dict[int, list[int]]) -> torch.Tensor:
    for dim, indices in dims.items():
        tensor = tensor.index_select(dim, torch.as_tensor(indices, dtype=torch.long))
    return tensor.contiguous()
