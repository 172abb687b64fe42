"""The refined model's ``--overlap``: backward hides the exchange where the exchange's thread has a core to
itself, never more than all but the last bucket; on a machine whose cores the workers' threads fill it
hides nothing (as measured on 2 cores); a profile keeps the overlap and the measured backward time."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from scaletrain.estimate.profile import Profile
from scaletrain.estimate.refined import predict, step_split

#: 1 MB of weights over 50 Mbit/s: the exchange is 0.32 s a step against a 0.1 s gradient
DENSE = Profile("toy", 64, t_grad=0.1, t_comm=0.16, t_backward=0.06, latency=1e-4, bandwidth=6.25e6,
                weight_bytes=10**6, parameters=250_000, tensor_bytes=(4 * 10**5, 4 * 10**5, 2 * 10**5))  # fmt: skip
OVERLAPPED = dataclasses.replace(DENSE, overlap_bucket_bytes=3 * 10**5)


def test_backward_hides_its_own_time_of_the_exchange_given_a_spare_core() -> None:
    plain = step_split(DENSE, strategy="allreduce", sync="join", workers=2)
    hidden = step_split(OVERLAPPED, strategy="allreduce", sync="join", workers=2)
    assert plain is not None and hidden is not None
    assert hidden["compute"] == plain["compute"] == pytest.approx(0.1)
    # backward is 0.06 of the 0.1 s gradient: that much of the exchange is hidden, no more
    assert hidden["exchange"] == pytest.approx(plain["exchange"] - 0.06)
    fast = predict(OVERLAPPED, strategy="allreduce", sync="join", workers=2).speedup
    assert fast > predict(DENSE, strategy="allreduce", sync="join", workers=2).speedup


def test_a_small_exchange_still_waits_for_the_last_bucket() -> None:
    """An exchange shorter than backward: the last bucket (the first layer's 0.4 MB of 1 MB) still follows it."""
    quick = dataclasses.replace(OVERLAPPED, bandwidth=6.25e8, latency=0.0)
    plain = step_split(dataclasses.replace(quick, overlap_bucket_bytes=None), strategy="allreduce", sync="join",
                       workers=2)  # fmt: skip
    hidden = step_split(quick, strategy="allreduce", sync="join", workers=2)
    assert plain is not None and hidden is not None
    assert hidden["exchange"] == pytest.approx(0.4 * plain["exchange"])


def test_nothing_is_hidden_where_the_workers_fill_the_cores() -> None:
    for workers, cores in ((2, 2), (4, 2)):
        plain = predict(DENSE, strategy="allreduce", sync="split", workers=workers, cores=cores)
        shared = predict(OVERLAPPED, strategy="allreduce", sync="split", workers=workers, cores=cores)
        assert shared.speedup == pytest.approx(plain.speedup)
    spare = predict(OVERLAPPED, strategy="allreduce", sync="split", workers=2, cores=4)
    assert spare.speedup > predict(DENSE, strategy="allreduce", sync="split", workers=2, cores=4).speedup


def test_the_servers_exchange_is_not_overlapped() -> None:
    for sync in ("join", "split"):
        assert predict(OVERLAPPED, strategy="ps", server="central", sync=sync, workers=2).speedup == pytest.approx(
            predict(DENSE, strategy="ps", server="central", sync=sync, workers=2).speedup
        )


def test_a_profile_keeps_the_overlap_and_the_backward_time(tmp_path: Path) -> None:
    path = OVERLAPPED.save(tmp_path / "p.json")
    loaded = Profile.load(path)
    assert (loaded.overlap_bucket_bytes, loaded.t_backward) == (3 * 10**5, 0.06)
    assert OVERLAPPED.default_path().name == "toy-b64-overlap.json"
    assert DENSE.default_path().name == "toy-b64.json"


def test_a_profile_of_overlapped_runs_refuses_a_bucket_of_nothing() -> None:
    from scaletrain.errors import ConfigError
    from scaletrain.measure.profile import ProfileConfig

    with pytest.raises(ConfigError, match=r"--bucket-mb must be a number of MiB > 0, e\.g\. --bucket-mb 0\.25; got 0"):
        ProfileConfig("lenet", overlap_bucket_mb=0.0)
    assert ProfileConfig("lenet", overlap_bucket_mb=0.5).overlap_bucket_mb == 0.5
