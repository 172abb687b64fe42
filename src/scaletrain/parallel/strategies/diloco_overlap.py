"""``-S overlap_steps=K``: DiLoCo's outer exchange runs in a thread of the worker while it takes its next K inner steps.

At an outer step each worker hands the change since the anchor (and its floating-point buffers) to a thread that
all-reduces them through the run's wire codec on a process group of its own, and goes on training. K inner steps
later it waits for what the thread has not finished, the outer optimizer steps the anchor with the mean change, and
the worker moves to the new anchor plus what it trained since it handed the change over (its buffers likewise):
nothing trained is dropped, and the next outer step sends it (Douillard et al. 2025, "Streaming DiLoCo", overlap
with τ steps). Every wait has a time limit, the run's ``--timeout`` per collective of the codec, and a failed
collective is raised in the main thread. A checkpoint waits for an exchange in flight and saves what came back beside
the weights it left from, so a resumed run lands it at the same step; the run's last outer step lands it first.
"""

from __future__ import annotations

import datetime
import threading
from dataclasses import dataclass

import torch
import torch.distributed as dist

from scaletrain.tensors.codec import Collectives, TensorLayout, WireCodec

__all__ = ["OuterInFlight", "Reduced"]

STREAM = "all-reduce"  # the same residuals as an outer step the workers wait for (the last one)


@dataclass
class Reduced:
    """What the thread brings back: the workers' summed change, and their summed buffers (None: there are none)."""

    total: torch.Tensor
    buffers: torch.Tensor | None


class OuterInFlight:
    """One worker's outer exchange in a thread: :meth:`start` it, :meth:`finish` it K inner steps later."""

    def __init__(self, codec: WireCodec, timeout: float) -> None:
        self.codec, self.timeout = codec, timeout
        self.group = dist.new_group(timeout=datetime.timedelta(seconds=timeout))
        self.collectives = Collectives(self.group)
        self._thread: threading.Thread | None = None
        self._result: Reduced | None = None
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, flat: torch.Tensor, layout: TensorLayout, buffers: torch.Tensor | None) -> None:
        """All-reduce ``flat`` (the packed change) through the codec, then ``buffers`` summed, in a thread."""
        if self._thread is not None:
            raise RuntimeError("an outer exchange is in flight already")

        def reduce() -> None:
            try:
                total = self.codec.allreduce(flat, layout, stream=STREAM, collectives=self.collectives)
                if buffers is not None:
                    self.collectives.all_reduce(buffers)
                self._result = Reduced(total, buffers)
            except BaseException as error:  # raised in the main thread by finish()
                self._error = error

        self._thread = threading.Thread(target=reduce, name="outer-exchange", daemon=True)
        self._thread.start()

    def finish(self) -> Reduced:
        """Wait for the exchange in flight (at most the codec's collectives' time limits) and return it."""
        thread = self._thread
        if thread is None:
            raise RuntimeError("no outer exchange is in flight")
        thread.join(self.timeout * (self.codec.collective_calls + 2))
        if thread.is_alive():
            raise TimeoutError(
                f"the outer exchange did not finish within its time limit ({self.timeout:g} s per collective): "
                "a worker stopped answering"
            )
        self._thread = None
        error, result = self._error, self._result
        self._error = self._result = None
        if error is not None:
            raise error
        return result
