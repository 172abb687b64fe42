"""Staleness compensation for asynchronous SGD: the momentum rule, the running estimate, the modes."""

from __future__ import annotations

import itertools

import pytest
import torch

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.run import make_config
from scaletrain.parallel.strategies.ps.options import ps_options
from scaletrain.parallel.strategies.ps.staleness import (
    Compensation,
    StalenessEstimate,
    compensated_momentum,
    delay_compensate,
    implicit_momentum,
    staleness_rate_scale,
)

MOMENTA = (0.0, 0.5, 0.8, 0.9, 0.95, 0.99)


@pytest.mark.parametrize("momentum", MOMENTA)
def test_fresh_gradients_keep_the_requested_momentum(momentum: float) -> None:
    assert compensated_momentum(momentum, 0.0) == momentum


@pytest.mark.parametrize("momentum", MOMENTA)
def test_more_staleness_lowers_the_momentum_and_never_below_zero(momentum: float) -> None:
    values = [compensated_momentum(momentum, staleness / 4) for staleness in range(200)]
    assert all(0.0 <= value <= momentum for value in values)
    assert all(later <= earlier for earlier, later in itertools.pairwise(values))
    if momentum > 0:
        assert values[4] < momentum  # τ̄ = 1 already lowers it
        # Past τ̄ = μ / (1 − μ) asynchrony alone carries more momentum than asked for: nothing left to lower.
        assert compensated_momentum(momentum, momentum / (1 - momentum) + 1e-9) == 0.0
        assert compensated_momentum(momentum, 1e6) == 0.0


@pytest.mark.parametrize("momentum", (0.5, 0.8, 0.9))
@pytest.mark.parametrize("staleness", (0.5, 1.0, 2.0, 3.0))
def test_explicit_and_implicit_momentum_add_up_to_the_requested_one(momentum: float, staleness: float) -> None:
    explicit = compensated_momentum(momentum, staleness)
    if explicit > 0:  # not clamped
        assert explicit + implicit_momentum(staleness) == pytest.approx(momentum)


def test_two_workers_turn_point_nine_into_point_four() -> None:
    # Two workers take turns: mean staleness 1, implicit momentum 1/2 (Mitliagkas et al. 2016).
    assert compensated_momentum(0.9, 1.0) == pytest.approx(0.4)
    assert implicit_momentum(1.0) == 0.5 and implicit_momentum(0.0) == 0.0


def test_delay_compensation_adds_the_taylor_term() -> None:
    gradient, square = torch.tensor([1.0, -2.0, 0.0]), torch.tensor([1.0, 4.0, 1.0])
    stale, now = torch.zeros(3), torch.tensor([0.5, 0.25, 3.0])
    delay_compensate(gradient, now, stale, square, lambda0=1.0)
    square_after = 0.95 * torch.tensor([1.0, 4.0, 1.0]) + 0.05 * torch.tensor([1.0, 4.0, 0.0])
    expected = torch.tensor([1.0, -2.0, 0.0]) + torch.tensor([0.5, 4 * 0.25, 0.0]) / square_after.sqrt()
    assert torch.allclose(gradient, expected) and torch.allclose(square, square_after)
    fresh = torch.tensor([1.0, -2.0, 0.0])
    delay_compensate(fresh, now, now.clone(), square)  # no delay, no change
    assert fresh.tolist() == [1.0, -2.0, 0.0]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="momentum"):
        compensated_momentum(1.0, 0.0)
    with pytest.raises(ValueError, match="staleness"):
        compensated_momentum(0.9, -1.0)


def test_staleness_aware_rate_scale() -> None:
    assert [staleness_rate_scale(s) for s in (0, 1, 2, 4)] == [1.0, 1.0, 0.5, 0.25]


def test_estimate_averages_then_follows_recent_staleness() -> None:
    estimate = StalenessEstimate(prior=1.0, horizon=10)
    for _ in range(9):
        estimate.observe(1)
    assert estimate.mean == pytest.approx(1.0)
    for _ in range(100):
        estimate.observe(3)  # the run slowed down: the estimate moves to the new staleness
    assert estimate.mean == pytest.approx(3.0, abs=0.01)


def test_modes_return_rate_factor_and_momentum() -> None:
    momentum, lr, none = (Compensation(mode, momentum=0.9, workers=3) for mode in ("momentum", "lr", "none"))
    for _ in range(500):
        assert none.step(2) == (1.0, 0.9)
        assert lr.step(2) == (0.5, 0.9)
        momentum.step(2)
    assert momentum.summary()["explicit_momentum"] == pytest.approx(0.9 - 2 / 3)
    assert momentum.summary()["staleness_estimate"] == pytest.approx(2.0)
    assert momentum.summary()["rate_factor"] == 1.0  # 0.9 absorbs three workers' momentum
    plain = Compensation("momentum", momentum=0.0, workers=3)
    for _ in range(500):
        scale, explicit = plain.step(2)
    assert explicit == 0.0 and scale == 1.0  # nothing to lower, and the rate stays (see the method card)
    assert plain.summary()["mean_rate_factor"] == 1.0
    with pytest.raises(ValueError, match="momentum, lr, delay, none"):
        Compensation("fast", momentum=0.9)


def test_the_strategy_validates_the_mode() -> None:
    assert ps_options(TrainConfig("lenet", workers=2, strategy="ps"))["compensation"] == "momentum"
    with pytest.raises(ConfigError, match="option compensation must be one of momentum, lr, delay, none"):
        make_config("lenet", workers=2, strategy="ps-central-async", async_compensation="staleness")
    with pytest.raises(ConfigError, match="option compensation must be one of"):
        make_config("lenet", workers=2, strategy="ps-central-async", strategy_options={"compensation": "staleness"})
