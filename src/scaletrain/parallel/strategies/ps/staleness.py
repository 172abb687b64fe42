"""Compensating asynchronous SGD for stale gradients: lower the explicit momentum, or the rate.

An asynchronous parameter server applies gradients computed on weights ``τ`` updates old (the staleness: the
server's version when the gradient arrives less the version the worker pulled). In expectation asynchrony adds a
momentum of its own, ``μ_a = τ̄ / (τ̄ + 1)`` at the mean staleness ``τ̄`` (Mitliagkas, Zhang, Hadjis and Ré 2016,
"Asynchrony begets momentum"), so on top of the user's momentum ``μ`` a run carries more than it asked for, and a
rate tuned on one process trains poorly or diverges. The modes of ``--async-compensation``:

- ``momentum`` (the default): the explicit momentum becomes ``μ' = μ − τ̄ / (τ̄ + 1)``, clamped to ``[0, μ]``, so
  that explicit and implicit momentum add up to ``μ``; ``τ̄`` is the server's running mean of the staleness it
  measures (:class:`StalenessEstimate`). Once ``μ'`` is 0 (plain SGD: always) the rate is left as given.
- ``lr``: the rate of each gradient divided by its staleness, at least 1 (Zhang, Gupta, Lian and Liu 2016,
  "Staleness-aware async-SGD"); the momentum stays ``μ``.
- ``delay``: DC-ASGD-a (Zheng et al. 2017): the stale gradient becomes ``g + λ g ⊙ g ⊙ (w_now − w_stale)``,
  ``λ = λ0 / sqrt(running mean of g ⊙ g)``, ``λ0 = 2`` (not tuned); ``w_stale`` is the snapshot the server last
  sent that worker. Rate and momentum stay.
- ``none``: every gradient with the user's rate and momentum (Downpour SGD, Dean et al. 2012).

Compensation helps asynchronous runs with momentum, more than one worker and a rate tuned locally.
docs/distributed.md derives the rule, says why no rate rule is the default past zero, and has the measurements.

>>> compensated_momentum(0.9, 0.0), round(compensated_momentum(0.9, 1.0), 6), compensated_momentum(0.9, 20.0)
(0.9, 0.4, 0.0)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = [
    "COMPENSATIONS",
    "Compensation",
    "StalenessEstimate",
    "compensated_momentum",
    "delay_compensate",
    "implicit_momentum",
    "staleness_rate_scale",
]

#: DC-ASGD's adaptive factor (Zheng et al. 2017, "DC-ASGD-a"): ``λ = λ0 / sqrt(mean square of g)``.
DELAY_LAMBDA0, DELAY_DECAY = 2.0, 0.95

#: The values of ``--async-compensation``.
COMPENSATIONS = ("momentum", "lr", "delay", "none")


def implicit_momentum(staleness: float) -> float:
    """The momentum asynchrony adds at mean staleness ``τ̄`` (Mitliagkas et al. 2016): ``τ̄ / (τ̄ + 1)``."""
    if staleness < 0:
        raise ValueError(f"staleness must be ≥ 0, got {staleness!r}")
    return staleness / (staleness + 1.0)


def compensated_momentum(requested: float, staleness: float) -> float:
    """The explicit momentum that adds up with asynchrony's at mean staleness ``staleness`` to ``requested``.

    ``requested − staleness / (staleness + 1)``, clamped to ``[0, requested]``; docs/distributed.md derives it.
    """
    if not 0.0 <= requested < 1.0:
        raise ValueError(f"momentum must be in [0, 1), got {requested!r}")
    return min(requested, max(0.0, requested - implicit_momentum(staleness)))


def staleness_rate_scale(staleness: int) -> float:
    """Zhang et al. (2016): the factor on the rate of a gradient ``staleness`` updates old, ``1 / max(1, τ)``."""
    return 1.0 / max(1, staleness)


def delay_compensate(
    gradient: torch.Tensor, now: torch.Tensor, stale: torch.Tensor, square: torch.Tensor, lambda0: float = DELAY_LAMBDA0
) -> None:
    """DC-ASGD in place: ``g += λ g ⊙ g ⊙ (w_now − w_stale)``, ``λ = λ0 / sqrt(square)`` elementwise, where
    ``square`` (updated here) is the running mean of ``g ⊙ g`` (Zheng et al. 2017, the adaptive variant).

    >>> g = torch.tensor([1.0, -2.0]); square = torch.zeros(2)
    >>> delay_compensate(g, torch.tensor([0.5, 0.0]), torch.zeros(2), square); [round(v, 3) for v in g.tolist()]
    [5.472, -2.0]
    """
    square.mul_(DELAY_DECAY).addcmul_(gradient, gradient, value=1.0 - DELAY_DECAY)
    correction = gradient * gradient * (now - stale)
    gradient.add_(correction.mul_(lambda0).div_(square.sqrt().clamp_min_(1e-12)))


class StalenessEstimate:
    """A running mean of the measured staleness.

    Starts from ``prior`` counted as one observation (``M − 1`` for ``M`` workers, the queueing
    model's mean), averages every observation for the first ``horizon`` updates, then becomes an
    exponential average over about ``horizon`` updates, so it follows a run whose timing changes
    (a worker lost, a slower link).

    >>> estimate = StalenessEstimate(prior=1.0, horizon=4)
    >>> [estimate.observe(s) for s in (0, 2, 1)]
    [0.5, 1.0, 1.0]
    """

    def __init__(self, prior: float = 0.0, horizon: int = 100) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be ≥ 1, got {horizon!r}")
        self.mean, self.count, self.horizon = float(prior), 1, horizon

    def observe(self, staleness: int) -> float:
        self.count += 1
        self.mean += (staleness - self.mean) / min(self.count, self.horizon)
        return self.mean


@dataclass
class Compensation:
    """The server's side: for each applied gradient, the factor on the rate and the momentum to use.

    ``mode`` is one of :data:`COMPENSATIONS`; ``momentum`` the user's requested momentum (not the
    optimizer's current value, which a resumed checkpoint may hold lowered); ``share`` a factor on every
    update's rate, its batch's share of ``--batch-size`` (``--async-batches split``,
    :mod:`scaletrain.parallel.strategies.ps.async_batches`; 1 otherwise).

    >>> compensation = Compensation("momentum", momentum=0.9, workers=2)
    >>> [tuple(round(v, 3) for v in compensation.step(s)) for s in (0, 1, 1)]
    [(1.0, 0.567), (1.0, 0.5), (1.0, 0.471)]
    """

    mode: str
    momentum: float
    workers: int = 1
    horizon: int = 100
    share: float = 1.0
    estimate: StalenessEstimate = field(init=False)
    applied: float = field(init=False)
    applied_scale: float = field(init=False, default=1.0)
    _sum: float = field(init=False, default=0.0)
    _scale_sum: float = field(init=False, default=0.0)
    _updates: int = field(init=False, default=0)
    _square: torch.Tensor | None = field(init=False, default=None)

    @property
    def corrects_delay(self) -> bool:
        """Whether the server must pass each gradient through :meth:`correct` with the sender's weights."""
        return self.mode == "delay"

    def correct(self, gradient: torch.Tensor, now: torch.Tensor, stale: torch.Tensor) -> None:
        """DC-ASGD's correction of a flat gradient computed on ``stale`` weights, the server's being ``now``."""
        if self._square is None or self._square.shape != gradient.shape:
            self._square = gradient * gradient
        delay_compensate(gradient, now, stale, self._square)

    def __post_init__(self) -> None:
        if self.mode not in COMPENSATIONS:
            raise ValueError(f"async compensation must be one of {', '.join(COMPENSATIONS)}, got {self.mode!r}")
        self.estimate = StalenessEstimate(prior=max(0, self.workers - 1), horizon=self.horizon)
        self.applied = self.momentum

    def step(self, staleness: int) -> tuple[float, float]:
        """``(rate factor, momentum)`` for a gradient ``staleness`` updates old."""
        mean = self.estimate.observe(staleness)
        scale, momentum = 1.0, self.momentum
        if self.mode == "momentum":
            momentum = compensated_momentum(self.momentum, mean)
        elif self.mode == "lr":
            scale = staleness_rate_scale(staleness)
        scale *= self.share
        self.applied, self.applied_scale = momentum, scale
        self._sum += momentum
        self._scale_sum += scale
        self._updates += 1
        return scale, momentum

    def summary(self) -> dict[str, object]:
        """For ``summary.json``: the mode, the requested and the explicit momentum (last and mean), the rate
        factor (last and mean, the batch's share included) and the batch's share alone."""
        return {
            "mode": self.mode,
            "requested_momentum": self.momentum,
            "explicit_momentum": self.applied,
            "mean_explicit_momentum": self._sum / self._updates if self._updates else self.momentum,
            "rate_factor": self.applied_scale,
            "mean_rate_factor": self._scale_sum / self._updates if self._updates else self.share,
            "batch_share": self.share,
            "staleness_estimate": self.estimate.mean,
        }
