"""The parameter server's update rules, in one process (no peers): staleness, its histogram, the
staleness-aware learning rate and the staleness-compensated momentum."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.parallel.strategies.ps.staleness import Compensation
from scaletrain.tensors.flat import flatten, unflatten_into


def server(
    compensation: str = "none", synchronous: bool = False, contributors: int = 1, momentum: float = 0.0
) -> ShardServer:
    master = [nn.Parameter(torch.zeros(3))]
    return ShardServer(
        master=master,
        optimizer=torch.optim.SGD(master, lr=0.5, momentum=momentum),
        peers={},
        contributors=contributors,
        synchronous=synchronous,
        compensation=None if synchronous else Compensation(compensation, momentum=momentum, workers=contributors),
    )


def test_async_updates_record_staleness() -> None:
    ps = server()
    ps.contribute(torch.ones(3), version=0)
    ps.contribute(torch.ones(3), version=0)  # computed on weights one update old
    version, weights, _ = ps.contribute(torch.ones(3), version=0)  # two updates old
    assert version == 3
    torch.testing.assert_close(weights, torch.full((3,), -1.5))
    assert ps.stats.staleness_summary() == {"mean": 1.0, "max": 2, "histogram": {"0": 1, "1": 1, "2": 1}}


def test_staleness_aware_rate_divides_by_the_staleness() -> None:
    ps = server("lr")
    ps.contribute(torch.ones(3), version=0)  # fresh: lr 0.5
    ps.contribute(torch.ones(3), version=0)  # staleness 1: lr 0.5
    _, weights, _ = ps.contribute(torch.ones(3), version=0)  # staleness 2: lr 0.25
    torch.testing.assert_close(weights, torch.full((3,), -1.25))


def test_momentum_compensation_steps_with_the_lowered_momentum() -> None:
    # Two workers: the estimate starts at staleness 1 and sees 0 → 0.5, then 1 → 2/3; the explicit
    # momentum is 0.9 − τ̄/(τ̄ + 1): 0.5667, then 0.5. Heavy ball (torch SGD): buf = μ·buf + g, w −= lr·buf.
    ps = server("momentum", contributors=2, momentum=0.9)
    _, weights, _ = ps.contribute(torch.ones(3), version=0)  # buf = g = 1
    torch.testing.assert_close(weights, torch.full((3,), -0.5))
    _, weights, _ = ps.contribute(torch.ones(3), version=0)  # staleness 1: buf = 0.5·1 + 1
    torch.testing.assert_close(weights, torch.full((3,), -0.5 - 0.5 * 1.5))
    assert ps.optimizer.param_groups[0]["momentum"] == pytest.approx(0.5)
    assert ps.compensation.summary()["mean_explicit_momentum"] == pytest.approx((0.9 - 1 / 3 + 0.5) / 2)


def test_no_compensation_keeps_the_requested_momentum() -> None:
    ps = server("none", contributors=2, momentum=0.9)
    ps.optimizer.param_groups[0]["momentum"] = 0.5  # as a checkpoint saved by a compensated run would hold
    for _ in range(3):
        ps.contribute(torch.ones(3), version=0)
    assert ps.optimizer.param_groups[0]["momentum"] == 0.9
    # buf: 1, 1.9, 2.71 → weights −0.5·(1 + 1.9 + 2.71)
    torch.testing.assert_close(ps.weights(), torch.full((3,), -0.5 * 5.61))


def test_synchronous_update_averages_all_contributions() -> None:
    ps = server(synchronous=True, contributors=1)
    _, weights, _ = ps.contribute(torch.tensor([2.0, 4.0, 6.0]), version=0)
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


def test_an_elastic_server_redoes_the_update_in_flight_with_the_survivors() -> None:
    """Workers 1 and 2 wait in an update of three when worker 3 is lost: the update is not made, both are told
    to redo it (and only once), and the update of the two survivors is their mean; below the minimum, no."""
    import threading

    import torch.distributed as dist

    from scaletrain.parallel.strategies.ps.losses import Redo
    from scaletrain.parallel.strategies.ps.membership import Members, membership_key
    from scaletrain.tensors.flat import views_of

    store = dist.HashStore()
    members = Members([1, 2, 3], minimum=2, store=store)
    master = [nn.Parameter(torch.zeros(3))]
    ps = ShardServer(
        master=master, optimizer=torch.optim.SGD(master, lr=0.5), peers={}, contributors=3, synchronous=True,
        members=members, timeout=30,
    )  # fmt: skip
    gradients = {1: torch.tensor([2.0, 0.0, 0.0]), 2: torch.tensor([0.0, 4.0, 0.0])}
    outcome: dict[int, object] = {}

    def push(peer: int) -> None:
        try:
            outcome[peer] = ps._apply(gradients[peer], views_of(gradients[peer], master), 0, peer=peer)
        except Redo:
            outcome[peer] = "redo"

    threads = [threading.Thread(target=push, args=(peer,)) for peer in (1, 2)]
    for thread in threads:
        thread.start()
    while ps._arrived < 2:  # both wait for the third gradient
        threading.Event().wait(0.01)
    with ps._condition:
        assert ps._dropped(3, "lost the connection to worker rank 3: it died or its machine went away")
        ps._condition.notify_all()
    for thread in threads:
        thread.join(30)
    assert outcome == {1: "redo", 2: "redo"} and ps.version == 0  # nothing applied of the step in flight
    record = json.loads(store.get(membership_key(1)))
    assert (record["members"], record["left"], ps.contributors) == ([1, 2], [{"rank": 3, "why": "died"}], 2)
    threads = [threading.Thread(target=push, args=(peer,)) for peer in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert ps.version == 1 and all(outcome[peer] != "redo" for peer in (1, 2))
    torch.testing.assert_close(ps.weights(), torch.tensor([-0.5, -1.0, 0.0]))  # 0.5 × the mean of the two
    [change] = members.changes
    assert (change["step"], change["steps_redone"], change["workers"]) == (0, 1, 2)
    with ps._condition:
        assert not ps._dropped(2, "no answer from worker rank 2 within 30 s: it stopped answering")  # 1 < minimum 2
