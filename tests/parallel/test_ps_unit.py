"""The parameter server's update rules, in one process (no peers): staleness, its histogram, and
the staleness-aware learning rate."""

from __future__ import annotations

import torch
from torch import nn

from scaletrain.parallel.ps import ShardServer
from scaletrain.parallel.sharding import assign_greedy, flatten, unflatten_into


def server(staleness_aware: bool, synchronous: bool = False, contributors: int = 1) -> ShardServer:
    master = [nn.Parameter(torch.zeros(3))]
    return ShardServer(
        master=master,
        optimizer=torch.optim.SGD(master, lr=0.5),
        peers={},
        contributors=contributors,
        synchronous=synchronous,
        staleness_aware=staleness_aware,
    )


def test_async_updates_record_staleness() -> None:
    ps = server(staleness_aware=False)
    ps.contribute(torch.ones(3), version=0)
    ps.contribute(torch.ones(3), version=0)  # computed on weights one update old
    version, weights = ps.contribute(torch.ones(3), version=0)  # two updates old
    assert version == 3
    torch.testing.assert_close(weights, torch.full((3,), -1.5))
    assert ps.stats.staleness_summary() == {"mean": 1.0, "max": 2, "histogram": {"0": 1, "1": 1, "2": 1}}


def test_staleness_aware_rate_divides_by_the_staleness() -> None:
    ps = server(staleness_aware=True)
    ps.contribute(torch.ones(3), version=0)  # fresh: lr 0.5
    ps.contribute(torch.ones(3), version=0)  # staleness 1: lr 0.5
    _, weights = ps.contribute(torch.ones(3), version=0)  # staleness 2: lr 0.25
    torch.testing.assert_close(weights, torch.full((3,), -1.25))


def test_synchronous_update_averages_all_contributions() -> None:
    ps = server(staleness_aware=False, synchronous=True, contributors=1)
    _, weights = ps.contribute(torch.tensor([2.0, 4.0, 6.0]), version=0)
    torch.testing.assert_close(weights, torch.tensor([-1.0, -2.0, -3.0]))


def test_greedy_assignment_balances_bytes() -> None:
    # Šlampa's Algorithm 3.7: in order, each tensor to the owner with the fewest bytes so far.
    assert assign_greedy([10, 10, 10, 10], [0, 1]) == [0, 1, 0, 1]
    assert assign_greedy([100, 1, 1, 1, 1], [0, 1, 2]) == [0, 1, 2, 1, 2]


def test_flatten_round_trip() -> None:
    tensors = [torch.arange(6.0).view(2, 3), torch.tensor([7.0])]
    targets = [torch.zeros(2, 3), torch.zeros(1)]
    unflatten_into(flatten(tensors), targets)
    assert all(torch.equal(a, b) for a, b in zip(tensors, targets, strict=True))
