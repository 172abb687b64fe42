"""``allreduce``: gradients averaged over every worker, then the same step everywhere.

One flat buffer goes through the wire codec's collective — ``all_reduce`` (gloo on CPU, NCCL on GPU)
for a cast, whatever a codec of its own needs — after backward, so its communication time can be read
apart from computation; with ``--overlap`` buckets of gradients are reduced while backward computes
the rest, as DistributedDataParallel does (:mod:`~scaletrain.parallel.strategies.overlap`).
With one worker there is nothing to average and no collective is called. Predicted as a ring
all-reduce (Patarasuk & Yuan 2009): 2(N−1)/N · bytes / bandwidth + 2(N−1) latencies, then every
worker's optimizer step; the thesis's distributed-server formula stands for it (the same
2·t_comm·(N−1)/N per iteration).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.agreement import StoreAgreement
from scaletrain.parallel.strategies.base import Layout, Strategy, collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.batch_norm import batch_group
from scaletrain.parallel.strategies.elastic import store_membership
from scaletrain.parallel.strategies.elastic_waits import HeardOfLoss, WatchedCollectives
from scaletrain.parallel.strategies.overlap import Overlap, OverlappedReduce
from scaletrain.parallel.strategies.terms import EstimatorTerms, StepInputs, calibrated_seconds, gradient_bytes
from scaletrain.tensors.codec import Collectives, LayoutMismatch, TensorLayout, WireCodec, wire_codec
from scaletrain.tensors.flat import flatten, unflatten_into
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, PeerLost, clip_and_step
from scaletrain.train.membership import elastic_fields, take_live_state
from scaletrain.train.meter import now
from scaletrain.train.state import Membership, Prepared, Role
from scaletrain.train.summary import write_summary

__all__ = ["AllReduce", "AllReduceExchange", "ring_allreduce_seconds"]

T = TypeVar("T")


def ring_allreduce_seconds(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """A synchronous step besides the gradient: the all-reduce of the gradient message as the wire codec
    sends it, the codec's own compute, then every worker's optimizer step.

    The all-reduce is the ring's formula from the point-to-point latency and bandwidth: 2(N−1)
    latencies and 2(N−1)/N of the message per worker for each collective call of a codec whose
    payloads add up as they travel; N−1 latencies per call and N−1 messages for a codec that
    all-gathers (top-k), which also decompresses every other worker's payload (timed as one
    decompress each, which zeroes the whole gradient too: at most that). The codec's compute is its
    all-reduce at world size 1 less float32's (``codec_seconds``). All of it is corrected by the
    exchange itself where the profile timed it among N processes (``--exchange-at``): gloo's
    collective among many processes sharing cores costs more than the formula (×10 at 14 processes of
    an H100 machine's CPU, results/h100-2026-11-26).

    >>> from scaletrain.estimate.profile import Profile
    >>> from scaletrain.estimate.refined import Terms
    >>> toy = dict(t_grad=0.1, t_comm=0.01, latency=0.0, weight_bytes=10**6, bandwidth=1e8, gradient_bytes=10**4)
    >>> summed = Terms(Profile("toy", 8, **toy), None)
    >>> gathered = Terms(Profile("toy", 8, **toy, collective="all_gather", collective_calls=2), None)
    >>> [ring_allreduce_seconds(t, np.array([4])).round(6).tolist() for t in (summed, gathered)]  # 1.5 and 3 messages
    [[0.00015], [0.0003]]
    """
    profile = inputs.profile
    gathers = profile.collective == "all_gather"

    def ring(workers: int) -> float:
        if workers <= 1:
            return 0.0
        messages = (workers - 1) if gathers else 2 * (workers - 1) / workers
        latencies = (1 if gathers else 2) * (workers - 1) * profile.collective_calls
        transfer = latencies * profile.latency + messages * gradient_bytes(profile) / profile.bytes_per_second
        decoded = (workers - 1) * profile.codec("decompress") if gathers else 0.0
        return transfer + profile.codec("allreduce") + decoded

    return calibrated_seconds(profile, profile.allreduce, n, ring) + profile.t_update


class AllReduce(Strategy):
    name = "allreduce"
    description = "gradients averaged by all-reduce, the same step on every worker"
    syncs = ("join", "split")
    device_collectives = True
    all_reduce_codecs = True
    overlaps = True

    def elastic(self, layout: Layout) -> bool:
        return True

    def admits_joiners(self, layout: Layout) -> bool:
        return True

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        return EstimatorTerms(
            exchange=ring_allreduce_seconds, thesis_server="distributed", overlaps=True, probe="allreduce"
        )

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        config = prepared.config
        elastic = config.min_workers is not None and (layout.workers > 1 or config.join)
        membership = store_membership(store, rank, layout, config, prepared.batch_size) if elastic else None
        plan, workers = layout.worker_plan(rank), layout.workers
        agreement = StoreAgreement(
            store,
            deciding=rank == 0,
            timeout=config.timeout,
            rank=rank,
            workers=tuple(layout.worker_ranks()),
            lost=membership.peer_lost if membership is not None else None,
        )
        joined = None
        if config.join:  # admitted by the run, with its live state: nothing is read from a checkpoint
            regrouped, state = membership.join()
            take_live_state(prepared.model, prepared.optimizer, prepared.position, state)
            plan, workers, agreement, joined = regrouped.plan, regrouped.workers, regrouped.agreement, regrouped.record
            print(f"joined the run after step {joined['step']}; {workers} workers now", flush=True)
        overlap = None
        if config.overlap:
            overlap = Overlap(lambda: wire_codec(config), int(config.bucket_mb * 2**20), config.timeout)
        exchange = AllReduceExchange(
            workers, wire_codec(config), membership=membership, synced=config.join, overlap=overlap
        )
        role = Role(
            rank=rank,
            plan=plan,
            exchange=exchange,
            coordinator=rank == 0,
            checkpoints=rank == 0,
            evaluate_each_epoch=False,
            agreement=agreement,
            batch_group=batch_group(config, layout),
            membership=membership,
        )
        trainer = train_worker(prepared, role, store)
        if joined is not None:
            return {"rank": rank, "out": str(config.out), "joined": joined}
        if rank != 0:
            return None
        if membership is not None:
            membership.refuse_waiting("the run has finished training")
        workers = membership.members if membership is not None else layout.worker_ranks()
        stats = collect_stats(store, workers, set(), config.timeout)
        fields = layout_fields(layout, config)
        if membership is not None:
            fields |= elastic_fields(membership, trainer, layout.workers)
        elif config.min_workers is not None:  # one worker: nothing to go on without
            segments = trainer.membership.segments(1, trainer.position.step)
            fields |= {
                "min_workers": config.min_workers,
                "max_workers": layout.workers,
                "workers_at_end": 1,
                "membership": [],
                "membership_segments": segments,
            }
        return write_summary(prepared, trainer.final_quality(), stats, layout_fields=fields)


class AllReduceExchange(GradientExchange):
    """Gradients averaged over all workers by the codec's collective (``all_reduce`` of a cast; a codec
    whose payload does not add up runs its own); every worker then takes the same step."""

    def __init__(
        self,
        workers: int,
        codec: WireCodec | None = None,
        *,
        membership: Membership | None = None,
        synced: bool = False,
        overlap: Overlap | None = None,
    ) -> None:
        self.workers = workers
        self.codec = codec or WireCodec()
        # elastic (--min-workers): a lost peer raises PeerLost (the survivors regroup) instead of stopping the
        # run, and a worker waiting to join is agreed on in the step's first all-reduce
        self.membership = membership
        self.lost = getattr(membership, "peer_lost", None)
        # an elastic run's collectives give up as soon as another survivor saw a peer lost
        self.collectives = Collectives() if self.lost is None else WatchedCollectives(lost=self.lost)
        self.synced = synced  # a worker that joined has its weights from a live peer already
        self._ready = torch.zeros(1)
        self.overlap = overlap
        self._overlapped: OverlappedReduce | None = None

    def resize(self, workers: int) -> None:
        self.workers = workers
        self.codec.reset()  # residuals and factors were the old group's

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.workers == 1 or self.synced:
            return
        parameters = list(model.parameters())
        check_same_layout(parameters)
        weights = flatten([p.detach() for p in parameters])
        dist.broadcast(weights, src=0)
        with torch.no_grad():
            unflatten_into(weights, parameters)
        self._overlap_on(model)

    def _overlap_on(self, model: nn.Module) -> None:
        if self.overlap is not None and self.workers > 1:
            if self._overlapped is not None:
                self._overlapped.close()
            self._overlapped = OverlappedReduce(
                model, self.overlap.make_codec, self.overlap.bucket_bytes, timeout=self.overlap.timeout
            )

    def reconfigure(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # Every worker rebuilt the same network from the agreed decision; the buffers are made per step.
        self.codec.reset()
        if self.workers > 1:
            check_same_layout(list(model.parameters()))
            self._overlap_on(model)  # new buckets for the new tensors, their codecs fresh

    def state_dict(self) -> dict | None:
        if self._overlapped is not None:
            return self._overlapped.state_dict()
        return self.codec.state_dict() if self.workers > 1 else None

    def load_state_dict(self, state: dict) -> None:
        taken = (self._overlapped or self.codec).load_state_dict(state)
        if not taken and (state.get("residuals") or state.get("overlap_buckets")):
            print(
                "the checkpoint's wire codec state was saved with another --wire or --overlap: starting it afresh",
                flush=True,
            )

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        if self.workers == 1:
            self._ask_joiners_alone()
            return ExchangeTimes(skipped=clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite))
        if self._overlapped is not None:
            return self._overlapped_step(model, optimizer, clip_norm)
        parameters = [p for p in model.parameters() if p.grad is not None]
        begin = now()
        gradients = [p.grad for p in parameters]
        layout = TensorLayout.of(gradients)
        arrived, total = self._reduce_or_lost(gradients, layout)
        total /= self.workers
        unflatten_into(total, gradients)
        done = now()
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        return ExchangeTimes(
            communication=done - arrived,
            wait=arrived - begin,
            skipped=skipped,
            sent_bytes=self.codec.payload_bytes(layout),
        )

    def _overlapped_step(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None
    ) -> ExchangeTimes:
        begin = now()
        self._overlapped.finish()  # what backward did not hide
        done = now()
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        return ExchangeTimes(communication=done - begin, skipped=skipped, sent_bytes=self._overlapped.payload_bytes())

    def _ask_joiners_alone(self) -> None:
        """A lone worker of an elastic run asks for joiners itself (there is no all-reduce to carry it)."""
        if self.membership is not None:
            self.membership.join_due = self.membership.join_requested()

    def _reduce_or_lost(self, gradients: list[torch.Tensor], layout: TensorLayout) -> tuple[float, torch.Tensor]:
        """:meth:`_reduce`; in an elastic run a lost peer raises :class:`PeerLost` (nothing is applied yet)."""
        return self._or_lost(lambda: self._reduce(gradients, layout))

    def _or_lost(self, collectives: Callable[[], T]) -> T:
        """``collectives()``; in an elastic run a lost peer during them raises :class:`PeerLost`."""
        try:
            return collectives()
        except RuntimeError as error:  # c10d/gloo: a peer closed its connections or a wait timed out
            if self.lost is None:
                raise
            print(f"lost a peer during the step's all-reduce: {str(error).splitlines()[0]}", flush=True)  # to the log
            text = str(error).lower()
            why = None if isinstance(error, HeardOfLoss) else "stopped answering" if "timed out" in text else "died"
            raise PeerLost(why) from error

    def _reduce(self, gradients: list[torch.Tensor], layout: TensorLayout) -> tuple[float, torch.Tensor]:
        # A one-number all-reduce first: it returns when the slowest worker arrives, so the time it
        # takes is waiting, and the big all-reduce after it is (mostly) transfer. In an elastic run it also
        # carries the deciding member's "a worker waits to join", so every member learns it in the same step.
        membership = self.membership
        self._ready.fill_(float(membership is not None and membership.join_requested()))
        self._all_reduce(self._ready)
        if membership is not None:
            membership.join_due = bool(self._ready.item() > 0)
        arrived = now()
        flat = self.codec.pack(gradients)
        # The codec runs the collectives: an all-reduce of a cast, or whatever its payload needs.
        return arrived, self.codec.allreduce(flat, layout, stream="all-reduce", collectives=self.collectives)

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        self.collectives.all_reduce(tensor)


def check_same_layout(parameters: list[torch.Tensor]) -> None:
    """Every rank must hold tensors of the same shapes before a collective over them, or gloo fails
    with a size error or hangs: compare a fingerprint of the shapes first and name both sides."""
    mine = TensorLayout.of(parameters)
    gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine.as_tensor())
    for rank, theirs in enumerate(gathered):
        other = TensorLayout.from_tensor(theirs)
        if other != mine:
            raise LayoutMismatch(
                f"worker rank {dist.get_rank()} holds tensors of layout {mine} but worker rank {rank} holds {other}; "
                "every worker must build the same network"
            )
