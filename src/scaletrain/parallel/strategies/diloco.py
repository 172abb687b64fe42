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
(:func:`~scaletrain.efficient.surgery.reshaped_copy`). ``-S overlap_steps=K``: the change travels while the worker
takes K more inner steps (:mod:`.diloco_overlap`). Refused in one line for now: ``--technique`` with ``--min-workers``
or the sharded server, the sharded server with ``--min-workers``, ``overlap_steps`` with any of them.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
import torch.distributed as dist

from scaletrain.config import WARMUP_STEPS, TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.allreduce import ring_allreduce_seconds
from scaletrain.parallel.strategies.base import (
    Layout,
    Strategy,
    StrategyOption,
    collect_stats,
    layout_fields,
    train_worker,
)
from scaletrain.parallel.strategies.diloco_elastic import run_elastic
from scaletrain.parallel.strategies.diloco_exchange import DiLoCoExchange, outer_optimizer
from scaletrain.parallel.strategies.diloco_sharded import run_sharded
from scaletrain.parallel.strategies.ps.terms import sharded_exchange
from scaletrain.parallel.strategies.roles import worker_role
from scaletrain.parallel.strategies.terms import EstimatorTerms, StepInputs
from scaletrain.tensors.codec import CODECS, wire_codec
from scaletrain.train.state import Prepared
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
    overlap_instead = "drop --overlap; -S overlap_steps=K overlaps its outer exchange with K inner steps"
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
        StrategyOption(
            "overlap_steps",
            "inner steps the outer exchange runs beside, its result applied after them (0: the workers wait for it)",
            0,
            type=int,
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
        overlap = values["overlap_steps"]
        if not 0 <= overlap < values["sync_every"]:
            raise ConfigError(
                f"-S overlap_steps must be from 0 to --sync-every - 1 ({values['sync_every'] - 1}), got {overlap}: "
                "an outer exchange lands before the next one leaves"
            )
        if overlap:
            route = values["outer_exchange"]
            refused = [(config.min_workers is not None, "--min-workers"), (config.technique is not None, "--technique")]
            for given, flag in [*refused, (route != "allreduce", f"-S outer_exchange={route}")]:
                if given:
                    raise ConfigError(f"-S overlap_steps does not work with {flag} yet; drop one of them")
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
        exchange = DiLoCoExchange(layout.workers, wire_codec(config), values, timeout=config.timeout)
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
    exchange = (ring_allreduce_seconds if values["outer_exchange"] == "allreduce" else sharded_exchange)(inputs, n)
    if values["overlap_steps"]:  # what K inner steps (a gradient and an optimizer step each) do not hide
        inner = inputs.gradient(inputs.sync, n, probe="allreduce", meetings=outer_meetings(inputs, n))
        exchange = np.maximum(exchange - values["overlap_steps"] * (inner + inputs.profile.t_update), 0.0)
    return inputs.profile.t_update + exchange * outer_share(inputs, n)


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
