"""Both models over many worker counts at once: the same numbers as one count at a time, and fast at 10,000."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tests.estimate.test_refined import PROFILE

from scaletrain.errors import ConfigError
from scaletrain.estimate.models import (
    MODELS,
    Configuration,
    best_per_workers,
    predicted_configurations,
    predicted_speedup,
    predicted_speedups,
    thesis_configurations,
)
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.queueing import mean_value_throughput
from scaletrain.estimate.recommend import recommend
from scaletrain.estimate.refined import Terms, asynchronous_networks, batches_per_second, step_split
from scaletrain.parallel import strategies
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies import STRATEGIES, Strategy, all_specs

REPO = Path(__file__).resolve().parents[2]
#: A real profile (SqueezeNet: 52 tensors, gradient-time samples, contention) as `scaletrain profile` wrote it.
SQUEEZENET = Profile.from_json(json.loads((REPO / "results/validation/squeezenet-loopback/profile.json").read_text()))
TOY = Profile("toy", 32, t_grad=0.821, t_comm=0.811)
REFINED = predicted_configurations()


def test_the_configurations_to_predict_are_the_registrys_predicted_specs():
    assert [c.label for c in predicted_configurations()] == all_specs(predicted_only=True)
    assert {c.strategy for c in REFINED} == {name for name, s in STRATEGIES.items() if s.predicted}
    assert "local" not in {c.label for c in REFINED} and not STRATEGIES["local"].predicted
    # A strategy without servers has none, whatever the thesis's --server said.
    assert Configuration.parse("allreduce-join") == Configuration("allreduce", "", "join")
    assert Configuration.from_thesis("sync-join", "central", "allreduce") == Configuration("allreduce", "", "join")
    # Every one of them is modelled: the refined model predicts each (a new predicted strategy must add its
    # formulas), the thesis model each that names a thesis formula, and refuses the rest in one line.
    advice = recommend(TOY, max_workers=3)
    for model in MODELS:
        for configuration in REFINED:
            terms = STRATEGIES[configuration.strategy].estimator_terms(configuration.server)
            if model == "thesis" and terms.thesis_server is None:
                with pytest.raises(ConfigError, match="not modelled by the estimator: the thesis model has no formula"):
                    predicted_speedup(model, TOY, configuration, 3, batches=128)
                continue
            assert predicted_speedup(model, TOY, configuration, 3, batches=128) > 0
        assert advice[model]["configuration"] in {"local", *all_specs(predicted_only=True)}
    assert "diloco-split" in [c.label for c in REFINED]  # at least one without a thesis formula was seen


def test_diloco_talks_once_in_h_steps_and_is_weighed_for_advice_only_when_asked():
    """Its step: the inner update, and an H-th of the change's all-reduce and of an outer update; with H = 1 that
    is the synchronous all-reduce's step and one update more. Advice weighs it when the user gives its H."""
    profile = Profile(
        "toy", 32, t_grad=0.1, t_comm=0.05, t_update=0.004, latency=0.0, weight_bytes=10**6, bandwidth=1e8
    )
    diloco, dense = Configuration.parse("diloco-split"), Configuration.parse("allreduce-split")
    speedups = {h: predicted_speedup("refined", profile, diloco.with_options({"sync_every": h}), 4, batches=128)
                for h in (1, 4, 64)}  # fmt: skip
    allreduce = predicted_speedup("refined", profile, dense, 4, batches=128)
    batch_time = (0.1 + 0.004) / allreduce  # the all-reduce's step, from its speedup
    assert (0.1 + 0.004) / speedups[1] == pytest.approx(batch_time + 0.004, rel=1e-9)
    assert speedups[1] < allreduce < speedups[4] < speedups[64]
    unasked = recommend(profile, max_workers=8, models=("refined",))["refined"]
    asked = recommend(profile, max_workers=8, models=("refined",), strategy_options={"sync_every": 64})["refined"]
    assert not unasked["configuration"].startswith("diloco")
    assert asked["configuration"] in ("diloco-join, sync_every=64", "diloco-split, sync_every=64")
    assert asked["speedup"] > unasked["speedup"] and "what they cost in quality is not" in asked["note"]


def test_diloco_pays_its_last_outer_step_and_waits_for_the_slowest_only_at_outer_steps():
    """A run of S steps takes ⌈S/H⌉ outer steps (the last concludes fewer than H inner ones), all of them in the S − 5
    steps its throughput counts; the workers wait for each other only there, so the wait timed beside the dense
    all-reduce comes ⌈S/H⌉ times, not S (measured at 10 Mbit/s: gpt, 120 steps at H = 64, 0.139 where the per-step
    wait and 1.9 outer steps in 120 predicted 0.112)."""
    profile = Profile(
        "toy", 32, t_grad=0.1, t_comm=0.5, t_grad_parts={2: 0.05}, t_update=0.004, t_step=0.104, latency=0.0,
        weight_bytes=10**6, allreduce={2: 1.0}, exchange_compute={"allreduce": {2: 0.1}},
        exchange_wait={"allreduce": {2: 0.03}},
    )  # fmt: skip
    dense = step_split(profile, strategy="allreduce", sync="split", workers=2)
    assert dense["wait"] == pytest.approx(0.015) and dense["exchange"] > 1.0  # half the batch: half the timed wait

    def step(batches: float | None, sync: str = "split", every: int = 64) -> float:
        terms = Terms(profile, None, options={"sync_every": every}, batches=batches)
        rate = batches_per_second(terms, strategy="diloco", server="", sync=sync, workers=[2])[0]
        return (2 if sync == "join" else 1) / rate

    # the throughput leaves out each worker's first 5 steps (inner ones), not the outer steps
    for batches, outer in ((None, 1 / 64), (128, 2 / 123), (120, 2 / 115), (130, 3 / 125), (3, 1 / 1)):
        expected = dense["compute"] + profile.t_update + (dense["exchange"] + dense["wait"]) * outer
        assert step(batches) == pytest.approx(expected, rel=1e-12), batches
    # join: a step trains both workers' batches, so a run of 240 batches is 120 steps of each worker's
    joined = step_split(profile, strategy="allreduce", sync="join", workers=2)
    extra = (joined["exchange"] + joined["wait"]) * (2 / 115 - 1 / 64)
    assert step(240, "join") - step(None, "join") == pytest.approx(extra, rel=1e-9)
    # H = 1 waits every step, as the dense all-reduce does, warm-up or not
    assert step(120, every=1) == pytest.approx(dense["step"] + profile.t_update, rel=1e-12)


class _Gossip(Strategy):
    """A strategy the registry predicts but neither model has a formula for."""

    name = "gossip"
    description = "made up for the test"
    syncs = ("join", "async")

    def run(self, prepared, layout, rank, store):  # pragma: no cover - never trained
        raise NotImplementedError


@pytest.mark.parametrize("model", MODELS)
def test_a_new_strategy_without_formulas_is_not_modelled_rather_than_a_key_error(model, monkeypatch):
    monkeypatch.setitem(STRATEGIES, "gossip", _Gossip())
    assert "gossip-async" in all_specs(predicted_only=True)
    for spec in ("gossip-join", "gossip-async"):
        with pytest.raises(ConfigError, match="gossip-.* is not modelled by the estimator"):
            predicted_speedup(model, PROFILE, Configuration.parse(spec), 2, batches=128)
    if model == "refined":  # the thesis model recommends among its own six
        with pytest.raises(ConfigError, match="not modelled by the estimator"):
            recommend(PROFILE, max_workers=2, models=(model,))
    monkeypatch.setattr(_Gossip, "predicted", False)
    assert [c.label for c in predicted_configurations()] == [c.label for c in REFINED]  # out of the list again
    assert strategies.parse_spec("gossip-join") == ("gossip", "", "join")  # still trainable, just not predicted


@pytest.mark.parametrize("profile", [TOY, PROFILE, SQUEEZENET], ids=["times-only", "made-up", "squeezenet"])
@pytest.mark.parametrize("cores", [None, 2])
def test_all_counts_at_once_equal_one_count_at_a_time(profile, cores):
    top = 70  # past SqueezeNet's 52 tensors, where every tensor gets an owner of its own
    for model, configurations in (("thesis", thesis_configurations()), ("refined", REFINED)):
        curves = predicted_speedups(model, profile, configurations, top, batches=128, cores=cores)
        for configuration in configurations:
            one_by_one = [
                predicted_speedup(model, profile, configuration, n, batches=128, cores=cores) for n in range(1, top + 1)
            ]
            assert curves[configuration] == pytest.approx(one_by_one, rel=1e-12), (model, configuration.label)


@pytest.mark.parametrize("cores", [None, 2])
def test_asynchronous_networks_are_the_flat_networks_of_every_queue(cores):
    """Grouped queues = the model's definition queue by queue: per owner its uplink, downlink and update."""
    terms = Terms(SQUEEZENET, cores)
    workers = np.array([1, 2, 3, 10, 51, 52, 53, 120])
    size = SQUEEZENET.weight_bytes
    bandwidth = SQUEEZENET.bytes_per_second
    for n, network in zip(
        workers.tolist(), asynchronous_networks(terms, server="sharded", workers=workers), strict=True
    ):
        owners = assign_greedy(SQUEEZENET.tensor_bytes, list(range(n)))
        total = sum(SQUEEZENET.tensor_bytes)
        shares = [
            sum(b for b, o in zip(SQUEEZENET.tensor_bytes, owners, strict=True) if o == j) / total for j in range(n)
        ]
        flat = []
        for share in shares:
            link = ((1 - share) / n + (n - 1) / n * share) * size / bandwidth if n > 1 else 0.0
            flat += [link, link, share * SQUEEZENET.t_update]
        customers, think, grouped = network
        assert customers == n
        assert Counter(d for d in flat if d > 0) == Counter(grouped)
        assert mean_value_throughput(n, think, list(grouped), list(grouped.values())) == pytest.approx(
            mean_value_throughput(n, think, flat), rel=1e-12
        )


@pytest.mark.parametrize("profile", [TOY, PROFILE, SQUEEZENET], ids=["times-only", "made-up", "squeezenet"])
@pytest.mark.parametrize("cores", [None, 2])
def test_best_per_workers_is_the_maximum_of_every_curve(profile, cores):
    top = 60
    for model in MODELS:
        configurations = thesis_configurations() if model == "thesis" else REFINED
        curves = predicted_speedups(model, profile, configurations, top, batches=128, cores=cores)
        expected = [max((curve[n], c.label) for c, curve in curves.items()) for n in range(top)]
        best = best_per_workers(model, profile, configurations, top, batches=128, cores=cores)
        assert [label for _, label in best] == [label for _, label in expected]
        assert [speedup for speedup, _ in best] == pytest.approx([speedup for speedup, _ in expected], rel=1e-12)


def test_recommend_ten_thousand_workers():
    advice = recommend(TOY, max_workers=10_000)
    # Without latency or update cost the sharded server's exchange stays 2·t_comm·(N−1)/N: more workers always help.
    assert (advice["thesis"]["workers"], advice["thesis"]["configuration"]) == (10_000, "ps-sharded-join")
    assert advice["refined"]["speedup"] == pytest.approx(advice["thesis"]["speedup"], rel=1e-9)
    assert len(advice["refined"]["by_workers"]) == 10_000
    real = recommend(SQUEEZENET, max_workers=10_000)
    assert 1 < real["refined"]["speedup"] < real["thesis"]["speedup"]


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"max_workers": 0}, "--workers"),
        ({"max_workers": 3, "batches": float("nan")}, "--batches"),
        ({"max_workers": 3, "batches": float("inf")}, "--batches"),
        ({"max_workers": 3, "cores": 0}, "--cores"),
    ],
)
def test_inputs_no_model_can_use_are_refused(settings, fragment):
    settings = {"batches": 128, **settings}
    with pytest.raises(ConfigError, match=fragment):
        predicted_speedups("refined", TOY, REFINED, settings.pop("max_workers"), **settings)


@pytest.mark.parametrize(("t_grad", "t_comm"), [(float("nan"), 0.1), (0.5, float("nan")), (float("inf"), 0.1),
                                                (0.5, -1.0), (0.0, 0.1)])  # fmt: skip
@pytest.mark.parametrize("model", MODELS)
def test_times_that_are_not_numbers_are_refused(t_grad, t_comm, model):
    with pytest.raises(ConfigError, match="--t-grad"):
        predicted_speedups(model, Profile("bad", 0, t_grad=t_grad, t_comm=t_comm), REFINED[:1], 2, batches=128)
