"""Synchronised batch norm: every batch norm normalises over the whole global batch, across the workers sharing it.

In a run whose workers each compute a part of one batch (``--sync split``, and the joined batch of ``--sync join``),
each batch norm in training normalises with the mean and variance of the whole batch, and its running statistics move
towards that batch's mean and unbiased variance, as one process computes them. A split run of a network with batch
norm is then sequential training again, weight for weight; without it each of N workers normalises over 1/N of the
batch, which also gives noisy statistics where the share is small. The price, per batch norm and step: an all-reduce
of 2C+1 numbers in the forward pass and one of 2C in the backward pass (C channels), each a point where the workers
meet (docs/distributed.md has the measured cost). After Ioffe and Szegedy (2015), with the global statistics
summed from the workers' as ``torch.nn.SyncBatchNorm`` does (Peng et al., "MegDet", CVPR 2018).

:func:`sync_batch_norm` gives a network's ``BatchNorm1d/2d/3d`` the subclasses here, which keep their parameters,
buffers and state-dict keys and stay instances of the torch classes: checkpoints, ``load_model`` and the surgery of
PruneTrain, Net2Net or MorphNet see plain batch norm. They synchronise only in training mode inside
:func:`synchronised` (the block names the process group) and are plain batch norm everywhere else, evaluation
included; on a GPU with an NCCL group through torch's ``SyncBatchNorm`` function, elsewhere through
:class:`SyncBatchNormFunction`.

>>> net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
>>> sync_batch_norm(net), isinstance(net[1], nn.BatchNorm1d), type(net[1]).__name__
(1, True, 'SyncedBatchNorm1d')
>>> with synchronised(None):  # a process group of the workers here; None: this process alone
...     out = net(torch.randn(8, 3))
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.modules._functions import SyncBatchNorm as _TorchSyncBatchNorm  # what nn.SyncBatchNorm calls

from scaletrain.efficient.base import Context, Technique
from scaletrain.efficient.settings import Setting
from scaletrain.errors import ConfigError

__all__ = [
    "SyncBatchNormFunction",
    "SyncBatchStatistics",
    "SyncedBatchNorm1d",
    "SyncedBatchNorm2d",
    "SyncedBatchNorm3d",
    "sync_batch_norm",
    "synchronised",
]

#: The process group the batch norms of a training forward pass synchronise over (None: none).
_GROUP: contextvars.ContextVar[dist.ProcessGroup | None] = contextvars.ContextVar("batch_norm_group", default=None)


@contextlib.contextmanager
def synchronised(group: dist.ProcessGroup | None) -> Iterator[None]:
    """Within this block, every synchronised batch norm in training mode normalises over the batch of
    ``group``'s processes (each calls the same layers in the same order); ``None``: over this process's."""
    token = _GROUP.set(group)
    try:
        yield
    finally:
        _GROUP.reset(token)


def _all_reduce(values: np.ndarray, group: dist.ProcessGroup) -> np.ndarray:
    """The sum of ``values`` over ``group``, in place (gloo sends from host memory)."""
    dist.all_reduce(torch.from_numpy(values), group=group)
    return values


def _host(tensor: torch.Tensor) -> np.ndarray:
    """A per-channel vector as float64 numbers in host memory."""
    return tensor.detach().cpu().numpy().astype(np.float64)


def _channels(values: np.ndarray, like: torch.Tensor, view: list[int]) -> torch.Tensor:
    """Per-channel numbers as a float32 tensor on ``like``'s device, shaped to broadcast over it."""
    return torch.from_numpy(values.astype(np.float32)).to(like.device).view(view)


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm in training over the batch of every process of ``group``, each holding some of its rows.

    Forward: one all-reduce of the stacked per-channel sums ``[Σx, Σx², n]`` (float64, each process's own sums
    accumulated in float64), giving the global mean μ and biased variance σ²; the output is
    ``(x − μ)/√(σ² + ε)·γ + β``, and the running statistics (when given) move by ``momentum`` towards μ and
    the unbiased variance σ²·n/(n − 1). Backward: one all-reduce of ``[Σdy, Σdy·x̂]``, and
    ``dx = γ/√(σ² + ε)·(dy − Σdy/n − x̂·Σdy·x̂/n)``. The gradients of γ and β are this process's own sums:
    the gradient exchange adds them up over the workers as it does every other parameter's.
    Calls: ``apply(inputs, weight, bias, running_mean, running_var, momentum, eps, group)``.

    What costs is kept to fused passes (a channels-last reduction through ``var_mean`` took 8 times as long):
    the local sums are two reductions with float64 accumulators (``sum`` and ``vector_norm`` with
    ``dtype=float64``; a training-mode ``native_batch_norm`` is 0.4 ms faster a layer, but its float32 mean and
    1/σ, turned back into a variance, lost enough digits that AdamW on 4 split workers ended 3.9e-5 from one
    process after 12 updates, 4.2e-6 with these sums),
    the output from an evaluation-mode ``batch_norm`` with the global statistics,
    and the input gradient from ``native_batch_norm_backward`` over this process's rows, corrected by what
    the global sums add (per channel, a multiple of x plus a constant). The per-channel arithmetic runs in
    NumPy's float64: as tensor operations, some 60 of them a layer cost more than the layer's kernels.
    """

    @staticmethod
    def forward(
        ctx: Any,
        inputs: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        running_mean: torch.Tensor | None,
        running_var: torch.Tensor | None,
        momentum: float,
        eps: float,
        group: dist.ProcessGroup,
    ) -> torch.Tensor:
        channels = inputs.shape[1]
        values = inputs.float()  # bfloat16 or float16 activations: statistics in float32, as batch norm's
        dims = [dim for dim in range(values.dim()) if dim != 1]
        sums = np.empty(2 * channels + 1)
        sums[:channels] = _host(values.sum(dims, dtype=torch.float64))
        sums[channels:-1] = _host(torch.linalg.vector_norm(values, 2, dims, dtype=torch.float64)) ** 2
        sums[-1] = values.numel() // channels
        _all_reduce(sums, group)
        total = float(sums[-1])
        if total <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {inputs.shape}")
        global_mean = sums[:channels] / total
        global_variance = np.maximum(sums[channels:-1] / total - global_mean * global_mean, 0.0)
        if running_mean is not None and running_var is not None:  # in float64, as torch's CPU kernel moves them
            unbiased = global_variance * (total / (total - 1))
            running_mean.copy_(torch.from_numpy(momentum * global_mean + (1 - momentum) * _host(running_mean)))
            running_var.copy_(torch.from_numpy(momentum * unbiased + (1 - momentum) * _host(running_var)))
        global_invstd = 1.0 / np.sqrt(global_variance + eps)
        mean32, invstd32 = _channels(global_mean, values, [-1]), _channels(global_invstd, values, [-1])
        outputs = F.batch_norm(values, mean32, _channels(global_variance, values, [-1]), weight, bias, False, 0.0, eps)
        ctx.save_for_backward(inputs, weight, mean32, invstd32)
        ctx.total, ctx.group, ctx.eps = total, group, eps
        ctx.mean, ctx.invstd = global_mean, global_invstd
        return outputs.to(inputs.dtype)

    @staticmethod
    def backward(ctx: Any, grad_outputs: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        inputs, weight, mean, invstd = ctx.saved_tensors
        channels = inputs.shape[1]
        values, gradient = inputs.float(), grad_outputs.float()
        if gradient.stride() != values.stride():  # one layout for both: mixed layouts take 6 times as long
            gradient = torch.empty_like(values).copy_(gradient)
        scale = weight.detach().float() if weight is not None else torch.ones_like(mean)
        wanted = ctx.needs_input_grad[0]  # the same on every process (the same network): all call the collective
        local, sum_gradient_normalised, sum_gradient = torch.ops.aten.native_batch_norm_backward(
            gradient, values, scale, None, None, mean, invstd, True, ctx.eps, [wanted, True, True]
        )
        grad_inputs = None
        if wanted:
            # this process's rows normalised by their own sums of dy and dy·x̂; the global ones differ by
            # γ·invstd·(c1 + x̂·c2) per channel, c the local mean minus the global mean of each
            local_sums = np.concatenate([_host(sum_gradient), _host(sum_gradient_normalised)])
            global_means = _all_reduce(local_sums.copy(), ctx.group) / ctx.total
            differences = local_sums / (values.numel() // channels) - global_means
            scaled = _host(scale) * ctx.invstd
            slope = scaled * ctx.invstd * differences[channels:]
            constant = scaled * differences[:channels] - slope * ctx.mean
            view = [1, channels] + [1] * (inputs.dim() - 2)
            grad_inputs = local.addcmul_(values, _channels(slope, local, view)).add_(_channels(constant, local, view))
            grad_inputs = grad_inputs.to(inputs.dtype)
        grad_weight = sum_gradient_normalised if weight is not None and ctx.needs_input_grad[1] else None
        grad_bias = sum_gradient if ctx.needs_input_grad[2] else None
        return grad_inputs, grad_weight, grad_bias, None, None, None, None, None


class _Synced:
    """Mixed into a batch-norm class: in training inside :func:`synchronised`, the statistics of the
    whole batch of the group's processes; otherwise the torch class's own forward."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        group = _GROUP.get()
        if not self.training or group is None:  # evaluation uses the running statistics: no communication
            return super().forward(inputs)
        self._check_input_dim(inputs)
        factor = 0.0 if self.momentum is None else self.momentum
        running: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
            running = (self.running_mean, self.running_var)
        if inputs.is_cuda and dist.get_backend(group) == "nccl":
            world = dist.get_world_size(group)
            return _TorchSyncBatchNorm.apply(inputs, self.weight, self.bias, *running, self.eps, factor, group, world)
        return SyncBatchNormFunction.apply(inputs, self.weight, self.bias, *running, factor, self.eps, group)


class SyncedBatchNorm1d(_Synced, nn.BatchNorm1d):
    """:class:`torch.nn.BatchNorm1d` over the whole batch of the workers (inside :func:`synchronised`)."""


class SyncedBatchNorm2d(_Synced, nn.BatchNorm2d):
    """:class:`torch.nn.BatchNorm2d` over the whole batch of the workers (inside :func:`synchronised`)."""


class SyncedBatchNorm3d(_Synced, nn.BatchNorm3d):
    """:class:`torch.nn.BatchNorm3d` over the whole batch of the workers (inside :func:`synchronised`)."""


_SYNCED = {
    nn.BatchNorm1d: SyncedBatchNorm1d,
    nn.BatchNorm2d: SyncedBatchNorm2d,
    nn.BatchNorm3d: SyncedBatchNorm3d,
}


def sync_batch_norm(model: nn.Module) -> int:
    """Make every batch norm of ``model`` (in place) synchronise inside :func:`synchronised`; the modules
    keep their parameters and buffers (the optimizer and checkpoints see no change). Returns how many
    changed (those already synchronised count); a network without any is an error (the flag would do nothing)."""
    changed = 0
    for module in model.modules():
        if isinstance(module, _Synced):
            changed += 1
        elif type(module) in _SYNCED:  # exactly the plain classes: subclasses may compute something else
            module.__class__ = _SYNCED[type(module)]
            changed += 1
    if not changed:
        raise ConfigError("--sync-batchnorm: this network has no batch norm; leave the flag out")
    return changed


@dataclass
class SyncBatchStatistics(Technique):
    """``--sync-batchnorm``: :func:`sync_batch_norm` on the network as built, on every process; each training
    forward pass runs inside :func:`synchronised` with the group of workers the loop offers
    (:attr:`~scaletrain.efficient.base.Context.batch_group`: a split or join run's workers; none in one
    process). It keeps no state, so it stays out of the checkpointed stack."""

    name: ClassVar[str] = "sync_batchnorm"
    checkpointed: ClassVar[bool] = False
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(
            "sync_batchnorm",
            "every batch norm normalises over the whole global batch of the synchronous workers (one all-reduce "
            "per layer and pass), so a split run equals one process",
            type=bool,
        ),
    )

    #: the workers' group, from the loop's context at :meth:`start` (``None``: this process normalises alone)
    group: dist.ProcessGroup | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        wanted = settings.get("sync_batchnorm", False)
        if not isinstance(wanted, bool):
            raise ConfigError(f"sync_batchnorm must be true or false, got {wanted!r}")
        if not wanted:
            return
        if settings.get("workers", 1) == 1:  # a setting the run would never read is refused, not ignored
            raise ConfigError(
                "--sync-batchnorm normalises over the batch of several workers, and this run has one; "
                "use --workers 2 or more, or leave --sync-batchnorm out"
            )
        if settings.get("sync") in ("async", "none"):
            raise ConfigError(
                "--sync-batchnorm normalises over each global batch, and asynchronous workers share none (each "
                "trains its own batches); use --sync split or join, or leave --sync-batchnorm out"
            )
        if settings.get("ghost_batch") is not None:
            raise ConfigError(
                "--sync-batchnorm normalises over the whole batch and --ghost-batch over ghost batches; choose one"
            )

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> SyncBatchStatistics | None:
        return cls() if settings.get("sync_batchnorm") else None

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        return {"sync_batchnorm": bool(settings.get("sync_batchnorm"))}

    def prepare_model(self, model: nn.Module) -> None:
        sync_batch_norm(model)

    def start(self, model: nn.Module, context: Context) -> None:
        self.group = context.batch_group

    def forward_context(self) -> contextlib.AbstractContextManager:
        return synchronised(self.group)
