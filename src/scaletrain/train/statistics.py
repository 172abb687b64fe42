"""Batch norm's running statistics estimated afresh for the weights a model holds now.

An outer step of ``diloco`` moves the weights past those whose activations the running statistics were gathered
from (with Nesterov momentum, far past: ResNet-20 on Fashion-MNIST evaluated at chance, 0.10, after two outer
steps, its training loss where the synchronous run's was). Where a run ends on such a step, each worker passes its
share of the epoch's first batches through the network in training mode without gradients, every batch counted
equally (the running averages reset, momentum None), as ``torch.optim.swa_utils.update_bn`` does for averaged
weights; the workers then agree on the mean (the exchange's own collective).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

import torch
from torch import nn

from scaletrain.tensors.device import to_device

if TYPE_CHECKING:
    from scaletrain.train.loop import Trainer

__all__ = ["refresh_batch_norm"]


def refresh_batch_norm(trainer: Trainer, batches: int) -> int:
    """Re-estimate every tracking batch norm of ``trainer``'s model over ``batches`` of this worker's share (at most
    an epoch's); how many batch norms there were (0: nothing done)."""
    model = trainer.model
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return 0
    momenta = [norm.momentum for norm in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None  # a cumulative average: every batch counts the same
    training = model.training
    model.train()
    prepared, plan = trainer.prepared, trainer.role.plan
    numbers = range(min(batches, prepared.schedule.steps_in(0)))
    data = trainer.workload.train_batches(
        trainer.data,
        epoch=0,
        batch_size=prepared.update_batch * plan.global_batch_factor,
        seed=prepared.config.seed,
        part=plan.part,
        numbers=numbers,
    )
    state = trainer.workload.initial_state(model, prepared.update_batch * plan.global_batch_factor // plan.part.count)
    try:
        with torch.no_grad(), contextlib.closing(_Closing(data)) as batches_here:
            for batch in batches_here:
                _, _, state = trainer.workload.training_loss(model, to_device(batch, prepared.device), state)
    finally:
        for norm, momentum in zip(norms, momenta, strict=True):
            norm.momentum = momentum
        model.train(training)
    return len(norms)


class _Closing:
    """An iterable's iterator with a ``close`` (a data loader's worker processes stop with it)."""

    def __init__(self, iterable: object) -> None:
        self._iterator = iter(iterable)  # type: ignore[call-overload]

    def __iter__(self) -> _Closing:
        return self

    def __next__(self) -> object:
        return next(self._iterator)

    def close(self) -> None:
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()
