"""``prunetrain``: structured pruning while training (Lym et al., "PruneTrain", SC'19; SPEC §5).

Method card. *What*: a group-lasso regulariser pushes whole channels of every convolution and linear
layer to zero, GL = Σ_layers (Σ_c ‖W[c]‖₂ + Σ_k ‖W[:, k]‖₂) over output channels c and input channels
k, leaving out the inputs of the first layer (the image) and the outputs of the last (the classes).
Its weight λ is set once, at the first step, so that the penalty is the fraction r (the *lasso
penalty ratio*, default 0.2) of the objective: λ = r·L / (R·(1 − r)), L the loss and R the group
lasso then. Every ``every`` epochs (the *reconfiguration interval*, default 10) the channels whose
weights are all below ``threshold`` (default 1e-4) go, with the channel union of
:mod:`scaletrain.efficient.channels` (a residual sum keeps a channel while any member needs it), and a
block whose residual branch is gone is removed; the network is rebuilt densely, momentum carried over.
*When it helps*: the network, its FLOPs and — under data parallelism — the bytes every step sends
shrink while it trains; the paper reports −53 % training FLOPs for ResNet-32 on CIFAR-10 at 91.8 %
accuracy, and −55 % communication for ResNet-50 on ImageNet. The Dortmund thesis (004) found no time
saved on one GPU: the gain is in the communication. *In a distributed run*: L is the mean over the
workers of their first losses, so λ is the one process's λ (equal parts of a batch); the
decision is made once and applied by every process.

Options: ``--technique prunetrain --lasso-ratio 0.2 --prune-threshold 1e-4 --reconfigure-every 10``
(or ``-T ratio=0.2 -T threshold=1e-4 -T every=10``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.channels import channel_groups, dead_channel_pruning
from scaletrain.efficient.cost import layers_run
from scaletrain.errors import ConfigError

__all__ = ["PruneTrain", "group_lasso", "lasso_weight", "regularised_groups"]

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


def regularised_groups(model: nn.Module, example_inputs: Any) -> dict[str, tuple[bool, bool]]:
    """``{layer path: (outputs regularised, inputs regularised)}`` for every convolution and linear layer:
    all but the first layer's inputs and the last layer's outputs (in the order the forward pass runs)."""
    ran = [module for module, _ in layers_run(model, example_inputs)]
    if not ran:
        raise ConfigError("prunetrain: the network has no convolution or linear layer to prune")
    names = {module: name for name, module in model.named_modules()}
    order = list(dict.fromkeys(ran))
    return {names[m]: (m is not order[-1], m is not order[0]) for m in order}


def group_lasso(model: nn.Module, groups: dict[str, tuple[bool, bool]]) -> torch.Tensor:
    """GL: the sum of the L2 norms of the regularised output and input channels of each layer.

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
    return total


def lasso_weight(ratio: float, loss: float, lasso: float) -> float:
    """λ such that λ·R is the fraction ``ratio`` of L + λ·R.

    >>> lasso_weight(0.2, loss=2.0, lasso=50.0)  # 0.2·2 / (50·0.8)
    0.01
    """
    return ratio * loss / (lasso * (1.0 - ratio))


@dataclass
class PruneTrain(Technique):
    """The adapter: adds λ·GL to every step's loss and prunes every ``every`` epochs."""

    ratio: float = 0.2
    threshold: float = 1e-4
    every: int = 10
    name = "prunetrain"
    #: command-line flags (``--lasso-ratio``) and API settings (``lasso_ratio=``) for the options
    flags: ClassVar[dict[str, str]] = {
        "lasso_ratio": "ratio",
        "prune_threshold": "threshold",
        "reconfigure_every": "every",
    }
    weight: float | None = field(default=None, init=False)  # λ, once set
    _groups: dict[str, tuple[bool, bool]] = field(default_factory=dict, init=False, repr=False)
    _context: Context = field(default_factory=Context, init=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.ratio < 1:
            raise ConfigError(f"prunetrain: the lasso penalty ratio must be between 0 and 1, got {self.ratio}")
        if self.threshold < 0:
            raise ConfigError(f"prunetrain: the prune threshold must be ≥ 0, got {self.threshold}")
        if self.every < 1:
            raise ConfigError(f"prunetrain: reconfigure every N epochs needs N ≥ 1, got {self.every}")

    def start(self, model: nn.Module, context: Context) -> None:
        self._context = context
        self._groups = regularised_groups(model, context.example_inputs())

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        lasso = group_lasso(model, self._groups)
        if self.weight is None:
            mean_loss = self._context.mean("prunetrain/loss", loss.item(), 1.0)
            self.weight = lasso_weight(self.ratio, mean_loss, lasso.item())
        return loss + self.weight * lasso

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        if (end.epoch + 1) % self.every:
            return None
        example = self._context.example_inputs()
        pruning = dead_channel_pruning(model, channel_groups(model, example), self.threshold)
        if not pruning.keep and not pruning.remove:
            return None
        return Reconfiguration(keep=pruning.keep, remove=pruning.remove)

    def reconfigured(self, model: nn.Module) -> None:
        """After the loop applied a decision: the layers to regularise are those left."""
        self._groups = {path: sides for path, sides in self._groups.items() if _exists(model, path)}

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.weight = state.get("weight")


def _exists(model: nn.Module, path: str) -> bool:
    try:
        return isinstance(model.get_submodule(path), _LAYERS)
    except AttributeError:
        return False
