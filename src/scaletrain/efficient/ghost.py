"""Ghost batch normalisation: batch-norm statistics over virtual batches of a fixed size.

Method card. *What*: in training, each batch norm splits its batch into ``ceil(N / size)`` virtual
("ghost") batches of (nearly) equal size and normalises each with its own mean and variance; the
running statistics move once per step, towards the mean over the ghost batches of their means and
(unbiased) variances. Evaluation uses the running statistics, as plain batch norm does. *When it
helps*: a large batch (after :mod:`~scaletrain.efficient.rebatch`, or a split run's many workers) whose
batch-norm statistics would otherwise be less noisy than those of the small batch the rest of the
recipe was tuned for; Hoffer, Hubara and Soudry (NeurIPS 2017, "Train longer, generalize better")
used ghost batches of 128 with batches up to 4096 and closed most of the large-batch accuracy gap
together with their learning-rate and step-count rules. *Source*: the paper's Algorithm 1; the
per-step running-statistics update follows the paper's use of the ghost batches' mean statistics.

Use: ``--ghost-batch N`` on ``train`` and ``bench`` (every batch norm of any workload; the adapter
:class:`GhostBatch` changes them once, when the network is built), or :func:`ghost_batch_norm` on a
network in Python. In a split run each worker normalises its own share
of the batch, so ghost batches never span workers. The state dict is unchanged (same parameters and
buffers), so checkpoints and resumes do not depend on it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from scaletrain.efficient.base import Technique
from scaletrain.efficient.settings import Setting
from scaletrain.errors import ConfigError

__all__ = [
    "GhostBatch",
    "GhostBatchNorm1d",
    "GhostBatchNorm2d",
    "GhostBatchNorm3d",
    "ghost_batch_norm",
    "ghost_normalize",
]


def ghost_normalize(norm: nn.modules.batchnorm._BatchNorm, inputs: torch.Tensor, size: int) -> torch.Tensor:
    """``norm``'s training-mode output on ``inputs`` with statistics per ghost batch of about ``size``
    samples, and its running statistics moved once (with ``norm``'s momentum, or the cumulative
    average when that is ``None``)."""
    chunks = inputs.tensor_split(max(1, math.ceil(inputs.shape[0] / size)))
    outputs = [F.batch_norm(chunk, None, None, norm.weight, norm.bias, True, 0.0, norm.eps) for chunk in chunks]
    if norm.track_running_stats:
        with torch.no_grad():
            dims = [0, *range(2, inputs.dim())]
            mean = torch.stack([chunk.mean(dims) for chunk in chunks]).mean(0)
            variance = torch.stack([chunk.var(dims, correction=1) for chunk in chunks]).mean(0)
            norm.num_batches_tracked.add_(1)
            factor = 1.0 / float(norm.num_batches_tracked) if norm.momentum is None else norm.momentum
            norm.running_mean.lerp_(mean.to(norm.running_mean.dtype), factor)
            norm.running_var.lerp_(variance.to(norm.running_var.dtype), factor)
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


class _Ghost:
    """Mixed into a batch-norm class: training-mode batches go through :func:`ghost_normalize`."""

    virtual_batch_size: int

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(inputs)
        self._check_input_dim(inputs)
        return ghost_normalize(self, inputs, self.virtual_batch_size)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, virtual_batch_size={self.virtual_batch_size}"


class GhostBatchNorm1d(_Ghost, nn.BatchNorm1d):
    """:class:`torch.nn.BatchNorm1d` over ghost batches."""


class GhostBatchNorm2d(_Ghost, nn.BatchNorm2d):
    """:class:`torch.nn.BatchNorm2d` over ghost batches."""


class GhostBatchNorm3d(_Ghost, nn.BatchNorm3d):
    """:class:`torch.nn.BatchNorm3d` over ghost batches."""


_GHOSTS = {
    nn.BatchNorm1d: GhostBatchNorm1d,
    nn.BatchNorm2d: GhostBatchNorm2d,
    nn.BatchNorm3d: GhostBatchNorm3d,
}


def ghost_batch_norm(model: nn.Module, size: int) -> int:
    """Make every batch norm of ``model`` (in place) normalise over ghost batches of ``size`` samples;
    the modules keep their parameters and buffers (the optimizer and checkpoints see no change).
    Returns how many batch norms changed; a network without any is an error (the flag would do nothing).

    >>> net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    >>> ghost_batch_norm(net, 16), type(net[1]).__name__
    (1, 'GhostBatchNorm1d')
    """
    if size < 2:
        raise ConfigError(f"--ghost-batch must be at least 2 samples (a variance needs two), got {size}")
    changed = 0
    for module in model.modules():
        if isinstance(module, _Ghost):
            module.virtual_batch_size = size
            changed += 1
        elif type(module) in _GHOSTS:  # exactly the plain classes: subclasses may compute something else
            module.__class__ = _GHOSTS[type(module)]
            module.virtual_batch_size = size
            changed += 1
    if not changed:
        raise ConfigError("--ghost-batch: this network has no batch norm; leave the flag out")
    return changed


@dataclass
class GhostBatch(Technique):
    """``--ghost-batch N``: :func:`ghost_batch_norm` on the network as built, on every process. The batch
    norms keep their parameters and buffers, so it keeps no state and stays out of the checkpointed stack."""

    name: ClassVar[str] = "ghost_batch"
    checkpointed: ClassVar[bool] = False
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(
            "ghost_batch",
            "every batch norm normalises over ghost batches of N samples (Hoffer et al. 2017; per worker)",
            type=int,
            metavar="N",
        ),
    )

    size: int = 0

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        size = settings["ghost_batch"]
        if size is not None and (not isinstance(size, int) or size < 2):
            raise ConfigError(f"ghost_batch must be a whole number ≥ 2 (a variance needs two samples), got {size!r}")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> GhostBatch | None:
        return None if settings["ghost_batch"] is None else cls(size=settings["ghost_batch"])

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        return {"ghost_batch": settings["ghost_batch"]}

    def prepare_model(self, model: nn.Module) -> None:
        ghost_batch_norm(model, self.size)
