"""``scaletrain profile`` with real processes: t_grad, contention, and t_comm over gloo (and an emulated link)."""

from __future__ import annotations

import json
import os
import shutil
import statistics

import pytest
import torch

from scaletrain.errors import ConfigError, DataError
from scaletrain.estimate.profile import Profile
from scaletrain.measure.probe import time_gradient
from scaletrain.measure.profile import ProfileConfig, ProfileError, run_profile
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.workloads import create_workload

pytestmark = [pytest.mark.multiprocess]

LENET_FLOATS = 431_080


@pytest.mark.alone  #
def test_profile_measures_every_input_and_round_trips_through_json(tiny_fmnist, tmp_path):
    out = tmp_path / "profile.json"
    config = ProfileConfig(
        "lenet", batch_size=32, split_workers=(2,), concurrency=3, contention_counts=(3,), repeats=3, warmup=1,
        round_trips=3, launches=2, data_dir=tiny_fmnist, download=False, exchange_counts=(2,), exchanges=("allreduce",),
    )  # fmt: skip
    profile = run_profile(config, out=out)
    assert profile.weight_bytes == LENET_FLOATS * 4 == sum(profile.tensor_bytes)
    assert len(profile.tensor_bytes) == 8  # 4 layers × (weight, bias)
    assert profile.t_grad > 0 and profile.t_grad_parts[2] > 0 and profile.t_update > 0
    assert profile.t_grad_parts[2] < profile.t_grad  # half the batch is less work
    assert set(profile.contention) == {1, 3} and profile.contention[3] > 0  # only the count asked for
    assert set(profile.allreduce) == {2} and profile.central == {} == profile.sharded  # only the exchange asked for
    # its exchanges pooled over the 2 launches too (2 workers, 3 round trips each), the wait for the slowest beside
    assert len(profile.samples["exchange"]["allreduce"]["2"]) == 12 and set(profile.exchange_wait) == {"allreduce"}
    # the wait for the slower of two workers that compute the same batch on loopback: measured, and short
    assert 0 <= profile.exchange_wait["allreduce"][2] < 1.0
    assert 0 < profile.latency < profile.t_comm
    transfer = profile.t_comm - profile.latency if profile.t_comm > 2 * profile.latency else profile.t_comm
    assert profile.bytes_per_second == pytest.approx(profile.weight_bytes / transfer)
    # Gradient times pooled over two fresh processes of three timed rounds each.
    assert len(profile.samples["t_grad"]) == 6 and len(profile.samples["round_trip"]) == 3
    # and under contention every time taken: 2 launches × 3 processes × 3 rounds
    assert list(profile.samples["t_grad_contended"]) == ["3"] and len(profile.samples["t_grad_contended"]["3"]) == 18
    # the launches the samples were pooled over (the run-to-run noise of a range) and the machine that measured them
    assert profile.samples["launches"] == 2
    # the one-process reference: a real run of one process per launch, its seconds a batch (forward, backward, the
    # update and the run's own work for a fresh batch), their median what every speedup is over
    reference = profile.samples["reference"]
    assert len(reference) == 2 and profile.t_step == statistics.median(reference)
    assert all(profile.t_grad / 3 < seconds < 20 * (profile.t_grad + profile.t_update) for seconds in reference)
    assert profile.machine["isa"] == torch.backends.cpu.get_cpu_capability() and profile.machine["cpu_model"]
    assert Profile.load(out) == profile
    assert json.loads(out.read_text())["batch_size"] == 32


def test_the_exchanges_are_timed_among_the_workers_asked_for(tiny_fmnist, tmp_path):
    # Not alone: nothing here compares times, the exchanges only run among 3 real workers (and a server).
    config = ProfileConfig(
        "lenet", batch_size=32, concurrency=1, repeats=2, warmup=1, round_trips=3, launches=1, data_dir=tiny_fmnist,
        download=False, exchange_counts=(3,),
    )  # fmt: skip
    profile = run_profile(config, out=tmp_path / "profile.json")
    assert set(profile.allreduce) == {3} and profile.allreduce[3] > 0  # the all-reduce exchange among 3
    assert set(profile.central) == {3} and profile.central[3] > 0  # 3 workers and the central server
    assert set(profile.sharded) == {3} and profile.sharded[3] > 0  # 3 workers, each the owner of a shard
    # 3 workers pushing to the asynchronous central server as they please: at least a push and its reply each
    assert set(profile.central_async) == {3} and profile.central_async[3] > 2 * profile.latency
    # each exchange ran after a real gradient of the batch, timed too (LeNet has 8 tensors: every owner holds one)
    assert set(profile.exchange_compute) == {"allreduce", "central", "sharded", "central-async"}
    assert all(set(timed) == {3} and timed[3] > 0 for timed in profile.exchange_compute.values())
    # the parameter-server workers' waits are in their exchanges' seconds; the all-reduce's is timed apart
    assert {kind: timed[3] for kind, timed in profile.exchange_wait.items() if kind != "allreduce"} == dict.fromkeys(
        ("central", "sharded", "central-async"), 0.0
    )
    assert Profile.load(tmp_path / "profile.json") == profile


@pytest.mark.parametrize(
    ("wire", "options", "collective", "parts"),
    [
        ("powersgd", {"rank": "2", "start": "1000"}, ("all_reduce", 2), {"allreduce"}),
        ("topk", {"ratio": "0.01"}, ("all_gather", 2), {"allreduce", "compress", "decompress"}),
    ],
)
def test_a_compressing_codec_is_timed_as_it_compresses(tiny_fmnist, tmp_path, wire, options, collective, parts):
    # Not alone: nothing here compares times between processes.
    config = ProfileConfig(
        "lenet", batch_size=32, concurrency=1, repeats=2, warmup=1, round_trips=3, launches=1, data_dir=tiny_fmnist,
        download=False, exchange_counts=(2,), wire=wire, wire_options=options,
    )  # fmt: skip
    profile = run_profile(config, out=tmp_path / "profile.json")
    codec = WireCodec.of(wire, options=options)
    layout = TensorLayout.of(list(create_workload("lenet", {}).build_model().parameters()))
    assert profile.gradient_bytes == codec.steady_payload_bytes(layout) < LENET_FLOATS * 4 / 10
    assert (profile.collective, profile.collective_calls) == collective
    assert set(profile.codec_seconds) == parts and all(value > 0 for value in profile.codec_seconds.values())
    assert set(profile.allreduce) == {2} and profile.allreduce[2] > 0  # timed for a compressing codec too
    # a server cannot carry powersgd's factors: its exchange is not timed, top-k's is
    assert set(profile.central) == (set() if wire == "powersgd" else {2})
    assert Profile.load(tmp_path / "profile.json") == profile


def test_the_probes_time_a_codec_past_its_dense_start_with_its_options() -> None:
    from scaletrain.measure.probe import _codec

    codec = _codec({"wire": "powersgd", "wire_options": {"rank": "3", "start": "1000"}})
    assert (codec.rank, codec._steps) == (3, 1000)  # its next all-reduce factors, at rank 3


def test_missing_dataset_fails_before_any_process_starts(tmp_path):
    with pytest.raises(DataError, match="Fashion-MNIST"):
        run_profile(ProfileConfig("lenet", data_dir=tmp_path / "nothing", download=False))


def test_a_measurement_that_overruns_its_timeout_is_stopped(tiny_fmnist):
    with pytest.raises(ProfileError, match="longer than"):
        run_profile(ProfileConfig("lenet", data_dir=tiny_fmnist, download=False, timeout=0.05))


@pytest.mark.alone  #
@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="needs root and iproute2 (tc)")
def test_t_comm_across_an_emulated_link_follows_its_rate(tiny_fmnist):
    profile = run_profile(
        ProfileConfig(
            "lenet",
            batch_size=32,
            network="20mbit",
            concurrency=1,
            repeats=2,
            warmup=1,
            round_trips=2,
            launches=1,
            exchange_counts=(2,),
            exchanges=("allreduce",),  # the central one: 3.5 s a round here, 4 transfers (2.9 s) and 23 % more
            data_dir=tiny_fmnist,
            download=False,
        )
    )
    expected = LENET_FLOATS * 4 * 8 / 20e6 / 0.956  # TCP goodput is ~95.6 % of the link rate
    assert expected * 0.9 < profile.t_comm < expected * 1.4
    # Two ranks' all-reduce moves the whole buffer each way once (half in the reduce-scatter, half in
    # the all-gather, or all of it in one exchange): about one transfer's time across the link.
    assert expected * 0.9 < profile.allreduce[2] < expected * 1.6
    assert profile.central == {}  # not asked for
    assert profile.network == "20mbit"
    assert profile.bytes_per_second * 8 == pytest.approx(20e6, rel=0.2)


def test_contention_between_measured_counts_is_interpolated_and_beyond_them_grows_per_core() -> None:
    profile = Profile(workload="lenet", batch_size=8, t_grad=0.1, t_comm=0.01, contention={1: 1.0, 4: 1.3, 8: 1.7})
    assert profile.contention_at(4, cores=8) == 1.3
    assert profile.contention_at(6, cores=8) == pytest.approx(1.5)  # halfway from 4 to 8
    assert profile.contention_at(2, cores=8) == pytest.approx(1.1)  # a third of the way from 1 to 4
    assert profile.contention_at(16, cores=8) == pytest.approx(1.7 * 2)  # two processes per core


def test_contention_counts_below_two_are_refused_in_one_line() -> None:
    with pytest.raises(ConfigError, match="--contention-at counts must be ≥ 2"):
        ProfileConfig("lenet", contention_counts=(1, 4))
    with pytest.raises(ConfigError, match="--exchange-at counts must be ≥ 2"):
        ProfileConfig("lenet", exchange_counts=(1,))
    named = r"--exchanges takes allreduce, central, sharded, central-async \(comma-separated\), not ring"
    with pytest.raises(ConfigError, match=named):
        ProfileConfig("lenet", exchanges=("ring", "central"))


def test_every_timed_round_of_the_gradient_probe_computes_on_the_first_weights(tiny_fmnist):
    """One batch, stepped at a rate that would diverge: each timed round's loss is the same, the weights put back
    after every step (the LSTM's rate of 1 on one batch diverged after 4 steps and then computed 15-29 times slower)."""
    job = {
        "workload": "lenet", "options": {}, "threads": 1, "data_dir": str(tiny_fmnist), "download": False,
        "batch_size": 16, "parts": [1, 2], "warmup": 2, "repeats": 4, "lr": 10.0, "momentum": 0.9,
        "optimizer": "sgd", "optimizer_options": {}, "device": "cpu",
    }  # fmt: skip
    threads = torch.get_num_threads()
    try:
        result = time_gradient(job)
    finally:
        torch.set_num_threads(threads)
    losses = result["losses"]
    assert len(losses) == 4 and max(losses) - min(losses) <= 1e-6 * abs(losses[0])
    assert len(result["t_grad"]["1"]) == len(result["t_grad"]["2"]) == 4
