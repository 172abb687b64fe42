"""Which samples each worker of a foreign run reads at each step, drawn as scaletrain's own strategies draw them.

``run`` is an :class:`~scaletrain.engines.prepare.EngineRun` (typed loosely here: that module imports this one).
A sample is an image (``lenet``) or a window of words (``gpt``); ``ptb-lstm``'s rows of carried state have orders
of their own (:func:`scaletrain.engines.prepare_text.text_orders`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from scaletrain.data.sampler import EpochBatches, Part
from scaletrain.train.plan import WorkerPlan

__all__ = ["plans", "worker_orders"]


def plans(run: Any) -> list[WorkerPlan]:
    """Each worker's share of the data, as scaletrain's own strategies draw it: a slice of every global batch
    of ``workers × batch_size`` (sync), a contiguous chunk of each epoch's batches (async), or everything."""
    if run.mode == "sync":
        return [WorkerPlan(global_batch_factor=run.workers, part=Part(i, run.workers)) for i in range(run.workers)]
    if run.mode == "async":
        return [WorkerPlan(chunk=Part(i, run.workers)) for i in range(run.workers)]
    return [WorkerPlan()]


def worker_orders(run: Any, train_size: int) -> list[np.ndarray]:
    """The sample indices of every step of each worker: ``(steps, batch_size)`` per worker.

    >>> from scaletrain.engines.prepare import EngineRun
    >>> run = EngineRun("mxnet", "lenet", "sync", 2, 1, 2, 0.1, 0.0, 0.0, 1, None, 0, 1, 0, None)
    >>> [order.shape for order in worker_orders(run, 10)]  # 10 samples, global batches of 4: 2 steps
    [(2, 2), (2, 2)]
    >>> first, second = worker_orders(run, 10)
    >>> together = sorted(first[0].tolist() + second[0].tolist())
    >>> together == sorted(EpochBatches(10, batch_size=4, seed=0, epoch=0).indices(0).tolist())
    True
    """
    orders = []
    for plan in plans(run):
        global_batch = run.batch_size * plan.global_batch_factor
        per_epoch = train_size // global_batch
        epochs = run.epochs if run.epochs is not None else -(-run.steps // max(len(plan.numbers(0, per_epoch)), 1))
        steps = []
        for epoch in range(epochs):
            batches = EpochBatches(train_size, batch_size=global_batch, seed=run.seed, epoch=epoch, part=plan.part)
            steps += [batches.indices(number).numpy() for number in plan.numbers(0, per_epoch)]
        if run.steps is not None:
            steps = steps[: run.steps]
        orders.append(np.stack(steps).astype(np.int64) if steps else np.zeros((0, run.batch_size), np.int64))
    return orders
