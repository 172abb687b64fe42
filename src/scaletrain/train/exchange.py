"""How a worker turns its gradients into new weights: the small interface every strategy implements.

:class:`LocalExchange` (one process) clips and steps. The distributed ones live in
:mod:`scaletrain.parallel`: all-reduce, and the central or sharded parameter server.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.tensors.flat import finite

__all__ = ["ExchangeTimes", "GradientExchange", "LocalExchange", "PeerLost", "clip_and_step"]


class PeerLost(Exception):
    """Raised by an exchange of an elastic run (``--min-workers``) when a peer was lost during the step,
    before this worker applied any update of it: the loop regroups the survivors and does the step again.
    The collective's own error is its ``__cause__``; ``why``: what this worker saw (``died``: the peer's
    connections closed; ``stopped answering``: a wait ran out), ``None`` when it only heard of the loss
    from another survivor. ``in_flight``: False when no step was under way (a worker admitted at a step
    boundary never came into the new group)."""

    def __init__(self, why: str | None, *, in_flight: bool = True) -> None:
        super().__init__("a peer was lost during the step" if in_flight else "a peer was lost between steps")
        self.why, self.in_flight = why, in_flight


@dataclass
class ExchangeTimes:
    """Seconds one step spent moving data and waiting for others (pure synchronisation), and copying
    between a GPU and host memory (``host_copy``, not part of ``communication``); ``skipped``: the
    exchanged gradient overflowed and no update was made (only with ``skip_nonfinite``);
    ``sent_bytes``: the bytes of gradient this worker put on the wire (its wire codec's payload: its
    part of a collective, or its pushes to the other owners of a parameter server)."""

    communication: float = 0.0
    wait: float = 0.0
    skipped: bool = False
    host_copy: float = 0.0
    sent_bytes: int = 0


class GradientExchange(ABC):
    """Turns the gradients in ``model`` into updated weights, however the strategy does it.

    ``updates_here``: this process's optimizer takes the step (one process, all-reduce); False where a
    parameter server does and the worker receives the result. ``skip_nonfinite``: a gradient holding
    inf or nan after the exchange is not applied (dynamic loss scaling turns it on)."""

    updates_here = True
    skip_nonfinite = False

    def start(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:  # noqa: B027 - optional hook
        """Bring every worker to the same initial weights."""

    @abstractmethod
    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        """Apply one update from the gradients now in ``model``'s parameters."""

    def conclude(self, model: nn.Module, refresh: Callable[[int], int]) -> ExchangeTimes | None:
        """After the last step, before the worker's measurements are kept: an exchange that owes the run one more
        (diloco's outer step over the inner steps since its last) makes it here, and what it sent is counted
        with the steps'; ``refresh(batches)`` re-estimates batch norm's running statistics on this worker's
        share of that many batches, for weights that moved past them (returns how many batch norms). None:
        nothing owed."""
        return None

    def finish(self, model: nn.Module) -> None:  # noqa: B027 - optional hook
        """After the last step: leave the final weights in ``model`` on the coordinator."""

    def settle(self, model: nn.Module) -> ExchangeTimes | None:
        """At an epoch's end, before a technique decides, and before a decision changes the network: an exchange
        whose workers' weights differ between its meetings (diloco between outer steps) brings every worker to the
        shared weights here, so that the decision is made on them and every worker applies it to the same network.
        What it sent and how long it took count as training, as :meth:`conclude`'s do. None: nothing to do."""
        return None

    def prepare_reconfiguration(  # noqa: B027 - optional hook
        self, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, decision: Reconfiguration
    ) -> None:
        """At an agreed step boundary, before the network changes as ``decision`` says (after ``epoch``): bring the
        current weights and optimizer state into ``model`` and ``optimizer`` wherever they are kept, and reshape
        what the exchange keeps of its own for the new network."""

    def reconfigure(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:  # noqa: B027 - optional hook
        """The network in ``model`` changed shape: re-make whatever was sized for the old one."""

    def resize(self, workers: int) -> None:  # noqa: B027 - optional hook
        """An elastic run regrouped: ``workers`` now take part in each step (only exchanges that raise
        :class:`PeerLost` are resized)."""

    def state_dict(self) -> dict | None:
        """What this worker's exchange carries from step to step (a wire codec's residuals and factors),
        saved beside each checkpoint so that a resumed run goes on exactly; None: nothing."""
        return None

    def load_state_dict(self, state: dict) -> None:  # noqa: B027 - optional hook
        """Carry on from :meth:`state_dict` when the run is resumed."""


def clip_and_step(
    model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None, skip_nonfinite: bool = False
) -> bool:
    """Clip and take the optimizer step; with ``skip_nonfinite``, not when a gradient holds inf or nan.
    Whether the step was skipped."""
    if skip_nonfinite and not finite([p.grad for p in model.parameters() if p.grad is not None]):
        return True
    if clip_norm:
        nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    return False


class LocalExchange(GradientExchange):
    """One process: clip and step."""

    def step(self, model: nn.Module, optimizer: torch.optim.Optimizer, clip_norm: float | None) -> ExchangeTimes:
        return ExchangeTimes(skipped=clip_and_step(model, optimizer, clip_norm, self.skip_nonfinite))
