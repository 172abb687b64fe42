"""Epochs in steps: how many steps each epoch has, which changes when a reconfiguration changes the batch.

One :class:`Schedule` per process answers, for every update number, which epoch and batch it
belongs to, whether an epoch ends there, and the learning-rate factor in force — for the training
loop and the parameter servers alike, so both follow a batch-size change the same way.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["Position", "Schedule", "Segment"]


@dataclass
class Position:
    """Where a run stands: next comes batch ``batch`` of epoch ``epoch``; ``step`` updates so far."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


@dataclass(frozen=True)
class Segment:
    """From epoch ``epoch`` (whose first update is number ``step``) on: ``steps_per_epoch`` steps of
    ``batch_size``, the learning rate times ``lr_scale`` — reached over the first ``warmup_steps``
    updates, linearly from the factor before (gradual warm-up, Goyal et al. 2017)."""

    epoch: int
    step: int
    steps_per_epoch: int
    batch_size: int
    lr_scale: float = 1.0
    warmup_steps: int = 0


@dataclass
class Schedule:
    """The run's epochs as segments of equal steps per epoch.

    >>> schedule = Schedule.starting(steps_per_epoch=10, batch_size=32, epochs=3)
    >>> schedule.change(epoch=1, steps_per_epoch=5, batch_size=64, lr_scale=2.0)
    >>> schedule.total_steps, schedule.position(12), schedule.epoch_ends_at(15), schedule.lr_scale_at(14)
    (20, Position(epoch=1, batch=2, step=12), True, 2.0)
    """

    epochs: int
    step_limit: int | None = None
    segments: list[Segment] = field(default_factory=list)

    @classmethod
    def starting(cls, *, steps_per_epoch: int, batch_size: int, epochs: int, step_limit: int | None = None) -> Schedule:
        return cls(epochs, step_limit, [Segment(0, 0, steps_per_epoch, batch_size)])

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    @property
    def total_steps(self) -> int:
        last = self.current
        total = last.step + (self.epochs - last.epoch) * last.steps_per_epoch
        return total if self.step_limit is None else min(total, self.step_limit)

    def first_step(self, epoch: int) -> int:
        """The number of the first update of ``epoch``."""
        segment = self._segment(lambda s: s.epoch <= epoch)
        return segment.step + (epoch - segment.epoch) * segment.steps_per_epoch

    def steps_in(self, epoch: int) -> int:
        """Steps of ``epoch`` (as known now)."""
        return self._segment(lambda s: s.epoch <= epoch).steps_per_epoch

    def position(self, step: int) -> Position:
        """Where update number ``step`` (counted from 0; or the count of updates done) stands."""
        segment = self._segment(lambda s: s.step <= step)
        epochs, batch = divmod(step - segment.step, segment.steps_per_epoch)
        return Position(epoch=segment.epoch + epochs, batch=batch, step=step)

    def epoch_ends_at(self, step: int) -> bool:
        """Whether the ``step``-th update is the last of an epoch."""
        return step > 0 and self.position(step).batch == 0

    def lr_scale_at(self, step: int) -> float:
        """The factor on the learning rate of update ``step``.

        >>> schedule = Schedule.starting(steps_per_epoch=10, batch_size=32, epochs=3)
        >>> schedule.change(epoch=1, steps_per_epoch=5, batch_size=64, lr_scale=2.0, warmup_steps=4)
        >>> [schedule.lr_scale_at(step) for step in (9, 10, 11, 13, 14)]
        [1.0, 1.25, 1.5, 2.0, 2.0]
        """
        index = max(i for i, segment in enumerate(self.segments) if segment.step <= step)
        segment, done = self.segments[index], step - self.segments[index].step
        if done >= segment.warmup_steps or index == 0:
            return segment.lr_scale
        before = self.segments[index - 1].lr_scale
        return before + (segment.lr_scale - before) * (done + 1) / segment.warmup_steps

    def warming_up(self, step: int) -> bool:
        """Whether update ``step`` is inside a segment's warm-up (its rate differs from the one before)."""
        segment = self._segment(lambda s: s.step <= step)
        return step - segment.step < segment.warmup_steps and segment is not self.segments[0]

    def epochs_done(self, steps: int) -> float:
        position = self.position(steps)
        return position.epoch + position.batch / self.steps_in(position.epoch)

    def change(
        self, *, epoch: int, steps_per_epoch: int, batch_size: int, lr_scale: float, warmup_steps: int = 0
    ) -> None:
        """From ``epoch`` on (not started yet): a new batch size and its steps; ``lr_scale`` multiplies the
        factor in force, reached over ``warmup_steps`` updates."""
        step = self.first_step(epoch)
        scale = self.current.lr_scale * lr_scale
        if not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"learning-rate factor {scale} is not a positive number")
        kept = [s for s in self.segments if s.epoch < epoch]
        self.segments = [*kept, Segment(epoch, step, steps_per_epoch, batch_size, scale, warmup_steps)]

    def to_list(self) -> list[dict[str, Any]]:
        return [asdict(segment) for segment in self.segments]

    def restore(self, segments: list[dict[str, Any]] | None) -> None:
        """The segments a checkpoint saved (none: the run never changed its batch)."""
        if segments:
            self.segments = [Segment(**segment) for segment in segments]

    def _segment(self, applies) -> Segment:
        return [segment for segment in self.segments if applies(segment)][-1]
