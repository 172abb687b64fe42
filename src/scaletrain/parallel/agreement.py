"""One reconfiguration decision for every process of a run, through the rendezvous store.

The coordinating worker asks the technique and writes its answer under ``reconfigure/EPOCH``
(``none`` when nothing changes); every other process waits for that key, within the run's timeout.
A parameter server reads the same key when its workers tell it they reached the boundary.
"""

from __future__ import annotations

import datetime
import io
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.efficient import Reconfiguration
from scaletrain.parallel.failures import ProcessFailed
from scaletrain.train.loop import Agreement

__all__ = ["StoreAgreement"]

NONE = "none"
STATE_KEY = "worker-state"


class StoreAgreement(Agreement):
    """``deciding``: this process asks the technique; the others read its answer. ``rank`` and
    ``workers`` (the worker ranks) serve :meth:`mean`."""

    def __init__(
        self, store: dist.Store, *, deciding: bool, timeout: float, rank: int = 0, workers: tuple[int, ...] = ()
    ) -> None:
        self.store, self.deciding, self.timeout = store, deciding, timeout
        self.rank, self.workers = rank, workers

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
