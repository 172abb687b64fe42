"""What the processes of a run agree on through the rendezvous store: reconfigurations and module buffers.

The coordinating worker asks the technique and writes its answer under ``reconfigure/EPOCH``
(``none`` when nothing changes); every other process waits for that key, within the run's timeout.
A parameter server reads the same key when its workers tell it they reached the boundary.

Module buffers (batch-norm running statistics, any buffer a workload's network registers) are computed
by each worker from its own data, and only a worker's forward pass moves them. Wherever a model leaves
a process — a checkpoint, ``model.pt``, the final evaluation — a distributed run's buffers are **the mean
over the workers** of each worker's buffers (floating-point ones; others, such as ``num_batches_tracked``,
which synchronous workers all count alike, are the first worker's). Synchronous workers publish theirs
under ``buffers/STEP/RANK`` before the update of every step after which a checkpoint is due (the last
step among them), and every worker takes the mean, so replicas stay equal and a resumed run continues
from what the uninterrupted one holds; a server or rank 0 reads the same keys when it writes the model.
Asynchronous workers never wait for one another: each publishes under ``buffers/latest/RANK`` (at those
of its own steps, and when it has finished), and the process that writes the model takes the mean of
what each published last.

Why the mean: a running mean is an exponential average of batch means, which is linear, so the mean of
the workers' running means is the running mean of the means of the global batches — what one process
computes over the whole batch of a ``split`` step, given the same activations. The running variances'
mean leaves out the spread between the workers' batch means, and in training each worker normalises by
its own share of the batch (both as in Horovod or DistributedDataParallel without synchronised batch
norm); one worker's statistics alone would be an estimate from 1/N of the data.
"""

from __future__ import annotations

import datetime
import io
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient import Reconfiguration
from scaletrain.parallel.failures import ProcessFailed
from scaletrain.train.exchange import PeerLost
from scaletrain.train.state import Agreement

__all__ = ["StoreAgreement", "load_buffers", "mean_buffers"]

NONE = "none"
STATE_KEY = "worker-state"
LATEST = "latest"
LOST_POLL_SECONDS = 0.02


class StoreAgreement(Agreement):
    """``deciding``: this process asks the technique; the others read its answer. ``rank`` and
    ``workers`` (the worker ranks) serve :meth:`mean`."""

    def __init__(
        self,
        store: dist.Store,
        *,
        deciding: bool,
        timeout: float,
        rank: int = 0,
        workers: tuple[int, ...] = (),
        synchronous: bool = True,
        lost: Callable[[], bool] | None = None,
    ) -> None:
        self.store, self.deciding, self.timeout = store, deciding, timeout
        self.rank, self.workers, self.synchronous = rank, workers, synchronous
        # an elastic run's (--min-workers): whether a survivor has said a worker was lost; a worker whose
        # buffers do not come then raises PeerLost (the survivors regroup) instead of stopping the run
        self.lost = lost
        self._published: list[str] = []  # this worker's buffer keys, oldest first

    def mean(self, name: str, value: float, weight: float) -> float:
        """Every worker writes its value; each sums them in rank order, so all get the same number."""
        self.store.set(f"mean/{name}/{self.rank}", f"{value!r} {weight!r}")
        keys = [f"mean/{name}/{rank}" for rank in self.workers]
        try:
            self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
        except RuntimeError:
            raise ProcessFailed(
                f"not every worker reported {name} within {self.timeout:.0f} s: a worker stopped or is far behind"
            ) from None
        pairs = [[float(part) for part in self.store.get(key).decode().split()] for key in keys]
        return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)

    def agree(self, epoch: int, decide: Callable[[], Reconfiguration | None]) -> Reconfiguration | None:
        if not self.deciding:
            return self.read(epoch)
        decision = decide()
        self.store.set(_key(epoch), decision.to_json() if decision is not None else NONE)
        return decision

    def share(self, state: dict[str, Any]) -> None:
        if self.deciding:
            buffer = io.BytesIO()
            torch.save(state, buffer)
            self.store.set(STATE_KEY, buffer.getvalue())

    def shared(self) -> dict[str, Any] | None:
        if not self.store.check([STATE_KEY]):
            return None
        return torch.load(io.BytesIO(self.store.get(STATE_KEY)), map_location="cpu", weights_only=True)

    def buffers_due(self, step: int, model: nn.Module) -> None:
        # published also by a lone worker: a central server that writes the model reads them
        if not self.synchronous:
            self._publish(_buffers_key(LATEST, self.rank), model)
            return
        self._publish(_buffers_key(step, self.rank), model)
        if len(self.workers) > 1:
            load_buffers(model, self.worker_buffers(step))

    def buffers_final(self, model: nn.Module) -> None:
        if not self.synchronous:
            self._publish(_buffers_key(LATEST, self.rank), model)

    def worker_buffers(self, step: int | None) -> dict[str, torch.Tensor] | None:
        if step is None:  # asynchronous: what each worker published last, without waiting
            keys = [key for key in (_buffers_key(LATEST, rank) for rank in self.workers) if self.store.check([key])]
        else:
            keys = [_buffers_key(step, rank) for rank in self.workers]
            if self.lost is not None:
                self._wait_or_lost(keys)
            try:
                self.store.wait(keys, datetime.timedelta(seconds=self.timeout))
            except RuntimeError:
                missing = [rank for rank, key in zip(self.workers, keys, strict=True) if not self.store.check([key])]
                raise ProcessFailed(
                    f"worker rank {', '.join(map(str, missing))} did not hand over its module buffers for step "
                    f"{step} within {self.timeout:.0f} s: it stopped or is far behind"
                ) from None
        states = [torch.load(io.BytesIO(self.store.get(key)), map_location="cpu", weights_only=True) for key in keys]
        return mean_buffers(states) if states else None

    def _wait_or_lost(self, keys: list[str]) -> None:
        """Wait for ``keys`` within the run's timeout, or until a survivor says a worker was lost."""
        deadline = time.monotonic() + self.timeout
        while not self.store.check(keys):
            if self.lost():
                raise PeerLost(None)
            if time.monotonic() > deadline:
                raise PeerLost("did not hand over its module buffers in time")
            time.sleep(LOST_POLL_SECONDS)

    def _publish(self, key: str, model: nn.Module) -> None:
        buffer = io.BytesIO()
        torch.save({name: value.detach().cpu() for name, value in model.named_buffers()}, buffer)
        self.store.set(key, buffer.getvalue())
        if key in self._published:
            return
        self._published.append(key)
        # Two publications later every reader is past this one: a synchronous step cannot complete before
        # every worker (and a server) has read the buffers of the step before it.
        if len(self._published) > 2:
            self.store.delete_key(self._published.pop(0))

    def read(self, epoch: int) -> Reconfiguration | None:
        """The decision after ``epoch``, once the coordinating worker has written it."""
        try:
            self.store.wait([_key(epoch)], datetime.timedelta(seconds=self.timeout))
        except RuntimeError:
            raise ProcessFailed(
                f"no reconfiguration decision for the end of epoch {epoch + 1} within {self.timeout:.0f} s: "
                "the coordinating worker stopped or is far behind"
            ) from None
        text = self.store.get(_key(epoch)).decode()
        return None if text == NONE else Reconfiguration.from_json(text)


def _key(epoch: int) -> str:
    return f"reconfigure/{epoch}"


def _buffers_key(step: int | str, rank: int) -> str:
    return f"buffers/{step}/{rank}"


def mean_buffers(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of each floating-point buffer over ``states`` (in their order, so every process that
    averages the same states gets the same bits); other buffers are the first state's.

    >>> one = {"mean": torch.tensor([1.0, 3.0]), "count": torch.tensor(4)}
    >>> two = {"mean": torch.tensor([3.0, 5.0]), "count": torch.tensor(4)}
    >>> mean_buffers([one, two])
    {'mean': tensor([2., 4.]), 'count': tensor(4)}
    """
    first = states[0]
    mean = {}
    for name, value in first.items():
        if value.is_floating_point() and all(name in s and s[name].shape == value.shape for s in states):
            total = value.to(torch.float64)
            for state in states[1:]:
                total = total + state[name].to(torch.float64)
            mean[name] = (total / len(states)).to(value.dtype)
        else:
            mean[name] = value
    return mean


def load_buffers(model: nn.Module, buffers: dict[str, torch.Tensor] | None) -> None:
    """Copy ``buffers`` into ``model``'s buffers of the same name and shape (buffers of another shape —
    from before a reconfiguration — are left alone: the network's surgery has already carried them)."""
    if not buffers:
        return
    mine = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in buffers.items():
            if name in mine and mine[name].shape == value.shape:
                mine[name].copy_(value)
