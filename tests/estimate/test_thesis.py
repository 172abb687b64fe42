"""Every formula of SPEC §2 against values computed by hand (t_grad 0.8 s, t_comm 0.2 s, N 4, D 128)."""

from __future__ import annotations

import pytest

from scaletrain.errors import ConfigError
from scaletrain.estimate.thesis import speedup, speedups, train_time

T_GRAD, T_COMM, N, D = 0.8, 0.2, 4, 128
SEQUENTIAL = D * T_GRAD  # 102.4 s (eq. 4.23's numerator)

# (type, server, case, t_train by hand)
HAND = [
    # sync-join: I = D/N = 32 iterations of t_grad 0.8
    ("sync-join", "central", "best", 32 * (5 * 0.2 + 0.8)),  # (N+1)·t_comm + t_grad = 1.8
    ("sync-join", "central", "worst", 32 * (8 * 0.2 + 0.8)),  # 2N·t_comm + t_grad = 2.4
    ("sync-join", "central", "mean", 32 * 2.1),  # (1.8 + 2.4) / 2
    ("sync-join", "distributed", "mean", 32 * (2 * 0.2 * 3 / 4 + 0.8)),  # 1.1
    # sync-split: I = D = 128 iterations of t_grad/N = 0.2
    ("sync-split", "central", "best", 128 * (1.0 + 0.2)),
    ("sync-split", "central", "worst", 128 * (1.6 + 0.2)),
    ("sync-split", "central", "mean", 128 * 1.5),
    ("sync-split", "distributed", "mean", 128 * (0.3 + 0.2)),
    # async: each worker trains D/N = 32 batches
    ("async", "central", "best", max(129 * 0.2 + 0.8, 3 * 0.2 + 32 * (0.4 + 0.8))),  # max(26.6, 39.0)
    ("async", "central", "worst", 32 * (8 * 0.2 + 0.8)),  # 76.8
    ("async", "central", "mean", (39.0 + 76.8) / 2),
    ("async", "distributed", "mean", 32 * (0.3 + 0.8)),
]


@pytest.mark.parametrize(("kind", "server", "case", "expected"), HAND)
def test_train_time_and_speedup_match_hand_computation(kind, server, case, expected):
    got = train_time(t_grad=T_GRAD, t_comm=T_COMM, kind=kind, server=server, workers=N, batches=D, case=case)
    assert got == pytest.approx(expected)
    s = speedup(t_grad=T_GRAD, t_comm=T_COMM, kind=kind, server=server, workers=N, batches=D, case=case)
    assert s == pytest.approx(SEQUENTIAL / expected)


def test_hand_values_spelled_out():
    """A few of the above as plain numbers, so a mistake in the table above cannot hide one in the code."""
    assert speedup(t_grad=0.8, t_comm=0.2, kind="sync-join", server="central", workers=4, batches=128) == (
        pytest.approx(102.4 / 67.2)
    )
    assert speedup(t_grad=0.8, t_comm=0.2, kind="sync-split", server="distributed", workers=4, batches=128) == (
        pytest.approx(1.6)
    )
    assert speedup(t_grad=0.8, t_comm=0.2, kind="async", server="central", workers=4, batches=128, case="best") == (
        pytest.approx(102.4 / 39.0)
    )


def test_async_central_best_case_server_bound():
    """When transfers dominate, the server's (D+1)·t_comm + t_grad term (4.14) is the larger one."""
    t = train_time(t_grad=0.1, t_comm=1.0, kind="async", server="central", workers=4, batches=8, case="best")
    assert t == pytest.approx(9 * 1.0 + 0.1)  # vs (N−1) + 2·2.1 = 7.2


def test_one_worker_cases_and_sharded_alias():
    # One worker with a central server transfers twice per batch: t_grad / (2·t_comm + t_grad).
    for case in ("best", "worst", "mean"):
        s = speedup(t_grad=0.8, t_comm=0.2, kind="sync-join", server="central", workers=1, batches=10, case=case)
        assert s == pytest.approx(0.8 / 1.2)
    # A distributed server with one worker transfers nothing: speedup exactly 1.
    assert speedup(t_grad=0.8, t_comm=0.2, kind="async", server="sharded", workers=1, batches=10) == 1.0


def test_speedups_lists_one_to_n():
    values = speedups(t_grad=T_GRAD, t_comm=T_COMM, kind="sync-join", server="distributed", workers=3, batches=D)
    assert len(values) == 3
    assert values[0] == pytest.approx(1.0)
    assert values[1] == pytest.approx(2 * 0.8 / (0.2 + 0.8))  # I = D/2, t_iter = 2·0.2·1/2 + 0.8
    assert values[2] == pytest.approx(3 * 0.8 / (2 * 0.2 * 2 / 3 + 0.8))


def test_thesis_table_6_1_vgg16e_never_beats_one_worker():
    """003 §6.3: with t_comm 5.153 s ≫ t_grad 0.719 s, VGG16E is never faster on more workers."""
    for kind in ("sync-join", "async"):
        values = speedups(t_grad=0.719, t_comm=5.153, kind=kind, server="central", workers=8, batches=128)
        assert max(values) < 1


@pytest.mark.parametrize(
    ("settings", "fragment"),
    [
        ({"kind": "sync"}, "--type"),
        ({"server": "ring"}, "--server"),
        ({"case": "typical"}, "--case"),
        ({"workers": 0}, "--workers"),
        ({"batches": 0}, "--batches"),
        ({"t_grad": 0}, "--t-grad"),
    ],
)
def test_bad_input_names_the_flag(settings, fragment):
    given = {"t_grad": 1.0, "t_comm": 0.1, "kind": "async", "server": "central", "workers": 2, "batches": 8}
    with pytest.raises(ConfigError, match=fragment):
        train_time(**{**given, **settings})
