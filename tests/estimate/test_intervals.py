"""Prediction intervals: the arithmetic by hand on planted profiles whose samples are chosen here."""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.estimate.intervals import (
    DEFAULT_RUN_NOISE,
    bound_profiles,
    decile_factors,
    measured_spread,
    overlap,
    speedup_range,
    train_seconds_range,
)
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.recommend import recommend
from scaletrain.estimate.refined import Terms

#: two launches of five gradients each, 0.095 s then 0.105 s; five round trips of 18–22 ms (t_comm: half of 20 ms)
PLANTED = Profile(
    "planted",
    32,
    t_grad=0.1,
    t_comm=0.01,
    weight_bytes=10**6,
    tensor_bytes=(10**6,),
    samples={"t_grad": [0.095] * 5 + [0.105] * 5, "launches": 2, "round_trip": [0.018, 0.019, 0.02, 0.021, 0.022]},
)
ALLREDUCE = Configuration.parse("allreduce-join")


def test_the_deciles_interpolate_between_the_sorted_samples():
    # ten samples: the 10th percentile at position 0.9 (still 0.095), the 90th at 8.1 (0.105); median 0.1
    assert decile_factors(PLANTED.samples["t_grad"]) == pytest.approx((0.95, 1.05))
    # five: positions 0.4 and 3.6 → 18.4 and 21.6 ms over 20 ms
    assert decile_factors(PLANTED.samples["round_trip"]) == pytest.approx((0.92, 1.08))
    assert decile_factors([0.3]) == (1.0, 1.0) and decile_factors([]) == (1.0, 1.0)


def test_the_range_of_a_planted_profile_by_hand():
    spread = measured_spread(PLANTED)
    # the two launches' medians, 0.095 and 0.105, are 5 % either side of the pooled median 0.1
    assert spread.noise == pytest.approx(0.05) and "2 launches" in spread.noise_source
    low, point, high = speedup_range(PLANTED, ALLREDUCE, 2, batches=128)
    # the slowest of 2: each launch's steps are all alike (no straggler within a launch), at the typical launch's
    # level, the median of 0.095 and 0.105: 0.1, the median itself (the launches' spread is the noise, below);
    # the ring all-reduce of 1 MB among 2 at 1 MB / t_comm: t_comm itself
    assert PLANTED.slowest_of(2) == pytest.approx(1.0) and PLANTED.slowest_of(1) == pytest.approx(1.0)
    assert point == pytest.approx(2 / (0.1 + 0.01) * 0.1)
    assert point == predicted_speedup("refined", PLANTED, ALLREDUCE, 2, batches=128)  # the point is unchanged
    # low: the workers at the 90th percentiles (t_grad × 1.05, t_comm × 1.08), the reference at the 10th, − 5 %
    assert low == pytest.approx(2 / (0.105 + 0.0108) * 0.095 * (1 - 0.05))
    # high: the workers at the 10th percentiles, the reference at the 90th, + 5 %
    assert high == pytest.approx(2 / (0.095 + 0.0092) * 0.105 * (1 + 0.05))
    assert low < point < high
    # the time to train 128 batches: 64 join steps of 2 batches, at the model's, the fast and the slow step
    times = train_seconds_range(PLANTED, ALLREDUCE, 2, batches=128)
    assert times == pytest.approx((64 * (0.095 + 0.0092) * 0.95, 64 * (0.1 + 0.01), 64 * (0.105 + 0.0108) * 1.05))


def test_a_measured_reference_is_what_every_speedup_is_over_and_moves_with_the_gradient():
    # the profile's real one-process runs took 0.12 s a batch where forward and backward took 0.1 (and no update)
    measured = dataclasses.replace(PLANTED, t_step=0.12)
    assert Terms(measured, None).sequential == 0.12 and Terms(PLANTED, None).sequential == pytest.approx(0.1)
    low, point, high = speedup_range(measured, ALLREDUCE, 2, batches=128)
    assert point == pytest.approx(2 / (0.1 + 0.01) * 0.12)
    # the bounds as above, the reference at the gradient's 10th and 90th percentile of 0.12
    assert low == pytest.approx(2 / (0.105 + 0.0108) * 0.12 * 0.95 * (1 - 0.05))
    assert high == pytest.approx(2 / (0.095 + 0.0092) * 0.12 * 1.05 * (1 + 0.05))
    # the workers' rate is the same: so is the time they take, whatever the reference
    assert train_seconds_range(measured, ALLREDUCE, 2, batches=128) == pytest.approx(
        train_seconds_range(PLANTED, ALLREDUCE, 2, batches=128)
    )


def test_contention_and_an_exchange_move_at_their_own_samples():
    """A count whose contention was measured takes its own samples' deciles (not t_grad's on top), and an exchange
    timed among N its own; one timed without samples takes the round trip's."""
    planted = Profile(
        "planted",
        32,
        t_grad=0.1,
        t_comm=0.01,
        contention={2: 1.2},
        allreduce={2: 0.02},
        central={2: 0.05},
        samples={
            "t_grad": [0.095] * 5 + [0.105] * 5,
            "round_trip": [0.018, 0.019, 0.02, 0.021, 0.022],
            "t_grad_contended": {"2": [0.11, 0.12, 0.13]},  # median 0.12 = 1.2 × t_grad; deciles 0.112 and 0.128
            "exchange": {"allreduce": {"2": [0.0185, 0.02, 0.0215]}},  # deciles 0.0188 and 0.0212
        },
    )
    fast, slow = bound_profiles(planted, measured_spread(planted))
    assert slow.t_grad * slow.contention[2] == pytest.approx(0.128)
    assert fast.t_grad * fast.contention[2] == pytest.approx(0.112)
    assert (fast.allreduce[2], slow.allreduce[2]) == pytest.approx((0.0188, 0.0212))
    assert (fast.central[2], slow.central[2]) == pytest.approx((0.05 * 0.92, 0.05 * 1.08))  # the round trip's
    assert (fast.t_comm, slow.t_comm) == pytest.approx((0.0092, 0.0108))
    assert fast.samples == slow.samples == planted.samples  # the stragglers' shape is kept
    # no launches recorded: the default run-to-run noise
    assert measured_spread(planted).noise == DEFAULT_RUN_NOISE
    low, point, high = speedup_range(planted, ALLREDUCE, 2, batches=128, cores=2)
    assert low < point < high


def test_given_times_have_no_spread_and_no_range():
    given = Profile("(given times)", 0, t_grad=0.1, t_comm=0.01)
    assert measured_spread(given) is None
    assert speedup_range(given, ALLREDUCE, 2, batches=128) is None
    assert train_seconds_range(given, ALLREDUCE, 2, batches=128) is None


def test_ranges_overlap_when_they_share_a_value():
    assert overlap((1.0, 1.1, 1.2), (1.2, 1.3, 1.4)) and overlap((1.0, 1.5, 2.0), (1.2, 1.3, 1.4))
    assert not overlap((1.0, 1.1, 1.19), (1.2, 1.3, 1.4))


def test_the_advice_says_when_the_runner_up_cannot_be_told_apart():
    advice = recommend(PLANTED, max_workers=2, models=("refined",))["refined"]
    best, rival = advice["range"], advice["runner_up"]
    assert advice["workers"] == 2 and best[1] == pytest.approx(advice["speedup"])
    assert rival["workers"] == 2 and rival["configuration"] != advice["configuration"]
    assert advice["indistinguishable"] == overlap(best, rival["range"])
    # the same profile with no spread at all: every range is its point, and two different points are apart
    exact = Profile(
        "planted", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(10**6,),
        samples={"t_grad": [0.1] * 4, "launches": 2, "round_trip": [0.02] * 3},
    )  # fmt: skip
    sharp = recommend(exact, max_workers=2, models=("refined",))["refined"]
    assert sharp["range"][0] == sharp["range"][2] == pytest.approx(sharp["speedup"])
    assert not sharp["indistinguishable"]
    # wide samples: the best and the runner-up overlap
    wide = Profile(
        "planted", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(10**6,),
        samples={"t_grad": [0.05, 0.1, 0.2], "round_trip": [0.01, 0.02, 0.04]},
    )  # fmt: skip
    assert recommend(wide, max_workers=2, models=("refined",))["refined"]["indistinguishable"]
    # transfers that dwarf the gradient: one worker alone is best, and the runner-up is the best choice on more
    slow_link = Profile("planted", 32, t_grad=0.1, t_comm=5.0, samples=PLANTED.samples)
    alone = recommend(slow_link, max_workers=3, models=("refined",))["refined"]
    assert alone["configuration"] == "local" and alone["range"] == (1.0, 1.0, 1.0)
    assert alone["runner_up"]["workers"] > 1 and alone["runner_up"]["range"][2] < 1
    assert not alone["indistinguishable"]
    # given times: no range, and nothing said
    given = recommend(Profile("(given times)", 0, t_grad=0.1, t_comm=0.01), max_workers=2, models=("refined",))
    assert given["refined"]["range"] is None and given["refined"]["indistinguishable"] is False
