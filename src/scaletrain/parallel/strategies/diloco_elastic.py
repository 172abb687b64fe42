"""``diloco`` with ``--min-workers`` (and ``--join``): the workers go on without a lost one, and admit workers
started later, at outer steps.

The workers meet only at outer steps, so that is where a lost worker is found (its connections closed, its
heartbeat stood still, or another survivor said so; :mod:`scaletrain.parallel.strategies.elastic`). Its inner
steps since the last outer step are dropped: each survivor undoes the inner step it took just before the outer
step (:class:`Rollback`), the survivors agree on who goes on as the elastic all-reduce does, and each does that
step again with its new part of the global batch, keeping its own inner steps before it, then the outer step
averages the survivors' changes only (divided by their count). The rest of the epoch is cut over the survivors
as in the elastic all-reduce. Should a survivor have completed the outer step before the loss was seen, every
survivor goes on from it (its weights, position, anchor and outer optimizer). Workers ask to join in the outer
step's first all-reduce and are admitted after it, when every member's weights are the anchor: a joiner takes the
anchor, the outer optimizer's state, the deciding member's inner optimizer state and the position; the members
keep their own inner optimizers. A worker lost in the run's last outer step, after its last inner step (a run
whose steps are not a multiple of ``--sync-every``), stops the run as without ``--min-workers``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.strategies.base import Layout, collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.batch_norm import batch_group
from scaletrain.parallel.strategies.elastic import StoreMembership, store_membership
from scaletrain.train.exchange import GradientExchange
from scaletrain.train.membership import elastic_fields, take_live_state
from scaletrain.train.state import Membership, Prepared, Regrouped, Role
from scaletrain.train.summary import write_summary

__all__ = ["OuterState", "OuterStepMembership", "Rollback", "own_state", "run_elastic", "take_own_state"]


class OuterState(Protocol):
    """What the members of an outer-step run hand each other besides weights, inner optimizer and position
    (the diloco exchange: :class:`~scaletrain.parallel.strategies.diloco.DiLoCoExchange`)."""

    outer_steps: int

    def outer_state(self) -> dict[str, Any]:
        """The anchor, the outer optimizer's state and the step counts; called on the member handing them."""

    def take_outer_state(self, state: dict[str, Any]) -> None:
        """Go on from another member's :meth:`outer_state`."""


class Rollback:
    """A worker's weights and inner optimizer state before the inner step that ends with an outer step: a lost
    peer interrupts that outer step before anything of it is applied but the inner step, which is undone so that
    the survivors can do the step again with their new parts of the batch."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.weights = [p.detach().clone() for p in model.parameters()]
        self.optimizer = copy.deepcopy(optimizer.state_dict())

    def restore(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        with torch.no_grad():
            for parameter, value in zip(model.parameters(), self.weights, strict=True):
                parameter.copy_(value)
        optimizer.load_state_dict(self.optimizer)


def own_state(anchor: list[torch.Tensor], model: nn.Module, inner: torch.optim.Optimizer) -> dict[str, Any]:
    """What a worker holds between outer steps and a checkpoint (rank 0's weights) does not: the anchor, and its
    own weights and inner optimizer state since the last outer step."""
    weights = [p.detach().clone() for p in model.parameters()]
    return {"anchor": [a.detach().clone() for a in anchor], "weights": weights, "inner": inner.state_dict()}


def take_own_state(
    state: dict[str, Any], anchor: list[torch.Tensor], model: nn.Module, inner: torch.optim.Optimizer
) -> None:
    """Go on from :func:`own_state`."""
    with torch.no_grad():
        for tensor, value in zip(anchor, state["anchor"], strict=True):
            tensor.copy_(value)
        for parameter, value in zip(model.parameters(), state["weights"], strict=True):
            parameter.copy_(value)
    inner.load_state_dict(state["inner"])


class OuterStepMembership(StoreMembership):
    """The elastic all-reduce's membership, handing the outer state with the live state (``outer``: this
    worker's exchange, set once it is made); survivors that stopped at the same outer step keep their own
    weights and inner optimizers (their inner steps since the last outer step), and so do members that admit
    a worker."""

    outer: OuterState | None = None

    def regroup(
        self, step: int, why: str | None, live_state: Callable[[], dict[str, Any]], *, in_flight: bool = True
    ) -> tuple[Regrouped, dict[str, Any] | None]:
        regrouped, state = super().regroup(step, why, self._with_outer(live_state), in_flight=in_flight)
        if state is None or state["position"]["step"] == step:
            return regrouped, None  # nobody completed the outer step: each keeps its inner steps, the lost one's drop
        self.outer.take_outer_state(state["outer"])  # one survivor completed it: all go on from there
        return regrouped, state

    def admit(self, live_state: Callable[[], dict[str, Any]]) -> tuple[Regrouped, dict[str, Any] | None]:
        regrouped, _ = super().admit(self._with_outer(live_state))
        return regrouped, None  # right after an outer step: every member's weights are the anchor already

    def _with_outer(self, live_state: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
        return lambda: {**live_state(), "outer": self.outer.outer_state()}


def run_elastic(
    prepared: Prepared,
    layout: Layout,
    rank: int,
    store: dist.Store,
    make_exchange: Callable[[int, Membership, dict[str, Any] | None], GradientExchange],
) -> dict[str, Any] | None:
    """One worker of an elastic outer-step run (``--min-workers``, or ``--join`` for a worker started mid-run);
    rank 0 returns the summary, a joiner its record. ``make_exchange(workers, membership, handed)``: the
    worker's exchange, which also is its membership's :class:`OuterState` (``handed``: a joiner's outer state,
    to take as it starts)."""
    config = prepared.config
    membership = store_membership(store, rank, layout, config, prepared.batch_size, kind=OuterStepMembership)
    plan, workers, agreement = layout.worker_plan(rank), layout.workers, membership.agreement()
    joined, handed = None, None
    if config.join:  # admitted by the run, with its live state: nothing is read from a checkpoint
        regrouped, state = membership.join()
        take_live_state(prepared.model, prepared.optimizer, prepared.position, state)
        plan, workers, agreement, joined = regrouped.plan, regrouped.workers, regrouped.agreement, regrouped.record
        handed = state["outer"]
        print(f"joined the run after step {joined['step']}; {workers} workers now", flush=True)
    exchange = make_exchange(workers, membership, handed)
    membership.outer = exchange
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
    membership.refuse_waiting("the run has finished training")
    stats = collect_stats(store, membership.members, set(), config.timeout)
    fields = layout_fields(layout, config) | elastic_fields(membership, trainer, layout.workers)
    fields |= {"outer_steps": membership.outer.outer_steps}
    return write_summary(prepared, trainer.final_quality(), stats, layout_fields=fields)
