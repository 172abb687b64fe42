"""``diloco``: each worker takes ``--sync-every H`` steps of its own optimizer (``--optimizer``, the inner one) on its
share of the batches, then the workers average how far they moved since the last outer step (the pseudo-gradient,
through the run's wire codec) and an outer optimizer steps the shared weights with it (Douillard et al. 2023,
"DiLoCo": inner AdamW, outer Nesterov SGD at rate 0.7, momentum 0.9, the defaults here). The workers talk once
every H steps; at each outer step they also average their floating-point buffers (batch norm's running
statistics), which every worker then holds. Local SGD (averaging the replicas every H steps) is the outer step
at rate 1 without momentum (``-S outer_lr=1 -S outer_momentum=0``); with ``--sync-every 1`` and plain or momentum
SGD inside, that is the synchronous all-reduce exactly (the average of the workers' SGD steps is the step of
their average gradient).

The shared weights (the anchor), the outer optimizer's state and the steps since the last outer step are saved
beside every checkpoint with the codec's state, so that a resumed run goes on exactly. With ``--min-workers`` the
survivors of a lost worker drop its inner steps since the last outer step and go on, and workers started later
(``--join``) take the anchor and the outer optimizer's state at an outer step (:mod:`.diloco_elastic`).
``-S outer_exchange=sharded`` sends the change to the sharded parameter server instead, whose owners each step
their share of the anchor with the outer optimizer (:mod:`.diloco_sharded`); ``sharded-async`` has each owner step
its share with each worker's change as it comes, at ``outer_lr`` / N, and the staleness recorded. The estimators
predict it (:func:`outer_step_seconds`: a step that talks once in H).

With ``--technique``, every epoch's end is an outer step too (:meth:`DiLoCoExchange.settle`): the technique decides
on the shared weights, every worker applies the decision to them, and the anchor and the outer optimizer's state
are reshaped by the same surgery as the network and the inner optimizer's
(:func:`~scaletrain.efficient.surgery.reshaped_copy`). Not built yet:
``--technique`` with ``--min-workers`` or through the sharded server, ``--overlap``, and ``--min-workers``
through the sharded server (each refused in one line).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from scaletrain.config import WARMUP_STEPS, TrainConfig
from scaletrain.efficient.base import Reconfiguration
from scaletrain.efficient.surgery import reshaped_copy
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.allreduce import AllReduceExchange, ring_allreduce_seconds
from scaletrain.parallel.strategies.base import (
    Layout,
    Strategy,
    StrategyOption,
    collect_stats,
    layout_fields,
    train_worker,
)
from scaletrain.parallel.strategies.diloco_elastic import Rollback, own_state, run_elastic, take_own_state
from scaletrain.parallel.strategies.diloco_sharded import run_sharded
from scaletrain.parallel.strategies.ps.terms import sharded_exchange
from scaletrain.parallel.strategies.roles import worker_role
from scaletrain.parallel.strategies.terms import EstimatorTerms, StepInputs
from scaletrain.tensors.codec import CODECS, TensorLayout, WireCodec, wire_codec
from scaletrain.tensors.flat import mean_over, unflatten_into
from scaletrain.tensors.optimizers import build_optimizer
from scaletrain.train.exchange import ExchangeTimes, PeerLost, clip_and_step
from scaletrain.train.meter import now
from scaletrain.train.state import Membership, Prepared
from scaletrain.train.summary import write_summary

__all__ = ["DiLoCo", "DiLoCoExchange"]

#: What a run through the asynchronous owners with an outer momentum is told at its start (measured on ResNet-20:
#: results/slow-links-2026-12-07/).
ASYNC_MOMENTUM = (
    "an outer momentum through the asynchronous owners cost ResNet-20 5 to 11 points of accuracy against the same "
    "run in turn (H = 128, 6 epochs); a plain average kept it: -S outer_lr=1 -S outer_momentum=0"
)


class DiLoCo(Strategy):
    name = "diloco"
    description = "H inner steps on each worker, then an outer step with the averaged change (DiLoCo, local SGD)"
    syncs = ("join", "split")
    all_reduce_codecs = True
    recommended_unasked = False  # fewer outer steps are always faster; what H costs in quality is not predicted
    one_process_options: ClassVar[dict[str, Any] | None] = {"sync_every": 1, "outer_lr": 1.0, "outer_momentum": 0.0}
    options = (
        StrategyOption("sync_every", "inner steps between two outer steps (H)", 10, type=int, flag="sync_every"),
        StrategyOption("outer_optimizer", "the outer step's optimizer, as --optimizer takes it", "sgd"),
        StrategyOption("outer_lr", "the outer step's rate", 0.7, type=float),
        StrategyOption("outer_momentum", "the outer SGD's momentum", 0.9, type=float),
        StrategyOption("outer_nesterov", "the outer SGD's Nesterov momentum", True, type=bool),
        StrategyOption(
            "outer_exchange",
            "allreduce: the workers average the change; sharded: each owner of the sharded parameter server steps "
            "its share of the anchor with the workers' mean change; sharded-async: with each worker's change as it "
            "comes, at outer_lr / N",
            "allreduce",
            choices=("allreduce", "sharded", "sharded-async"),
        ),
    )

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        # the thesis has no formula for it; the workers meet only at an outer step
        return EstimatorTerms(exchange=outer_step_seconds, probe="allreduce", meetings=outer_meetings)

    def elastic(self, layout: Layout) -> bool:
        return True  # through the sharded server it is refused in check_options

    def admits_joiners(self, layout: Layout) -> bool:
        return True

    def check_options(self, values: Mapping[str, Any], layout: Layout, config: TrainConfig) -> None:
        if values["sync_every"] < 1:
            raise ConfigError(f"--sync-every must be 1 or more inner steps, got {values['sync_every']}")
        if not values["outer_lr"] > 0 or not 0 <= values["outer_momentum"] < 1:
            raise ConfigError("--strategy diloco: -S outer_lr must be > 0 and -S outer_momentum in [0, 1)")
        if config.technique is not None and config.min_workers is not None:
            raise ConfigError(
                "--strategy diloco does not work with --technique and --min-workers together yet; drop one of them"
            )
        route = values["outer_exchange"]
        if route != "allreduce":
            refused = [(config.min_workers, "--min-workers"), (config.technique, "--technique")]
            # an asynchronous owner's shard moves whenever a worker's change comes: no step to resume all from
            refused += [(config.resume or None, "--resume")] if route == "sharded-async" else []
            for given, flag in refused:
                if given is not None:
                    raise ConfigError(f"-S outer_exchange={route} does not work with {flag} yet; drop one of them")
            if CODECS[config.wire].all_reduce_only:
                raise ConfigError(f"--wire {config.wire} needs -S outer_exchange=allreduce (its factors add up there)")
        outer_optimizer(values, [torch.zeros(1, requires_grad=True)])  # refuses an outer optimizer it cannot make

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        config = prepared.config
        values = self.option_values(config.strategy_options)
        if values["outer_exchange"] != "allreduce":
            asynchronous = values["outer_exchange"] == "sharded-async"
            if asynchronous and rank == 0 and values["outer_optimizer"] == "sgd" and values["outer_momentum"] > 0:
                print(f"warning: {ASYNC_MOMENTUM}", file=sys.stderr, flush=True)  # the launcher shows rank 0's
            # one worker's change at a time: N of them move the anchor as one synchronous step of their mean
            each = {**values, "outer_lr": values["outer_lr"] / layout.workers} if asynchronous else values
            make = lambda master: outer_optimizer(each, master)  # noqa: E731
            return run_sharded(prepared, layout, rank, store, values["sync_every"], make, asynchronous=asynchronous)
        if config.min_workers is not None and (layout.workers > 1 or config.join):
            return run_elastic(
                prepared,
                layout,
                rank,
                store,
                lambda workers, membership, handed: DiLoCoExchange(
                    workers, wire_codec(config), values, membership=membership, handed=handed
                ),
            )
        exchange = DiLoCoExchange(layout.workers, wire_codec(config), values)
        role = worker_role(prepared, layout, rank, store, exchange)
        trainer = train_worker(prepared, role, store)
        if rank != 0:
            return None
        stats = collect_stats(store, layout.worker_ranks(), set(), config.timeout)
        fields = layout_fields(layout, config) | {"outer_steps": exchange.outer_steps}
        return write_summary(prepared, trainer.final_quality(), stats, layout_fields=fields)


def outer_step_seconds(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """What an inner step adds to its gradient: the inner optimizer's step, and one H-th of an outer step: the
    change's exchange as the synchronous strategy sends a gradient of the same size (the all-reduce through the wire
    codec, or through the sharded server its push and pull, in turn or not), and the outer optimizer's step,
    taken to cost what the inner one does (on every worker, or on each owner's share). H is ``sync_every``.

    >>> from scaletrain.estimate.profile import Profile
    >>> from scaletrain.estimate.refined import Terms
    >>> toy = Profile("toy", 8, t_grad=0.1, t_comm=0.04, t_update=0.002, latency=0.0, weight_bytes=10**6, bandwidth=1e8)
    >>> [outer_step_seconds(Terms(toy, None, options={"sync_every": h}), np.array([2])).item() for h in (1, 10)]
    [0.014, 0.0032]
    """
    values = DiLoCo().option_values(inputs.options)
    exchange = ring_allreduce_seconds if values["outer_exchange"] == "allreduce" else sharded_exchange
    return inputs.profile.t_update + exchange(inputs, n) * outer_share(inputs, n)


def outer_meetings(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """The share of inner steps at which the workers wait for each other: their outer steps (:func:`outer_share`),
    or none where each owner takes each worker's change as it comes (``outer_exchange=sharded-async``)."""
    if DiLoCo().option_values(inputs.options)["outer_exchange"] == "sharded-async":
        return np.zeros(n.shape)
    return outer_share(inputs, n)


def outer_share(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """The outer steps a run takes per inner step its throughput counts: 1/H, or in a run of S steps ⌈S/H⌉, the last
    (concluding) one after fewer than H inner steps, over the S − w steps after the w warm-up steps the throughput
    leaves out (``--warmup-steps``, 5), which hold ⌊w/H⌋ of them (gpt, 120 steps at H = 64: 2 in 115, not 1.9 in 120).

    >>> from scaletrain.estimate.profile import Profile
    >>> from scaletrain.estimate.refined import Terms
    >>> toy = Profile("toy", 8, t_grad=0.1, t_comm=0.04)
    >>> runs = [Terms(toy, None, options={"sync_every": 64}, batches=d) for d in (None, 120)]
    >>> [round(outer_share(terms, np.array([2])).item(), 5) for terms in runs]  # 1/64; 2/115
    [0.01562, 0.01739]
    """
    every = DiLoCo().option_values(inputs.options)["sync_every"]
    steps = inputs.run_steps(n)
    if steps is None:
        return np.full(n.shape, 1 / every)
    steps = np.maximum(steps, 1.0)
    warmup = np.minimum(WARMUP_STEPS, steps - 1)
    return (np.ceil(steps / every) - np.floor(warmup / every)) / (steps - warmup)


def outer_optimizer(values: Mapping[str, Any], parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The outer optimizer over ``parameters`` (the anchor) as the options say."""
    name = values["outer_optimizer"]
    options = {"nesterov": values["outer_nesterov"] and values["outer_momentum"] > 0} if name == "sgd" else {}
    momentum = values["outer_momentum"] if name == "sgd" else None
    return build_optimizer(name, options, parameters, lr=values["outer_lr"], momentum=momentum, weight_decay=0.0)


class DiLoCoExchange(AllReduceExchange):
    """Inner steps here; every ``sync_every`` steps the averaged change since the anchor through the codec's
    all-reduce, and the outer optimizer's step on the anchor, which every worker then takes as its weights."""

    def __init__(
        self,
        workers: int,
        codec: WireCodec,
        values: Mapping[str, Any],
        *,
        membership: Membership | None = None,
        handed: dict[str, Any] | None = None,
    ) -> None:
        # elastic (--min-workers): a lost peer interrupts an outer step (PeerLost); a joiner is ``handed`` the
        # run's outer state and has its weights from a member already
        super().__init__(workers, codec, membership=membership, synced=handed is not None)
        self._handed = handed
        self.values, self.every = values, values["sync_every"]
        self.inner_steps = self.outer_steps = 0
        self._last_outer = 0  # the inner steps taken when the last outer step was
        self._anchor: list[nn.Parameter] = []
        self._outer: torch.optim.Optimizer | None = None
        self._model: nn.Module | None = None
        self._inner: torch.optim.Optimizer | None = None

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().start(model, optimizer)  # every worker from rank 0's weights
        self._model, self._inner = model, optimizer
        self._anchor = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
        self._outer = outer_optimizer(self.values, self._anchor)
        if self._handed is not None:
            self.take_outer_state(self._handed)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        outer_due = (self.inner_steps + 1) % self.every == 0
        rollback = Rollback(model, optimizer) if outer_due and self.membership is not None else None
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        self.inner_steps += 1
        if not outer_due:
            return ExchangeTimes(skipped=skipped)
        try:
            return self._outer_step(model, skipped)
        except PeerLost:  # the survivors do this step again: undo its inner step (the loop's contract)
            rollback.restore(model, optimizer)
            self.inner_steps -= 1
            raise

    def settle(self, model: nn.Module) -> ExchangeTimes | None:
        """An outer step over the inner steps since the last one, if any: every worker then holds the shared
        weights (with ``--technique``, at every epoch's end)."""
        if self.inner_steps == self._last_outer:
            return None
        return self._outer_step(model, False)

    def prepare_reconfiguration(
        self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, decision: Reconfiguration
    ) -> None:
        """The anchor and the outer optimizer's state for the network the decision makes; the loop settled the
        workers first, so the anchor is the weights every worker reshapes."""
        if decision.changes_network:
            make = lambda parameters: outer_optimizer(self.values, parameters)  # noqa: E731
            self._anchor, self._outer = reshaped_copy(model, self._anchor, self._outer, decision, make)

    def reconfigure(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().reconfigure(model, optimizer)
        self._model, self._inner = model, optimizer

    def conclude(self, model: nn.Module, refresh: Callable[[int], int]) -> ExchangeTimes | None:
        """The inner steps since the last outer step go into one more outer step: every worker ends with the
        shared weights, which rank 0 evaluates and saves. Unless each outer step is the synchronous all-reduce's
        (H = 1, a plain average), the shared weights are not those batch norm's running statistics were gathered
        for: each worker re-estimates them on its share of H batches and the workers take their mean."""
        times = self.settle(model)
        if not self.outer_steps or (self.every == 1 and self._averages_only()) or not refresh(self.every):
            return times
        buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
        averaged = self._or_lost(lambda: self._averaged(buffers)) if self.workers > 1 else None
        if averaged is None:
            return times
        with torch.no_grad():
            unflatten_into(averaged, buffers)
        sent = averaged.numel() * averaged.element_size() + (times.sent_bytes if times is not None else 0)
        # the outer step's seconds stay training's; the statistics' mean is the evaluation's
        return dataclasses.replace(times, sent_bytes=sent) if times is not None else ExchangeTimes(sent_bytes=sent)

    def _averages_only(self) -> bool:
        """Whether the outer step takes the workers' mean and nothing more (plain SGD at rate 1)."""
        values = self.values
        return values["outer_optimizer"] == "sgd" and values["outer_lr"] == 1 and values["outer_momentum"] == 0

    def _outer_step(self, model: nn.Module, skipped: bool) -> ExchangeTimes:
        parameters = list(model.parameters())
        begin = now()
        changes = [anchor.detach() - p.detach() for anchor, p in zip(self._anchor, parameters, strict=True)]
        layout = TensorLayout.of(changes)
        buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
        averaged = None
        if self.workers > 1:
            arrived, total = self._reduce_or_lost(changes, layout)
            total /= self.workers  # the live workers, in an elastic run
            # before anything is applied, so that a peer lost here undoes the step as one lost above does
            averaged = self._or_lost(lambda: self._averaged(buffers))
        else:
            self._ask_joiners_alone()
            arrived, total = begin, torch.cat([change.reshape(-1) for change in changes])
        for anchor in self._anchor:
            anchor.grad = torch.empty_like(anchor)
        unflatten_into(total, [anchor.grad for anchor in self._anchor])
        self._outer.step()
        with torch.no_grad():
            for anchor, parameter in zip(self._anchor, parameters, strict=True):
                parameter.copy_(anchor)
            if averaged is not None:
                unflatten_into(averaged, buffers)
        self.outer_steps += 1
        self._last_outer = self.inner_steps
        buffer_bytes = 0 if averaged is None else averaged.numel() * averaged.element_size()
        sent = self.codec.payload_bytes(layout) + buffer_bytes if self.workers > 1 else 0
        return ExchangeTimes(communication=now() - arrived, wait=arrived - begin, skipped=skipped, sent_bytes=sent)

    def _averaged(self, buffers: list[torch.Tensor]) -> torch.Tensor | None:
        """The workers' floating-point buffers (batch norm's running statistics) averaged, flat, for every worker
        to go on from the same ones, as from the same weights; None when the network has none."""
        return mean_over(buffers, self.collectives.all_reduce, self.workers)

    def outer_state(self) -> dict[str, Any]:
        """What a worker that goes on from this one takes besides weights and inner optimizer (an elastic run):
        the anchor, the outer optimizer's state and the step counts."""
        return {
            "anchor": [anchor.detach().clone() for anchor in self._anchor],
            "outer": self._outer.state_dict(),
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "last_outer": self._last_outer,
        }

    def take_outer_state(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for anchor, value in zip(self._anchor, state["anchor"], strict=True):
                anchor.copy_(value)
        self._outer.load_state_dict(state["outer"])
        self._take_counts(state)

    def _take_counts(self, state: dict[str, Any]) -> None:
        self.inner_steps, self.outer_steps = state["inner_steps"], state["outer_steps"]
        # saved before an epoch's end could be an outer step: the last was at the last multiple of H
        self._last_outer = state.get("last_outer", self.inner_steps - self.inner_steps % self.every)

    def state_dict(self) -> dict | None:
        """Beside each checkpoint, per worker: the codec's state, the anchor and the outer optimizer's state, and
        this worker's own weights and inner optimizer state since the last outer step (the checkpoint holds rank
        0's only)."""
        return {
            "codec": super().state_dict(),
            **own_state(self._anchor, self._model, self._inner),
            "outer": self._outer.state_dict(),
            "inner_steps": self.inner_steps,
            "outer_steps": self.outer_steps,
            "last_outer": self._last_outer,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("codec"):
            super().load_state_dict(state["codec"])
        if state.get("anchor") is None:
            return
        take_own_state(state, self._anchor, self._model, self._inner)
        self._outer.load_state_dict(state["outer"])
        self._take_counts(state)
