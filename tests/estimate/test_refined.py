"""The refined model against hand-computed values for a made-up profile whose numbers are easy to follow.

Profile: t_grad 0.1 s (0.06 s at half the batch), t_update 0.01 s, latency 1 ms, 1 MB of weights in
two tensors (600 kB, 400 kB) over 10 MB/s (so one full transfer is 0.1 s + 1 ms), and 2 processes
computing at once are 1.1× slower. The sequential reference is t_grad + t_update = 0.11 s per batch.
"""

from __future__ import annotations

import dataclasses

import pytest

from scaletrain.errors import ConfigError
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.queueing import demand_scale
from scaletrain.estimate.recommend import recommend
from scaletrain.estimate.refined import mean_value_throughput, predict, step_split

PROFILE = Profile(
    "made-up",
    64,
    t_grad=0.1,
    t_comm=0.101,
    t_grad_parts={2: 0.06},
    t_update=0.01,
    latency=0.001,
    bandwidth=1e7,
    weight_bytes=10**6,
    tensor_bytes=(600_000, 400_000),
    contention={1: 1.0, 2: 1.1},
)
SEQUENTIAL = 0.11


def speedup(strategy, sync, workers, server="central", cores=None):
    return predict(PROFILE, strategy=strategy, server=server, sync=sync, workers=workers, cores=cores).speedup


def test_allreduce_ring_cost():
    # 2 workers: 2(N−1) latencies + 2(N−1)/N of the bytes = 0.002 + 0.1; step = 0.1 + 0.102 + 0.01.
    assert speedup("allreduce", "join", 2) == pytest.approx(2 / 0.212 * SEQUENTIAL)


def test_a_measured_all_reduce_replaces_the_ring_formula_and_corrects_it_between_and_beyond():
    # The profile timed the all-reduce among 2 processes at 0.204 s, twice the ring formula's 0.102 s.
    measured = dataclasses.replace(PROFILE, allreduce={2: 0.204})
    two = predict(measured, strategy="allreduce", sync="join", workers=2)
    assert two.speedup == pytest.approx(2 / (0.1 + 0.204 + 0.01) * SEQUENTIAL)
    # Four workers: the formula's 3 latencies × 2 + 1.5 × 0.1 s of bytes = 0.156 s, times the same factor 2.
    four = predict(measured, strategy="allreduce", sync="join", workers=4)
    assert four.speedup == pytest.approx(4 / (0.1 + 2 * 0.156 + 0.01) * SEQUENTIAL)
    # One worker sends nothing, measured or not; and the thesis model keeps its own formula.
    assert predict(measured, strategy="allreduce", sync="join", workers=1).speedup == pytest.approx(
        predict(PROFILE, strategy="allreduce", sync="join", workers=1).speedup
    )
    allreduce = Configuration.parse("allreduce-join")
    thesis = [predicted_speedup("thesis", p, allreduce, 2, batches=128) for p in (measured, PROFILE)]
    assert thesis[0] == thesis[1]


def test_a_measured_central_exchange_corrects_the_central_server_s_formula():
    # 2 workers: 2 MB through the server's downlink and 2 MB back (0.2 s + 1 ms each) + the update:
    # 0.412 s by the formula; measured 0.824 s, twice as much, and the same factor at 3 workers.
    measured = dataclasses.replace(PROFILE, central={2: 0.824})
    central = Configuration.parse("ps-central-join")
    two = predict(measured, strategy="ps", server="central", sync="join", workers=2).speedup
    assert two == pytest.approx(2 / (0.1 + 0.824) * SEQUENTIAL)
    formula_three = 0.301 + 0.301 + 0.01
    three = predict(measured, strategy="ps", server="central", sync="join", workers=3).speedup
    assert three == pytest.approx(3 / (0.1 + 2 * formula_three) * SEQUENTIAL)
    assert predicted_speedup("refined", PROFILE, central, 2, batches=128) > two  # faster without the correction


def test_a_measured_sharded_exchange_and_the_gradient_beside_it_replace_the_formula_and_the_contention():
    # The sharded probe timed, among 2 workers on 2 cores, the exchange at 0.5 s and the gradient beside it at
    # 0.15 s, where 2 processes that only compute are 1.1× slower (0.11 s).
    measured = dataclasses.replace(PROFILE, sharded={2: 0.5}, exchange_compute={"sharded": {2: 0.15}})
    sharded = predict(measured, strategy="ps", server="sharded", sync="join", workers=2, cores=2).speedup
    assert sharded == pytest.approx(2 / (0.15 + 0.5) * SEQUENTIAL)
    split = step_split(measured, strategy="ps", server="sharded", sync="join", workers=2, cores=2)
    assert (split["compute"], split["wait"], split["exchange"]) == pytest.approx((0.15, 0.0, 0.5))
    # another strategy keeps its own terms: the all-reduce's gradient is 0.1 × 1.1 and its ring formula 0.102 s
    allreduce = predict(measured, strategy="allreduce", sync="join", workers=2, cores=2).speedup
    assert allreduce == pytest.approx(2 / (0.11 + 0.102 + 0.01) * SEQUENTIAL)
    # at a count the probe did not time, the gradient's contention is the profile's again
    exchange_only = dataclasses.replace(PROFILE, sharded={2: 0.5})
    three = [predict(p, strategy="ps", server="sharded", sync="join", workers=3, cores=2).speedup
             for p in (measured, exchange_only)]  # fmt: skip
    assert three[0] == pytest.approx(three[1])
    assert predict(PROFILE, strategy="ps", server="sharded", sync="join", workers=2, cores=2).speedup > sharded


def test_a_timed_asynchronous_exchange_scales_the_central_server_s_queues():
    # Among 2 asynchronous workers the probe timed a worker's push and its wait for the reply at 0.5 s, and the
    # gradient beside it at 0.12 s: each worker then cycles in 0.62 s (the exchange's two 1 ms latencies are in the
    # network's think time and in what was timed), 2 updates every 0.62 s. Untimed, exponential queues of 0.1, 0.01
    # and 0.1 s and the contention of 2 processes that only compute give 2 updates in 0.384 s (0.112 + 0.272).
    timed = dataclasses.replace(PROFILE, central_async={2: 0.5}, exchange_compute={"central-async": {2: 0.12}})
    two = predict(timed, strategy="ps", server="central", sync="async", workers=2, cores=2)
    assert two.batches_per_second == pytest.approx(2 / 0.62)
    parts = step_split(timed, strategy="ps", server="central", sync="async", workers=2, cores=2)
    assert (parts["compute"], parts["wait"] + parts["exchange"], parts["step"]) == pytest.approx((0.12, 0.5, 0.62))
    assert parts["exchange"] == pytest.approx(0.002 + factor_at_two(timed) * 0.21)  # push, update, reply, if alone
    untimed = predict(PROFILE, strategy="ps", server="central", sync="async", workers=2, cores=2)
    assert untimed.batches_per_second == pytest.approx(mean_value_throughput(2, 0.1 * 1.1 + 0.002, [0.1, 0.01, 0.1]))
    # 3 workers, not timed: the queues keep the factor fitted at 2, the gradient the contention of 3 that only compute
    factor = factor_at_two(timed)
    assert factor > 1  # the measured exchange queues more than exponential service does
    three = predict(timed, strategy="ps", server="central", sync="async", workers=3, cores=2).batches_per_second
    think = 0.1 * PROFILE.contention_at(3, cores=2) + 0.002
    assert three == pytest.approx(mean_value_throughput(3, think, [0.1 * factor, 0.01 * factor], [2, 1]))
    # split updates (a gradient of batch // 2 = 0.06 s × 1.2 beside the exchange): the same factor, fitted on the
    # probe's whole batches; each update is half a batch
    split = predict(timed, strategy="ps", server="central", sync="async", workers=2, cores=2, async_split=True)
    updates = mean_value_throughput(2, 0.06 * 1.2 + 0.002, [0.1 * factor, 0.01 * factor], [2, 1])
    assert split.batches_per_second == pytest.approx(updates / 2)


def factor_at_two(profile):
    return demand_scale(2, 0.122, {0.1: 2, 0.01: 1}, profile.central_async[2] - 0.002)


def test_split_uses_measured_half_batch_gradient_and_contention():
    # t_grad(batch/2) = 0.06, × 1.1 for two processes sharing two cores.
    step = 0.06 * 1.1 + 0.102 + 0.01
    assert speedup("allreduce", "split", 2, cores=2) == pytest.approx(SEQUENTIAL / step)
    # On their own machines there is no contention.
    assert speedup("allreduce", "split", 2) == pytest.approx(SEQUENTIAL / (0.06 + 0.102 + 0.01))


def test_central_server_link_is_shared_by_synchronised_workers():
    # Two pushes share the server's downlink (2 MB → 0.2 s), two replies its uplink.
    step = 0.1 + 2 * (0.001 + 0.2) + 0.01
    assert speedup("ps", "join", 2) == pytest.approx(2 / step * SEQUENTIAL)
    one = 0.1 + 2 * (0.001 + 0.1) + 0.01
    assert speedup("ps", "join", 1) == pytest.approx(SEQUENTIAL / one)


def test_sharded_server_follows_the_real_shard_sizes():
    # Greedy ownership: 600 kB → owner 0, 400 kB → owner 1; the busiest link carries 60 % each phase.
    phase = 0.001 + 0.6 * 0.1
    step = 0.1 + 2 * phase + 0.6 * 0.01
    assert speedup("ps", "join", 2, server="sharded") == pytest.approx(2 / step * SEQUENTIAL)
    assert speedup("ps", "join", 1, server="sharded") == pytest.approx(1.0)  # nothing crosses a link


def test_async_central_by_mean_value_analysis_by_hand():
    think = 0.1 + 2 * 0.001
    demands = [0.1, 0.01, 0.1]
    one = 1 / (think + sum(demands))
    queues = [one * d for d in demands]
    two = 2 / (think + sum(d * (1 + q) for d, q in zip(demands, queues, strict=True)))
    assert speedup("ps", "async", 1) == pytest.approx(one * SEQUENTIAL)
    assert speedup("ps", "async", 2) == pytest.approx(two * SEQUENTIAL)
    assert two * SEQUENTIAL == pytest.approx(0.584448, abs=1e-6)


def test_async_sharded_by_hand():
    # With two workers every link carries half the bytes per cycle on average: 0.05 s.
    demands = [0.05, 0.05, 0.006, 0.05, 0.05, 0.004]
    think = 0.1 + 2 * 0.001
    total = sum(demands) + sum(d * d for d in demands) / (think + sum(demands))
    assert speedup("ps", "async", 2, server="sharded") == pytest.approx(2 / (think + total) * SEQUENTIAL)


def test_mean_value_analysis_limits():
    # Light load: as many jobs as fit without queueing; heavy load: the bottleneck's rate.
    assert mean_value_throughput(1, 9.0, [1.0]) == pytest.approx(0.1)
    assert mean_value_throughput(200, 1.0, [0.5, 0.1]) == pytest.approx(2.0, rel=1e-3)
    assert mean_value_throughput(2, 1.0, [0.0]) == pytest.approx(2.0)


def test_contention_extrapolates_with_processes_per_core():
    assert PROFILE.contention_at(2, cores=2) == 1.1
    assert PROFILE.contention_at(4, cores=2) == pytest.approx(2.2)
    assert PROFILE.contention_at(8, cores=None) == 1.0


def test_models_agree_without_latency_update_or_contention_where_the_thesis_is_exact():
    """The thesis's distributed-server formula = the refined sharded one for equal shards and no extras."""
    plain = Profile("plain", 8, t_grad=0.5, t_comm=0.2, weight_bytes=1000, tensor_bytes=(500, 500))
    sharded = Configuration.parse("ps-sharded-join")
    for n in (1, 2):
        assert predicted_speedup("refined", plain, sharded, n, batches=64) == pytest.approx(
            predicted_speedup("thesis", plain, sharded, n, batches=64)
        )


@pytest.mark.parametrize(
    ("strategy", "server", "sync"), [("allreduce", "", "async"), ("ps", "ring", "join"), ("local", "", "join")]
)
def test_a_configuration_the_registry_does_not_predict_is_refused(strategy, server, sync):
    with pytest.raises(ConfigError, match="is not a configuration to predict; choose one of allreduce-join"):
        predict(PROFILE, strategy=strategy, server=server, sync=sync, workers=2)


def test_an_unknown_strategy_is_refused_by_name():
    with pytest.raises(ConfigError, match="unknown strategy 'gossip'"):
        predict(PROFILE, strategy="gossip", sync="join", workers=2)


def test_allreduce_ignores_the_server_and_the_aliases_are_the_theses():
    assert speedup("allreduce", "join", 3, server="sharded") == speedup("allreduce", "join", 3, server="")
    assert speedup("ps", "none", 3, server="distributed") == speedup("ps", "async", 3, server="sharded")


def test_recommend_picks_the_highest_predicted_speedup():
    advice = recommend(PROFILE, max_workers=4)
    for model in ("thesis", "refined"):
        best = advice[model]
        per_workers = advice[model]["by_workers"]
        assert best["speedup"] == max(max(v["speedup"] for v in per_workers.values()), 1.0)
    # SqueezeNet's times from 003 Table 6.1: the thesis found 8 workers with a distributed server best.
    squeezenet = Profile("squeezenet", 0, t_grad=0.758, t_comm=0.033)
    best = recommend(squeezenet, max_workers=8, models=("thesis",))["thesis"]
    assert (best["workers"], best["configuration"]) == (8, "ps-sharded-join")
    # VGG16E: nothing beats one worker.
    vgg = Profile("vgg16e", 0, t_grad=0.719, t_comm=5.153)
    assert recommend(vgg, max_workers=4, models=("thesis",))["thesis"]["configuration"] == "local"


def test_synchronous_steps_wait_for_the_slowest_worker():
    """Samples 0.1, 0.1, 0.2 s: the mean is 0.1333 s, the expected slowest of two 0.1556 s (5/9·0.1 + …)."""
    noisy = Profile("noisy", 8, t_grad=0.1, t_comm=0.0, weight_bytes=1000, samples={"t_grad": [0.1, 0.1, 0.2]})
    mean, slowest_of_two = 0.4 / 3, 0.1 * (1 / 9 + 3 / 9) + 0.2 * (5 / 9)
    assert noisy.slowest_of(1) == pytest.approx(mean / 0.1)
    assert noisy.slowest_of(2) == pytest.approx(slowest_of_two / 0.1)
    sync = predict(noisy, strategy="allreduce", sync="join", workers=2)
    assert sync.batches_per_second == pytest.approx(2 / slowest_of_two)
    assert sync.speedup == pytest.approx(2 / slowest_of_two * mean)
    asynchronous = predict(noisy, strategy="ps", server="central", sync="async", workers=1)
    assert asynchronous.speedup == pytest.approx(1.0)


def test_the_wait_timed_beside_a_strategy_s_exchange_replaces_the_straggler_term_where_it_was_timed():
    """Gradient samples 0.1, 0.1, 0.2 s (the expected slowest of two 0.1556 s); the all-reduce probe among 2
    timed the exchange at 0.05 s, the gradient beside it at 0.12 s and a mean wait for the slowest of 0.01 s."""
    samples = {"t_grad": [0.1, 0.1, 0.2]}
    noisy = Profile("noisy", 8, t_grad=0.1, t_comm=0.0, weight_bytes=1000, samples=samples, t_grad_parts={2: 0.06},
                    allreduce={2: 0.05}, exchange_compute={"allreduce": {2: 0.12}},
                    exchange_wait={"allreduce": {2: 0.01}})  # fmt: skip
    join = step_split(noisy, strategy="allreduce", sync="join", workers=2, cores=2)
    assert (join["compute"], join["wait"], join["exchange"]) == pytest.approx((0.12, 0.01, 0.05))
    rate = predict(noisy, strategy="allreduce", sync="join", workers=2, cores=2).batches_per_second
    assert rate == pytest.approx(2 / 0.18)
    # a split step computes 0.06 of 0.1 s of the batch: that share of the gradient beside it and of the wait
    split = step_split(noisy, strategy="allreduce", sync="split", workers=2, cores=2)
    assert (split["compute"], split["wait"]) == pytest.approx((0.06 * 1.2, 0.01 * 0.6))
    # a parameter server's worker waits inside its exchange: the probe's 0 leaves no straggler term beside it
    sharded = dataclasses.replace(noisy, sharded={2: 0.07}, exchange_compute={"sharded": {2: 0.12}},
                                  exchange_wait={"sharded": {2: 0.0}})  # fmt: skip
    parts = step_split(sharded, strategy="ps", server="sharded", sync="join", workers=2, cores=2)
    assert (parts["compute"], parts["wait"], parts["exchange"]) == pytest.approx((0.12, 0.0, 0.07))
    # at a count the probe did not time, and in a profile that timed no wait, the straggler term is the samples'
    three = step_split(noisy, strategy="allreduce", sync="join", workers=3)
    assert three["wait"] == pytest.approx(0.1 * (noisy.slowest_of(3) - 1))
    untimed = dataclasses.replace(noisy, exchange_wait={})
    assert step_split(untimed, strategy="allreduce", sync="join", workers=2, cores=2)["wait"] == pytest.approx(
        0.12 * (noisy.slowest_of(2) - 1)
    )
