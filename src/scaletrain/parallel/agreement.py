"""One reconfiguration decision for every process of a run, through the rendezvous store.

The coordinating worker asks the technique and writes its answer under ``reconfigure/EPOCH``
(``none`` when nothing changes); every other process waits for that key, within the run's timeout.
A parameter server reads the same key when its workers tell it they reached the boundary.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable

import torch.distributed as dist

from scaletrain.efficient import Reconfiguration
from scaletrain.parallel.failures import ProcessFailed
from scaletrain.train.loop import Agreement

__all__ = ["StoreAgreement"]

NONE = "none"


class StoreAgreement(Agreement):
    """``deciding``: this process asks the technique; the others read its answer."""

    def __init__(self, store: dist.Store, *, deciding: bool, timeout: float) -> None:
        self.store, self.deciding, self.timeout = store, deciding, timeout

    def agree(self, epoch: int, decide: Callable[[], Reconfiguration | None]) -> Reconfiguration | None:
        if not self.deciding:
            return self.read(epoch)
        decision = decide()
        self.store.set(_key(epoch), decision.to_json() if decision is not None else NONE)
        return decision

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
