"""Mean value analysis: the recursion against the product-form solution, grouped and vectorised against plain."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from scaletrain.estimate.queueing import mean_value_throughput, mean_value_throughputs, throughput_bound


def product_form_throughput(customers: int, think: float, demands: list[float]) -> float:
    """X(N) = G(N−1) / G(N), G(N) = Σ over every way to place N jobs of think^n0 / n0! · Π demand_k^n_k."""

    def normaliser(jobs: int) -> float:
        total = 0.0
        for placed in itertools.product(range(jobs + 1), repeat=len(demands)):
            if sum(placed) <= jobs:
                waiting = jobs - sum(placed)
                total += (
                    think**waiting
                    / math.factorial(waiting)
                    * math.prod(d**k for d, k in zip(demands, placed, strict=True))
                )
        return total

    return normaliser(customers - 1) / normaliser(customers)


NETWORKS = [(1, 1.0, [0.5, 0.2]), (4, 0.3, [0.5, 0.2, 0.2]), (6, 2.0, [0.1, 0.9]), (5, 0.0, [0.4, 0.4, 0.1])]


@pytest.mark.parametrize(("customers", "think", "demands"), NETWORKS)
def test_recursion_equals_the_product_form_solution(customers, think, demands):
    assert mean_value_throughput(customers, think, demands) == pytest.approx(
        product_form_throughput(customers, think, demands), rel=1e-12
    )


def random_networks(count: int, seed: int) -> list[tuple[int, float, dict[float, int]]]:
    rng = random.Random(seed)
    networks = []
    for _ in range(count):
        demands = {rng.uniform(0.001, 0.5): rng.randint(1, 40) for _ in range(rng.randint(0, 4))}
        networks.append((rng.randint(1, 60), rng.uniform(0.01, 3.0), demands))
    return networks


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_and_grouped_equal_one_queue_at_a_time(seed):
    networks = random_networks(25, seed)
    plain = [
        mean_value_throughput(customers, think, [d for d, queues in demands.items() for _ in range(queues)])
        for customers, think, demands in networks
    ]
    assert mean_value_throughputs(networks) == pytest.approx(plain, rel=1e-12)
    for (customers, think, demands), expected in zip(networks, plain, strict=True):
        grouped = mean_value_throughput(customers, think, list(demands), list(demands.values()))
        assert grouped == pytest.approx(expected, rel=1e-12)
        assert throughput_bound(customers, think, demands) >= expected * (1 - 1e-12)


def test_networks_alike_share_one_recursion_and_keep_their_order():
    demands = {0.2: 3, 0.05: 1}
    networks = [(7, 1.0, demands), (2, 1.0, demands), (7, 1.0, demands), (30, 1.0, demands)]
    expected = [mean_value_throughput(n, 1.0, [0.2, 0.2, 0.2, 0.05]) for n, _, _ in networks]
    assert mean_value_throughputs(networks) == pytest.approx(expected, rel=1e-12)
    assert mean_value_throughputs([]) == []
