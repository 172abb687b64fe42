"""The memory probe a batch-size technique asks for: the peak memory of one training step of a network."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable

from torch import nn

from scaletrain.efficient.adaptive_batch import cuda_peak, forked_peak_rss, trial_step
from scaletrain.efficient.sync_batchnorm import synchronised
from scaletrain.tensors.device import to_device
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.state import Prepared, make_optimizer

__all__ = ["step_peak"]


def step_peak(
    prepared: Prepared,
    plan: WorkerPlan,
    model: nn.Module,
    rows: int,
    forward_context: Callable[[], contextlib.AbstractContextManager],
) -> int | None:
    """Peak memory of one step of ``model`` on ``rows`` samples here: a forked copy's peak RSS on the
    CPU, a network copy's peak allocation on a GPU (see :mod:`scaletrain.efficient.adaptive_batch`)."""
    workload, data, device = prepared.workload, prepared.data, prepared.device
    global_batch = rows * plan.part.count  # the --batch-size × factor that gives each process these rows
    if workload.batches_per_epoch(data, global_batch) < 1:
        return None  # the epoch has no batch that large
    batch = next(iter(workload.train_batches(data, epoch=0, batch_size=rows, seed=prepared.config.seed)))
    batch = to_device(batch, device)
    # the run's optimizer: its step runs on a forked copy (CPU) or a copy of the network (GPU), never the run's own
    optimizer_of = lambda parameters: make_optimizer(prepared.config, parameters)  # noqa: E731
    forward_context = _alone(forward_context)
    if device.type == "cpu":
        return forked_peak_rss(trial_step(model, workload, batch, rows, forward_context, optimizer_of))
    copy_on_device = copy.deepcopy(model)
    return cuda_peak(trial_step(copy_on_device, workload, batch, rows, forward_context, optimizer_of), device)


def _alone(forward_context: Callable[[], contextlib.AbstractContextManager]) -> Callable[[], contextlib.ExitStack]:
    """The step's context with batch norms that normalise alone: a trial step runs on one process (in a
    forked copy on the CPU), so a synchronised batch norm there must not wait for the other workers."""

    def entered() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(forward_context())
        stack.enter_context(synchronised(None))
        return stack

    return entered
