"""Prediction intervals: the refined model's speedup with a range made from what the profile measured.

A profile keeps every time it pooled (``samples``: the gradient's, the round trip's, the gradient under contention,
each exchange's). Each sample set gives two factors, its 10th and 90th percentile over its median. The *slow*
profile has every time a run's workers spend at its 90th percentile (t_grad and its split parts, the gradient under
contention and beside each exchange, t_comm and latency, each timed exchange; an exchange without samples of its
own takes the round trip's), the *fast* one at its 10th. The workers' speed falls monotonically from the fast
profile to the slow one; the reference, one worker alone, moves the other way (a slow reference raises the speedup):

    low  = rate(slow) × reference(fast) × (1 − noise)
    high = rate(fast) × reference(slow) × (1 + noise)

rate in batches per second, reference one worker alone (the runs' ``t_step``, else t_grad + t_update), ``noise``
the run-to-run noise: half the range of the launches' median t_grad over the pooled median where the profile records
its launches (``samples["launches"]``), else :data:`DEFAULT_RUN_NOISE`. The point prediction is the model's,
unchanged. Nominal level 90 %; the validation measures the real one (coverage). docs/prediction.md says more. A
profile without samples (two times given) has no spread: :func:`measured_spread` is None and no range is made.

>>> from scaletrain.estimate.models import Configuration
>>> p = Profile("toy", 32, t_grad=0.1, t_comm=0.01, samples={"t_grad": [0.09, 0.1, 0.11], "launches": 3})
>>> [round(x, 3) for x in speedup_range(p, Configuration.parse("allreduce-join"), 2, batches=128)]
[1.403, 1.818, 2.329]
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile, launch_chunks
from scaletrain.estimate.refined import Terms

__all__ = [
    "DEFAULT_RUN_NOISE",
    "LEVEL",
    "Spread",
    "bound_profiles",
    "decile_factors",
    "measured_spread",
    "overlap",
    "speedup_range",
    "train_seconds_range",
]

#: the nominal level of a range: each measured input between its 10th and 90th percentile
LEVEL = 0.9
#: the run-to-run noise where a profile does not say how many launches it pooled: single runs here differ by
#: ±5–10 % (the validations' noise, :data:`scaletrain.measure.ranking.RANK_NOISE`), so 5 % at least
DEFAULT_RUN_NOISE = 0.05

Factors = tuple[float, float]  # (10th percentile, 90th percentile) over the median
#: a profile's dictionaries of exchanges timed among N workers, by the probe kind whose samples they were timed in
TIMED = {"allreduce": "allreduce", "central": "central", "sharded": "sharded", "central-async": "central_async"}


@dataclass(frozen=True)
class Spread:
    """The factors (10th, 90th percentile over the median) of each sample set a profile measured, and the
    run-to-run noise (a fraction) with where it came from."""

    t_grad: Factors = (1.0, 1.0)
    transfer: Factors = (1.0, 1.0)  # the round trip of all weights: t_comm, latency
    contended: dict[int, Factors] = field(default_factory=dict)  # k processes computing → the gradient's factors
    exchange: dict[str, dict[int, Factors]] = field(default_factory=dict)  # probe kind → N → the exchange's
    noise: float = DEFAULT_RUN_NOISE
    noise_source: str = "assumed (launches not recorded)"


def decile_factors(samples: Sequence[float]) -> Factors:
    """The 10th and the 90th percentile of ``samples`` over their median (1, 1 for fewer than two).

    >>> decile_factors([0.08, 0.09, 0.10, 0.11, 0.12])  # positions 0.4 and 3.6 of the sorted five
    (0.84, 1.16)
    """
    values = sorted(float(x) for x in samples)
    middle = statistics.median(values) if values else 0.0
    if len(values) < 2 or middle <= 0:
        return (1.0, 1.0)
    deciles = statistics.quantiles(values, n=10, method="inclusive")
    return (round(deciles[0] / middle, 12), round(deciles[-1] / middle, 12))


def measured_spread(profile: Profile) -> Spread | None:
    """The spread of ``profile``'s samples, None where it measured none (times given, not profiled)."""
    samples = profile.samples
    t_grad = list(samples.get("t_grad") or ())
    contended = {int(k): decile_factors(v) for k, v in (samples.get("t_grad_contended") or {}).items()}
    exchange = {
        kind: {int(n): decile_factors(v) for n, v in timed.items()}
        for kind, timed in (samples.get("exchange") or {}).items()
    }
    round_trip = list(samples.get("round_trip") or ())
    if len(t_grad) < 2 and len(round_trip) < 2 and not contended and not exchange:
        return None
    noise, source = _run_noise(t_grad, samples.get("launches"))
    return Spread(decile_factors(t_grad), decile_factors(round_trip), contended, exchange, noise, source)


def _run_noise(t_grad: list[float], launches: object) -> tuple[float, str]:
    """Half the range of the launches' median t_grad over the pooled median (the samples are pooled launch after
    launch), where the profile says how many launches; else the default."""
    if not isinstance(launches, int) or launches < 2 or len(t_grad) < launches or len(t_grad) % launches:
        return DEFAULT_RUN_NOISE, "assumed (launches not recorded)"
    medians = [statistics.median(chunk) for chunk in launch_chunks(t_grad, launches)]
    return (max(medians) - min(medians)) / 2 / statistics.median(t_grad), f"{launches} launches' median t_grad"


def bound_profiles(profile: Profile, spread: Spread) -> tuple[Profile, Profile]:
    """The fast and the slow profile: every time the workers spend at its 10th, then at its 90th percentile."""
    return (_at(profile, spread, 0), _at(profile, spread, 1))


def _at(profile: Profile, spread: Spread, end: int) -> Profile:
    grad = spread.t_grad[end]
    transfer = spread.transfer[end]
    # a measured count's contention × t_grad is the median under contention: there its own factor replaces t_grad's
    contention = {
        k: factor * (spread.contended[k][end] / grad if k in spread.contended else 1.0)
        for k, factor in profile.contention.items()
    }
    timed = {
        name: {
            n: seconds * spread.exchange.get(kind, {}).get(n, spread.transfer)[end]
            for n, seconds in getattr(profile, name).items()
        }
        for kind, name in TIMED.items()
    }
    return dataclasses.replace(
        profile,
        t_grad=profile.t_grad * grad,
        t_step=profile.t_step * grad if profile.t_step is not None else None,
        t_grad_parts={n: t * grad for n, t in profile.t_grad_parts.items()},
        t_backward=profile.t_backward * grad if profile.t_backward is not None else None,
        contention=contention,
        exchange_compute={kind: {n: t * grad for n, t in by.items()} for kind, by in profile.exchange_compute.items()},
        t_comm=profile.t_comm * transfer,
        latency=profile.latency * transfer,
        bandwidth=profile.bandwidth / transfer if profile.bandwidth else profile.bandwidth,
        kvstore={n: t * transfer for n, t in profile.kvstore.items()},
        **timed,
    )


def speedup_range(
    profile: Profile,
    configuration: Configuration,
    workers: int,
    *,
    batches: float,
    cores: int | None = None,
    spread: Spread | None = None,
) -> tuple[float, float, float] | None:
    """The refined model's (low, point, high) speedup of ``configuration`` on ``workers`` workers; None where the
    profile measured no spread. ``spread``: the profile's, when already found."""
    spread = spread or measured_spread(profile)
    point = predicted_speedup("refined", profile, configuration, workers, batches=batches, cores=cores)
    if spread is None:
        return None
    fast, slow = bound_profiles(profile, spread)
    # each bound's speedup is its rate × its own reference: the rate's reference swapped for the other end's
    fast_reference, slow_reference = Terms(fast, cores).sequential, Terms(slow, cores).sequential
    slowest = predicted_speedup("refined", slow, configuration, workers, batches=batches, cores=cores)
    fastest = predicted_speedup("refined", fast, configuration, workers, batches=batches, cores=cores)
    low = slowest / slow_reference * fast_reference * (1 - spread.noise)
    high = fastest / fast_reference * slow_reference * (1 + spread.noise)
    return (min(low, point), point, max(high, point))


def train_seconds_range(
    profile: Profile,
    configuration: Configuration,
    workers: int,
    *,
    batches: float,
    cores: int | None = None,
    spread: Spread | None = None,
) -> tuple[float, float, float] | None:
    """The refined model's (low, point, high) t_train of ``batches`` batches on ``workers`` workers: the fast
    profile's time less the noise, the model's, the slow profile's plus the noise; None without a spread."""
    spread = spread or measured_spread(profile)

    def seconds(bound: Profile) -> float:  # batches / batches per second, the rate being the speedup / reference
        speedup = predicted_speedup("refined", bound, configuration, workers, batches=batches, cores=cores)
        return batches * Terms(bound, cores).sequential / speedup

    point = seconds(profile)
    if spread is None:
        return None
    fast, slow = bound_profiles(profile, spread)
    low, high = seconds(fast) * (1 - spread.noise), seconds(slow) * (1 + spread.noise)
    return (min(low, point), point, max(high, point))


def overlap(first: tuple[float, float, float], second: tuple[float, float, float]) -> bool:
    """Whether two ranges (low, point, high) share a value: the predictions cannot tell them apart.

    >>> overlap((1.5, 1.6, 1.7), (1.65, 1.8, 1.9)), overlap((1.5, 1.6, 1.7), (1.75, 1.8, 1.9))
    (True, False)
    """
    return first[0] <= second[2] and second[0] <= first[2]
