"""The divergence bound: a training loss that stays finite but grows far past its first values stops the run.

The loop catches a nan or infinite loss by itself; this catches the run that explodes without overflowing
(``--lr 1e30`` reached a loss of 10³² and "succeeded"). Per process, with ``--divergence FACTOR`` (default
:data:`~scaletrain.config.DIVERGENCE_FACTOR`; ``--divergence off`` turns it off): the *reference* is the median of
the first :data:`REFERENCE_STEPS` training losses, each counted only if within the bound of those before it (the
lower median while fewer are known, the first step's loss before any update starting it); the *bound* is
``factor × max(reference, FLOOR)``, :data:`FLOOR` keeping a loss that starts tiny from tripping on noise; the run
*stops* when :data:`PATIENCE` steps in a row are over the bound, so one wild batch cannot stop it. The first
process to stop ends the run. The reference is kept in checkpoints (:attr:`LossBound.first_losses` is the run's
``Prepared.first_losses``), so a resumed run is held to the bound it started with. docs/training.md states the rule
for users.

>>> bound = LossBound(1e4)
>>> [bound.exceeded(loss) for loss in (2.3, 2.2, 2.4, 2.1, 2.2, 2.0)]
[False, False, False, False, False, False]
>>> bound.reference, bound.limit
(2.2, 22000.0)
>>> [bound.exceeded(loss) for loss in (5e4, 1.9, 5e4, 5e4)]  # one wild step, then a lasting one
[False, False, False, True]
"""

from __future__ import annotations

import math
import statistics

import torch

from scaletrain.config import TrainConfig
from scaletrain.errors import ScaletrainError
from scaletrain.train.schedule import Position

__all__ = ["FLOOR", "PATIENCE", "REFERENCE_STEPS", "Diverged", "LossBound", "check_loss", "loss_bound"]

#: How many first losses make the reference.
REFERENCE_STEPS = 5
#: The smallest reference: below it the bound is ``factor × FLOOR`` (a loss near zero would make any noise a
#: factor of thousands).
FLOOR = 1.0
#: How many steps in a row must be over the bound to stop the run.
PATIENCE = 2


class LossBound:
    """The rule above for one process's losses; ``factor`` ``None`` turns it off.

    ``first_losses`` is the reference window, filled as the run trains (a resumed run passes the one its
    checkpoint kept); the list is updated in place, so whoever holds it sees it grow.
    """

    def __init__(self, factor: float | None, first_losses: list[float] | None = None) -> None:
        self.factor = factor
        self.first_losses = first_losses if first_losses is not None else []
        self.over = 0  # steps in a row over the bound
        self._fixed_limit: float | None = None  # once the reference is complete: no median per step

    @property
    def reference(self) -> float | None:
        """The median of the first losses so far (the lower median of an even count), ``None`` before any."""
        return statistics.median_low(self.first_losses) if self.first_losses else None

    @property
    def limit(self) -> float | None:
        """The largest loss a step may have, ``None`` while there is no reference or with the bound off."""
        reference = self.reference
        if self.factor is None or reference is None:
            return None
        return self.factor * max(reference, FLOOR)

    def describe(self) -> str:
        """The bound in words, for the message that stops a run.

        >>> bound = LossBound(1e4, [2.302585])
        >>> bound.describe()
        "over 2.303e+04 (--divergence 10000 × its first steps' loss 2.303)"
        >>> LossBound(100.0, [0.002]).describe()
        "over 100 (--divergence 100 × 1: its first steps' loss 0.002 is under 1)"
        """
        reference = self.reference
        if reference is None or self.factor is None:
            return "with no bound"
        if reference >= FLOOR:
            return f"over {self.limit:.4g} (--divergence {self.factor:g} × its first steps' loss {reference:.4g})"
        return (
            f"over {self.limit:.4g} (--divergence {self.factor:g} × {FLOOR:g}: its first steps' loss "
            f"{reference:.4g} is under {FLOOR:g})"
        )

    def exceeded(self, loss: float) -> bool:
        """Take one step's (finite) loss; whether the run must stop."""
        if self.factor is None:
            return False
        limit = self._fixed_limit
        if limit is None:
            limit = self.limit
            if len(self.first_losses) >= REFERENCE_STEPS:
                self._fixed_limit = limit
        if limit is not None and loss > limit:
            self.over += 1
            return self.over >= PATIENCE
        self.over = 0
        if len(self.first_losses) < REFERENCE_STEPS:
            self.first_losses.append(loss)
        return False


def loss_bound(config: TrainConfig, first_losses: list[float]) -> LossBound:
    """The bound ``config.divergence`` asks for, continuing from ``first_losses`` (kept by a checkpoint)."""
    return LossBound(None if config.divergence == "off" else float(config.divergence), first_losses)


class Diverged(ScaletrainError):
    """The training loss became nan or infinite, or grew past the divergence bound: the settings make the run
    diverge."""


def check_loss(loss: torch.Tensor, bound: LossBound, position: Position, lr: float) -> None:
    """Raise :class:`Diverged` for a nan or infinite loss, or one that stayed past ``bound``, naming the step and
    the rate. One read of a scalar per step: free on the CPU; on a GPU it waits for the step's forward pass."""
    value = float(loss)
    became, why = (f"{value}", "") if not math.isfinite(value) else (f"{value:.4g}", f", {bound.describe()},")
    if math.isfinite(value) and not bound.exceeded(value):
        return
    raise Diverged(
        f"training diverged: the loss became {became} at step {position.step + 1} "
        f"(epoch {position.epoch + 1}){why} with learning rate {lr:g}; start again with a lower --lr "
        f"(e.g. {lr / 10:g}) or with --clip-norm"
    )
