"""The divergence bound: a training loss that stays finite but grows far past its first values stops the run.

A nan or infinite loss is caught by the loop on its own. This catches the run that explodes without
overflowing (``--lr 1e30`` reached a loss of 10³² and "succeeded"). The rule, per process
(``--divergence FACTOR``, default :data:`~scaletrain.config.DIVERGENCE_FACTOR` = 10⁴; ``--divergence off``
turns it off):

* **Reference**: the median of the process's first :data:`REFERENCE_STEPS` training losses — only
  those within the bound of the ones before them, so a loss that explodes from the second step on
  never becomes its own reference; while fewer are known, the lower median of those so far (the first
  step's loss, taken before any update, starts it). One noisy step among them moves a median little.
* **Bound**: ``factor × max(reference, FLOOR)``. :data:`FLOOR` (1.0) keeps a loss that starts tiny
  (a regression at 10⁻⁶) from tripping on ordinary noise. A classifier's cross-entropy starts near
  ln(classes) — 2.3 for ten — so for most the bound is ``factor ×`` their first loss.
* **Stop**: when :data:`PATIENCE` (2) steps in a row are over the bound, so one wild batch cannot stop a
  run. A loss that explodes stays over it (or overflows, which stops the run at once).

Each process applies the rule to its own losses, which it reads every step anyway (a comparison more);
the first to stop ends the run (the launcher stops the others). The reference is kept in checkpoints
(:attr:`LossBound.first_losses` is the run's ``Prepared.first_losses``; a distributed run keeps the
first worker's, which every worker takes on resume), so a resumed run is held to the bound it started
with; a checkpoint without one leaves the resumed run to take it from its own first steps.

>>> bound = LossBound(1e4)
>>> [bound.exceeded(loss) for loss in (2.3, 2.2, 2.4, 2.1, 2.2, 2.0)]
[False, False, False, False, False, False]
>>> bound.reference, bound.limit
(2.2, 22000.0)
>>> [bound.exceeded(loss) for loss in (5e4, 1.9, 5e4, 5e4)]  # one wild step, then a lasting one
[False, False, False, True]
"""

from __future__ import annotations

import statistics

from scaletrain.config import TrainConfig

__all__ = ["FLOOR", "PATIENCE", "REFERENCE_STEPS", "LossBound", "loss_bound"]

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
