"""DiLoCo's exchange on each worker: inner steps, and every ``sync_every`` steps the outer step: the averaged change
since the anchor through the run's wire codec, the outer optimizer's step on the anchor, the workers' buffers
averaged. With ``overlap_steps`` K > 0 the change travels while the worker takes its next K inner steps
(:mod:`.diloco_overlap`). The strategy, its options and its estimator terms: :mod:`.diloco`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.efficient.surgery import reshaped_copy
from scaletrain.parallel.strategies.allreduce import AllReduceExchange
from scaletrain.parallel.strategies.diloco_elastic import Rollback, own_state, take_own_state
from scaletrain.parallel.strategies.diloco_overlap import OuterInFlight, Reduced
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.tensors.flat import flatten, mean_over, unflatten_into
from scaletrain.tensors.optimizers import build_optimizer
from scaletrain.train.exchange import ExchangeTimes, PeerLost, clip_and_step
from scaletrain.train.meter import now
from scaletrain.train.state import Membership

__all__ = ["DiLoCoExchange", "outer_optimizer"]


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
        timeout: float = 60.0,
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
        # -S overlap_steps: the outer exchange in flight, when it left, and the weights and buffers it left from
        self.overlap_steps, self._timeout = values.get("overlap_steps", 0), timeout
        self._in_flight: OuterInFlight | None = None
        self._launched_at = 0
        self._sent: tuple[list[torch.Tensor], torch.Tensor | None] | None = None  # None: no exchange outstanding
        self._arrived: Reduced | None = None  # what came back before its step (a checkpoint waited for it)
        self._owed = 0.0  # seconds a checkpoint waited for the exchange in flight, counted with the next step

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        super().start(model, optimizer)  # every worker from rank 0's weights
        self._model, self._inner = model, optimizer
        self._anchor = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
        self._outer = outer_optimizer(self.values, self._anchor)
        if self._handed is not None:
            self.take_outer_state(self._handed)
        if self.overlap_steps and self.workers > 1:
            self._in_flight = OuterInFlight(self.codec, self._timeout)

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        outer_due = (self.inner_steps + 1) % self.every == 0
        rollback = Rollback(model, optimizer) if outer_due and self.membership is not None else None
        skipped = clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite)
        self.inner_steps += 1
        if self._in_flight is not None:
            return self._overlapped_step(model, skipped, outer_due)
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
        weights (with ``--technique``, at every epoch's end; an exchange in flight lands first)."""
        landed = self._land(model, False) if self._sent is not None else None
        if self.inner_steps == self._last_outer:
            return landed
        times = self._outer_step(model, False)
        if landed is None:
            return times
        return dataclasses.replace(times, communication=times.communication + landed.communication)

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
        self._step_anchor(total)
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

    def _overlapped_step(self, model: nn.Module, skipped: bool, outer_due: bool) -> ExchangeTimes:
        """An inner step taken: the exchange in flight lands after its K steps, and an outer step due sends the
        change since the anchor off (K < H: one lands before the next leaves)."""
        times = ExchangeTimes(skipped=skipped, communication=self._owed)
        self._owed = 0.0
        if self._sent is not None and self.inner_steps - self._launched_at >= self.overlap_steps:
            landed = self._land(model, skipped)
            times = dataclasses.replace(landed, communication=landed.communication + times.communication)
        if outer_due:
            times = dataclasses.replace(times, sent_bytes=times.sent_bytes + self._launch(model))
        return times

    def _launch(self, model: nn.Module) -> int:
        """The change since the anchor and the floating-point buffers to the exchange's thread; the bytes sent."""
        parameters = list(model.parameters())
        changes = [anchor.detach() - p.detach() for anchor, p in zip(self._anchor, parameters, strict=True)]
        layout = TensorLayout.of(changes)
        buffers = [buffer.detach() for buffer in model.buffers() if buffer.is_floating_point()]
        summed = flatten(buffers) if buffers else None
        self._sent = ([p.detach().clone() for p in parameters], None if summed is None else summed.clone())
        self._in_flight.start(self.codec.pack(changes), layout, summed)
        self._launched_at = self._last_outer = self.inner_steps  # what was trained up to here is on its way
        return self.codec.payload_bytes(layout) + (0 if summed is None else summed.numel() * summed.element_size())

    def _land(self, model: nn.Module, skipped: bool) -> ExchangeTimes:
        """Wait for the exchange in flight, step the anchor with the mean change, and move the weights and
        buffers to the new anchor plus what this worker trained since the change left."""
        begin = now()
        reduced = self._arrived if self._arrived is not None else self._in_flight.finish()
        self._arrived = None
        waited = now() - begin
        weights, buffers_then = self._sent
        self._sent = None
        self._step_anchor(reduced.total / self.workers)
        with torch.no_grad():
            for anchor, parameter, then in zip(self._anchor, model.parameters(), weights, strict=True):
                # the new anchor + what was trained since (exactly the anchor where nothing was: equal replicas)
                parameter.copy_(anchor + (parameter - then))
            if reduced.buffers is not None:
                buffers = [buffer for buffer in model.buffers() if buffer.is_floating_point()]
                moved = flatten([buffer.detach() for buffer in buffers]) - buffers_then
                unflatten_into(reduced.buffers / self.workers + moved, buffers)
        self.outer_steps += 1
        return ExchangeTimes(communication=waited, skipped=skipped)

    def _step_anchor(self, change: torch.Tensor) -> None:
        """The outer optimizer's step on the anchor with the workers' mean ``change`` (flat) as its gradient."""
        for anchor in self._anchor:
            anchor.grad = torch.empty_like(anchor)
        unflatten_into(change, [anchor.grad for anchor in self._anchor])
        self._outer.step()

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
        0's only). An exchange in flight is waited for (its wait counted with the next step) and saved with the
        weights it left from, to land at its own step in this run and in one resumed from here."""
        if self._in_flight is not None and self._in_flight.running:
            begin = now()
            self._arrived = self._in_flight.finish()
            self._owed += now() - begin
        in_flight = None
        if self._sent is not None:
            weights, buffers = self._sent
            in_flight = {"launched_at": self._launched_at, "weights": weights, "buffers": buffers}
            in_flight |= {"total": self._arrived.total, "summed_buffers": self._arrived.buffers}
        return {
            "in_flight": in_flight,
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
        flight = state.get("in_flight")
        if flight is not None:  # it came back before the checkpoint: it lands at its step (at once without overlap)
            self._sent, self._launched_at = (flight["weights"], flight["buffers"]), flight["launched_at"]
            self._arrived = Reduced(flight["total"], flight["summed_buffers"])
            if self._in_flight is None:
                self._land(self._model, False)
