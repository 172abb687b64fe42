"""``prunetrain``: structured pruning while training (Lym et al., "PruneTrain", SC'19; SPEC §5).

A group-lasso penalty pushes whole channels of every convolution and linear layer to zero, GL = Σ_layers
(Σ_c ‖W[c]‖₂ + Σ_k ‖W[:, k]‖₂) over output channels c and input channels k, leaving out the image inputs of the first
layer and the class outputs of the last. Its weight λ is set once, at the first step, so that the penalty is the
fraction r (the *lasso penalty ratio*, default 0.2) of the objective: λ = r·L / (R·(1 − r)), L the loss and R the
group lasso then; in a distributed run L is the mean of the workers' first losses, so λ is one process's.
``step=proximal`` (the default) takes the penalty's proximal step after every optimizer step, where that step is
taken (the worker or the parameter server): each group shrinks by η·λ/(1 − μ) in norm (η the rate, μ the momentum)
and becomes exactly zero when smaller. ``step=subgradient`` adds λ·GL to the loss, as the paper does; it leaves
channels oscillating around zero (docs/techniques.md). With ``batchnorm=on`` (the default) the scale and shift of the
batch norm after each regularised layer are penalised too (|γ| + |β| per channel, as network slimming does), and a
channel whose every writer is followed by a batch norm with both below the threshold is dead (it outputs zero);
without that penalty batch norm makes the loss blind to a channel's scale.

Every ``every`` epochs (default 10) the channels whose weights are all below ``threshold`` (default 1e-4) go, with
the channel union of :mod:`scaletrain.efficient.channels` (a residual sum keeps a channel any member needs); a block
whose residual branch is gone is removed; the network is rebuilt densely, momentum carried over, decided once and
applied by every process. With ``rewiden=E`` (004 §3.5) the reconfiguration after epoch E also widens every group of
channels by one multiplier (Net2WiderNet copies) back to ``rewiden_to`` times the starting parameters (default 1);
then the penalty is off. It pays where the network's FLOPs and, under data parallelism, its bytes a step matter.

Options: ``--lasso-ratio 0.2 --prune-threshold 1e-4 --reconfigure-every 10`` (or ``-T ratio=0.2 -T threshold=1e-4
-T every=10``), ``-T step=proximal|subgradient``, ``-T batchnorm=on|off``, ``-T rewiden=E -T rewiden_to=1.0``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.channels import channel_groups, dead_channel_pruning
from scaletrain.efficient.cost import layers_run, traced_forward
from scaletrain.efficient.net2net import applied, composed, expansion_decision
from scaletrain.efficient.settings import option
from scaletrain.errors import ConfigError

__all__ = [
    "STEPS",
    "PruneTrain",
    "following_norms",
    "group_lasso",
    "lasso_weight",
    "regularised_groups",
    "shrink_all_groups",
    "shrink_groups",
    "shrink_values",
]

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
STEPS = ("proximal", "subgradient")


def regularised_groups(model: nn.Module, example_inputs: Any) -> dict[str, tuple[bool, bool]]:
    """``{layer path: (outputs regularised, inputs regularised)}`` for every convolution and linear layer:
    all but the first layer's inputs and the last layer's outputs (in the order the forward pass runs)."""
    ran = [module for module, _ in layers_run(model, example_inputs)]
    if not ran:
        raise ConfigError("prunetrain: the network has no convolution or linear layer to prune")
    names = {module: name for name, module in model.named_modules()}
    order = list(dict.fromkeys(ran))
    return {names[m]: (m is not order[-1], m is not order[0]) for m in order}


def following_norms(model: nn.Module, example_inputs: Any) -> dict[str, str]:
    """``{layer path: batch-norm path}`` for every layer whose output goes straight into an affine batch norm."""
    names = {module: name for name, module in model.named_modules()}
    outputs: dict[int, str] = {}
    found: dict[str, str] = {}

    def layer_hook(module: nn.Module, inputs: Any, output: torch.Tensor) -> None:
        outputs[id(output)] = names[module]

    def norm_hook(module: nn.Module, inputs: Any) -> None:
        source = outputs.get(id(inputs[0]))
        if source is not None and module.affine:
            found[source] = names[module]

    hooks = [m.register_forward_hook(layer_hook) for m in model.modules() if isinstance(m, _LAYERS)]
    hooks += [m.register_forward_pre_hook(norm_hook) for m in model.modules() if isinstance(m, _NORMS)]
    traced_forward(model, example_inputs, hooks)
    return found


def group_lasso(
    model: nn.Module, groups: dict[str, tuple[bool, bool]], norms: dict[str, str] | None = None
) -> torch.Tensor:
    """GL: the sum of the L2 norms of the regularised output and input channels of each layer, plus,
    for each layer in ``norms``, the absolute scale and shift of each channel of its batch norm.

    >>> layer = nn.Linear(2, 2, bias=False)
    >>> with torch.no_grad():
    ...     _ = layer.weight.copy_(torch.tensor([[3.0, 4.0], [0.0, 0.0]]))
    >>> round(group_lasso(nn.Sequential(layer), {"0": (True, True)}).item(), 4)  # rows 5 + 0, columns 3 + 4
    12.0
    """
    total = torch.zeros(())
    for path, (outputs, inputs) in groups.items():
        weight = model.get_submodule(path).weight
        if outputs:
            total = total + torch.linalg.vector_norm(weight.flatten(1), dim=1).sum()
        if inputs:
            total = total + torch.linalg.vector_norm(weight.transpose(0, 1).flatten(1), dim=1).sum()
    for path in (norms or {}).values():
        norm = model.get_submodule(path)
        total = total + norm.weight.abs().sum() + norm.bias.abs().sum()
    return total


def shrink_groups(weight: torch.Tensor, outputs: bool, inputs: bool, amount: float) -> None:
    """Group soft-thresholding of one layer's weight in place: each regularised output channel (then
    input channel) loses ``amount`` of its L2 norm, and becomes exactly zero when its norm is smaller —
    the proximal step of ``amount``·GL (the two kinds of group overlap; they are taken one after the other).

    >>> weight = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    >>> shrink_groups(weight, outputs=True, inputs=False, amount=1.0)
    >>> weight  # the first row's norm 5 → 4; the second (norm 0.5) → 0
    tensor([[2.4000, 3.2000],
            [0.0000, 0.0000]])
    """
    shrink_all_groups([(weight, outputs, inputs)], amount)


def shrink_all_groups(layers: list[tuple[torch.Tensor, bool, bool]], amount: float) -> None:
    """:func:`shrink_groups` for every ``(weight, outputs, inputs)``: every layer's output groups, then
    every layer's input groups, the factors of all layers computed in a few multi-tensor kernels (the
    layers are independent, so the order among them changes nothing)."""
    with torch.no_grad():
        for dim in (0, 1):  # output channels, then input channels
            chosen = [weight for weight, outputs, inputs in layers if (outputs, inputs)[dim]]
            if not chosen:
                continue
            rows = [weight.flatten(1) if dim == 0 else weight.transpose(0, 1).flatten(1) for weight in chosen]
            norms = [torch.linalg.vector_norm(row, dim=1) for row in rows]
            # factor = max(1 − amount / max(norm, 1e-30), 0), rounded as torch rounds that expression
            # (a number over a tensor is the tensor's reciprocal times the number)
            torch._foreach_clamp_min_(norms, 1e-30)
            factors = torch._foreach_reciprocal(norms)
            torch._foreach_mul_(factors, -amount)
            torch._foreach_add_(factors, 1.0)
            torch._foreach_clamp_min_(factors, 0.0)
            for weight, factor in zip(chosen, factors, strict=True):
                shape = [1] * weight.dim()
                shape[dim] = -1
                weight.mul_(factor.view(shape))


def shrink_values(values: torch.Tensor | list[torch.Tensor], amount: float) -> None:
    """Soft-thresholding in place: every value moves ``amount`` towards zero and stops there (the
    proximal step of ``amount``·Σ|x|, each value its own group). As x − clamp(x, −a, a): a value within
    ``amount`` of zero becomes exactly +0.0, and a list of tensors takes three multi-tensor kernels in
    all, not a few per tensor (PruneTrain shrinks every batch norm's scale and shift after every step,
    and on a GPU each small kernel's launch costs more than its work: results/h100-2026-11-26).

    >>> values = torch.tensor([0.5, -0.05, -2.0])
    >>> shrink_values(values, 0.1)
    >>> values
    tensor([ 0.4000,  0.0000, -1.9000])
    >>> pair = [torch.tensor([0.05, 3.0]), torch.tensor([-1.0])]
    >>> shrink_values(pair, 0.5)
    >>> pair
    [tensor([0.0000, 2.5000]), tensor([-0.5000])]
    """
    tensors = [values] if isinstance(values, torch.Tensor) else list(values)
    if not tensors:
        return
    with torch.no_grad():
        within = torch._foreach_clamp_min(tensors, -amount)
        torch._foreach_clamp_max_(within, amount)
        torch._foreach_sub_(tensors, within)


def lasso_weight(ratio: float, loss: float, lasso: float) -> float:
    """λ such that λ·R is the fraction ``ratio`` of L + λ·R.

    >>> lasso_weight(0.2, loss=2.0, lasso=50.0)  # 0.2·2 / (50·0.8)
    0.01
    """
    return ratio * loss / (lasso * (1.0 - ratio))


@dataclass
class PruneTrain(Technique):
    """The adapter: adds λ·GL to every step's loss and prunes every ``every`` epochs."""

    ratio: float = option(0.2, flag="lasso_ratio", help="the lasso penalty ratio r, between 0 and 1")
    threshold: float = option(1e-4, flag="prune_threshold", help="channels whose weights are all below it go")
    every: int = option(10, flag="reconfigure_every", help="prune every N epochs")
    step: str = "proximal"
    batchnorm: str = "on"
    rewiden: int = 0  # after this epoch (counted from 1): prune, then widen back to rewiden_to × the start
    rewiden_to: float = 1.0
    name = "prunetrain"
    weight: float | None = field(default=None, init=False)  # λ, once set
    initial_parameters: int | None = field(default=None, init=False)
    _groups: dict[str, tuple[bool, bool]] = field(default_factory=dict, init=False, repr=False)
    _context: Context = field(default_factory=Context, init=False, repr=False)
    _initial_lasso: float = field(default=0.0, init=False, repr=False)  # R before the first step
    _norms: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # layer → its batch norm

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        if not 0 < options["ratio"] < 1:
            raise ConfigError(f"prunetrain: the lasso penalty ratio must be between 0 and 1, got {options['ratio']}")
        if options["threshold"] < 0:
            raise ConfigError(f"prunetrain: the prune threshold must be ≥ 0, got {options['threshold']}")
        if options["every"] < 1:
            raise ConfigError(f"prunetrain: reconfigure every N epochs needs N ≥ 1, got {options['every']}")
        if options["batchnorm"] not in ("on", "off"):
            raise ConfigError(f"prunetrain: batchnorm must be on or off, got {options['batchnorm']!r}")
        if options["step"] not in STEPS:
            raise ConfigError(f"prunetrain: step must be one of {', '.join(STEPS)}, got {options['step']!r}")
        if options["rewiden"] < 0 or not options["rewiden_to"] > 0:
            raise ConfigError("prunetrain: rewiden is an epoch (≥ 1; 0: never) and rewiden_to a positive fraction")

    def start(self, model: nn.Module, context: Context) -> None:
        self._context = context
        if self.initial_parameters is None:
            self.initial_parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self._groups = regularised_groups(model, context.example_inputs())
        self._norms = self._regularised_norms(model, context.example_inputs())
        if self.weight is None:  # R of the weights every process starts from
            with torch.no_grad():
                self._initial_lasso = group_lasso(model, self._groups, self._norms).item()

    def _regularised_norms(self, model: nn.Module, example_inputs: Any) -> dict[str, str]:
        if self.batchnorm == "off":
            return {}
        following = following_norms(model, example_inputs)
        return {path: following[path] for path, (outputs, _) in self._groups.items() if outputs and path in following}

    def _pruning(self, epoch: int) -> bool:
        """Whether ``epoch`` (0-based) still prunes: always, or until the re-widening."""
        return not self.rewiden or epoch < self.rewiden

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        if self.weight is None:
            self._set_weight(loss.item())
        if self.step == "proximal" or not self._pruning(self._context.epoch()):
            return loss
        return loss + self.weight * group_lasso(model, self._groups, self._norms)

    def after_update(self, parameters: dict[str, torch.Tensor], lr: float) -> None:
        if self.step != "proximal" or not self._groups or not self._pruning(self._context.epoch()):
            return
        if self.weight is None:
            if self._context.computes_loss:
                return  # a worker's own server, before this worker's first loss: no penalty yet
            self._set_weight(math.nan)  # a parameter server: λ from the workers' first losses
        # With momentum μ a steady gradient moves a weight lr/(1 − μ) per step, the loss's gradient and a
        # subgradient penalty alike; the proximal step shrinks by as much, so both weigh as in the objective.
        amount = lr * self.weight / (1 - self._context.momentum)
        layers = [(parameters.get(f"{path}.weight"), *groups) for path, groups in self._groups.items()]
        shrink_all_groups([layer for layer in layers if layer[0] is not None], amount)
        penalised = (parameters.get(f"{norm}.{kind}") for norm in self._norms.values() for kind in ("weight", "bias"))
        shrink_values([values for values in penalised if values is not None], amount)

    def _set_weight(self, loss: float) -> None:
        """λ from the mean of every worker's first loss (a server, which has none, passes nan)."""
        mean_loss = self._context.mean("prunetrain/loss", loss, 1.0)
        self.weight = lasso_weight(self.ratio, mean_loss, self._initial_lasso)

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        rewidening = self.rewiden and end.epoch + 1 == self.rewiden
        if not self._pruning(end.epoch) or ((end.epoch + 1) % self.every and not rewidening):
            return None
        example = self._context.example_inputs()
        pruning = dead_channel_pruning(model, channel_groups(model, example), self.threshold, self._norms)
        decision = Reconfiguration(keep=pruning.keep, remove=pruning.remove)
        if rewidening:
            pruned = applied(model, decision)
            target = self.rewiden_to * (self.initial_parameters or 0)
            expand, _ = expansion_decision(pruned, example, target, "parameters")
            if expand is not None:
                decision = composed(decision, expand)
        return decision if decision.changes_network else None

    def reconfigured(self, model: nn.Module) -> None:
        """After the loop applied a decision: the layers to regularise are those left."""
        self._groups = {path: sides for path, sides in self._groups.items() if _exists(model, path)}
        self._norms = {path: norm for path, norm in self._norms.items() if path in self._groups}

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight, "initial_parameters": self.initial_parameters}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight = state.get("weight")
        self.initial_parameters = state.get("initial_parameters")


def _exists(model: nn.Module, path: str) -> bool:
    try:
        return isinstance(model.get_submodule(path), _LAYERS)
    except AttributeError:
        return False
