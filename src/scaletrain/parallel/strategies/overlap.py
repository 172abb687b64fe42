"""``--overlap``: each bucket of gradients is all-reduced while backward still computes the others.

Backward produces the last layers' gradients first. Parameters are taken in reverse order into *buckets* of
``--bucket-mb``, as DistributedDataParallel groups them (Li et al., "PyTorch Distributed", VLDB 2020). As soon as
every gradient of a bucket has been accumulated, a thread of the worker all-reduces it through a wire codec of its
own while the main thread goes on with backward, and the step then waits only for what is left when backward ends.
On a slow link this hides the transfer behind the computation, which a codec that makes the message small
(``--wire powersgd``) cannot do alone: its all-reduces still wait on the link after backward.

A bucket is reduced by the same codec as the whole gradient would be, so the float32 and bfloat16 wires give the
steps of the run without overlap (up to the rounding of a sum taken in another order) and a compressed wire's
buckets each keep their own residuals and factors. Buckets are reduced strictly in their fixed order on a process
group of their own, so collectives of the main thread (synchronised batch norm in backward) cannot interleave;
every wait has a timeout, and a failed collective is raised in the main thread as it would be without overlap
(``tests/parallel/test_overlap.py`` checks each). ``communication`` is the part of the exchange backward did not
hide, the wait for the slowest worker inside it. Refused before any process starts: parameter servers (a round
trip per owner, not a collective), elastic runs (``--min-workers``) and dynamic loss scaling (``--precision
fp16``), whose overflow check runs after backward, on gradients already sent. docs/precision-and-devices.md has
the measurements.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.tensors.codec import Collectives, TensorLayout, WireCodec
from scaletrain.tensors.flat import unflatten_into, views_of

__all__ = ["Bucket", "Overlap", "OverlapFailed", "OverlappedReduce", "bucket_indices", "buckets_of"]

STREAM = "all-reduce"


@dataclass(frozen=True)
class Overlap:
    """A run's ``--overlap``: a fresh codec for each bucket, the buckets' size, the collectives' timeout."""

    make_codec: Callable[[], WireCodec]
    bucket_bytes: int
    timeout: float


class OverlapFailed(RuntimeError):
    """The overlapped all-reduce did not finish within its time limit (no collective raised)."""


@dataclass
class Bucket:
    """Parameters reduced together, their layout, and the codec that carries their residuals and factors."""

    parameters: list[nn.Parameter]
    codec: WireCodec

    def __post_init__(self) -> None:
        self.layout = TensorLayout.of([p.detach() for p in self.parameters])
        self.ready = threading.Event()
        self.pending = len(self.parameters)


def bucket_indices(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Tensors of ``sizes`` bytes each, taken in reverse order (backward's), cut into buckets of at least
    ``bucket_bytes`` each (the last one may be smaller): each bucket's tensor indices.

    >>> bucket_indices([40, 1200, 20, 800], 1000)
    [[3, 2, 1], [0]]
    """
    buckets: list[list[int]] = [[]]
    filled = 0
    for index in reversed(range(len(sizes))):
        buckets[-1].append(index)
        filled += sizes[index]
        if filled >= bucket_bytes:
            buckets.append([])
            filled = 0
    return [bucket for bucket in buckets if bucket]


def buckets_of(parameters: list[nn.Parameter], bucket_bytes: int) -> list[list[nn.Parameter]]:
    """``parameters`` cut into buckets of at least ``bucket_bytes`` of float32 gradient (:func:`bucket_indices`).

    >>> sizes = [nn.Parameter(torch.zeros(n)) for n in (10, 300, 5, 200)]
    >>> [[p.numel() for p in b] for b in buckets_of(sizes, 1000)]
    [[200, 5, 300], [10]]
    """
    indices = bucket_indices([4 * p.numel() for p in parameters], bucket_bytes)
    return [[parameters[i] for i in bucket] for bucket in indices]


class OverlappedReduce:
    """The buckets of one network, the hooks that mark them ready, and the thread that reduces each step's.

    Made on every worker of the group at the same moment (it creates a process group, a collective
    call); :meth:`close` before the network changes shape.
    """

    def __init__(
        self, model: nn.Module, make_codec: Callable[[], WireCodec], bucket_bytes: int, *, timeout: float
    ) -> None:
        parameters = [p for p in model.parameters() if p.requires_grad]
        self.buckets = [Bucket(members, make_codec()) for members in buckets_of(parameters, bucket_bytes)]
        self.timeout = timeout
        self.group = dist.new_group(timeout=datetime.timedelta(seconds=timeout))
        self.collectives = Collectives(self.group)
        self.workers = dist.get_world_size(self.group)
        self._bucket_of = {id(p): bucket for bucket in self.buckets for p in bucket.parameters}
        self._handles = [p.register_post_accumulate_grad_hook(self._accumulated) for p in parameters]
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    @property
    def codecs(self) -> list[WireCodec]:
        return [bucket.codec for bucket in self.buckets]

    def payload_bytes(self) -> int:
        """The bytes this worker put on the wire for the last step's buckets."""
        return sum(bucket.codec.payload_bytes(bucket.layout) for bucket in self.buckets)

    def _accumulated(self, parameter: torch.Tensor) -> None:
        bucket = self._bucket_of[id(parameter)]
        with self._lock:
            bucket.pending -= 1
            if bucket.pending == 0:
                bucket.ready.set()
            if self._thread is None:  # the step's first gradient: its reductions begin
                self._start()

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._reduce_all, name="overlapped-all-reduce", daemon=True)
        self._thread.start()

    def _reduce_all(self) -> None:
        try:
            for bucket in self.buckets:  # their fixed order, on every worker
                if not bucket.ready.wait(self.timeout):
                    raise OverlapFailed(f"the gradients of a bucket were not ready within {self.timeout:g} s")
                self._reduce(bucket)
        except BaseException as error:
            self._error = error

    def _reduce(self, bucket: Bucket) -> None:
        gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket.parameters]
        flat = bucket.codec.pack(gradients)
        total = bucket.codec.allreduce(flat, bucket.layout, stream=STREAM, collectives=self.collectives)
        total /= self.workers
        present = [p.grad for p in bucket.parameters if p.grad is not None]
        if len(present) == len(gradients):
            unflatten_into(total, present)
        else:  # a parameter without a gradient this step keeps none: the others take theirs
            for p, part in zip(bucket.parameters, views_of(total, bucket.parameters), strict=True):
                if p.grad is not None:
                    p.grad.copy_(part)

    def finish(self) -> None:
        """After backward: reduce what is left (a bucket whose parameters got no gradient this step is
        reduced with zeros for them), wait for every bucket (bounded by the codec's collectives and the run's
        timeout), and leave the averaged gradients in the parameters. Raises what a collective raised."""
        with self._lock:
            for bucket in self.buckets:
                bucket.ready.set()
            if self._thread is None:  # no gradient at all this step: reduce zeros, as every worker does
                self._start()
        thread = self._thread
        calls = max(bucket.codec.collective_calls for bucket in self.buckets)
        thread.join(self.timeout * (calls * len(self.buckets) + 1))
        if thread.is_alive():
            raise OverlapFailed(
                f"the overlapped all-reduce of the step did not finish within its time limit "
                f"({self.timeout:g} s per collective)"
            )
        self._thread = None
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.pending = len(bucket.parameters)
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Remove the hooks (the network is about to change) and the process group."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        dist.destroy_process_group(self.group)

    def state_dict(self) -> dict[str, object]:
        return {"overlap_buckets": [bucket.codec.state_dict() for bucket in self.buckets]}

    def load_state_dict(self, state: dict) -> bool:
        """Take each bucket's codec state; False (nothing taken) for a state saved without the same buckets."""
        saved = state.get("overlap_buckets")
        if not isinstance(saved, list) or len(saved) != len(self.buckets):
            return False
        return all([bucket.codec.load_state_dict(part) for bucket, part in zip(self.buckets, saved, strict=True)])
