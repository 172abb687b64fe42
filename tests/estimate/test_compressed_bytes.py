"""The estimator sees a wire codec that compresses gradients: a profile's ``gradient_bytes`` (what
``scaletrain profile --wire powersgd|topk`` records from the codec's payload) is what the all-reduce and
the workers' pushes to a parameter server carry, while a server's replies stay the weights' bytes; a
codec that all-gathers (top-k) moves N−1 messages per worker; the codec's measured compute
(``codec_seconds``) is part of the step."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from scaletrain.estimate.profile import Profile
from scaletrain.parallel.strategies.allreduce import ring_allreduce_seconds
from scaletrain.parallel.strategies.ps.terms import central_exchange, sharded_exchange
from scaletrain.tensors.codec import TensorLayout, WireCodec

WEIGHTS = 10**6


def inputs(gradient_bytes: int | None, **codec: object) -> SimpleNamespace:
    profile = Profile(
        "toy",
        8,
        t_grad=0.1,
        t_comm=1.0,
        latency=0.001,
        bandwidth=1e6,
        weight_bytes=WEIGHTS,
        gradient_bytes=gradient_bytes,
        **codec,
    )
    return SimpleNamespace(profile=profile)


def test_the_all_reduce_carries_the_compressed_gradient() -> None:
    two = np.array([2])
    # 2 (N−1) latencies + 2 (N−1)/N · bytes / bandwidth, N = 2
    assert ring_allreduce_seconds(inputs(None), two)[0] == pytest.approx(0.002 + 1.0)
    assert ring_allreduce_seconds(inputs(WEIGHTS // 10), two)[0] == pytest.approx(0.002 + 0.1)


def test_a_central_server_receives_compressed_pushes_and_replies_with_the_weights() -> None:
    two = np.array([2])
    assert central_exchange(inputs(None), two)[0] == pytest.approx(2 * (0.001 + 2.0))
    assert central_exchange(inputs(WEIGHTS // 10), two)[0] == pytest.approx((0.001 + 0.2) + (0.001 + 2.0))


def test_a_profile_records_the_codecs_steady_bytes() -> None:
    """What measure/profile.py stores as gradient_bytes: PowerSGD's factored message (its dense first
    steps left out), top-k's kept values and indices; a cast's is the weights' own (stored as None)."""
    shapes = [(20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,)]  # LeNet
    layout = TensorLayout.of([torch.zeros(s) for s in shapes])
    powersgd = WireCodec.of("powersgd", options={"rank": "2", "start": "10"})
    matrices = [(20, 25), (50, 500), (500, 800), (10, 500)]
    vectors = 20 + 50 + 500 + 10
    assert powersgd.steady_payload_bytes(layout) == 4 * (vectors + sum(2 * (n + m) for n, m in matrices))
    assert powersgd.payload_bytes(layout) == 4 * layout.numel  # before its first step: dense
    topk = WireCodec.of("topk", options={"ratio": "0.01"})
    assert topk.steady_payload_bytes(layout) == 8 * math.ceil(0.01 * layout.numel)
    assert WireCodec.of("bf16").steady_payload_bytes(layout) == 2 * layout.numel


def test_an_all_gathering_codec_moves_every_other_workers_message() -> None:
    n = np.array([2, 8])
    size = WEIGHTS // 50
    summed = ring_allreduce_seconds(inputs(size), n)
    gathered = ring_allreduce_seconds(inputs(size, collective="all_gather", collective_calls=2), n)
    # a ring all-reduce: 2 (N−1) latencies and 2 (N−1)/N messages; all-gathers: N−1 of each per call
    assert summed.tolist() == pytest.approx([2 * 0.001 + 0.02, 14 * 0.001 + 1.75 * 0.02])
    assert gathered.tolist() == pytest.approx([2 * 0.001 + 0.02, 14 * 0.001 + 7 * 0.02])


def test_the_codecs_measured_compute_is_part_of_the_step() -> None:
    n = np.array([4])
    size, seconds = WEIGHTS // 50, {"allreduce": 0.03, "compress": 0.005, "decompress": 0.002}
    for collective, decoded in (("all_reduce", 0.0), ("all_gather", 3 * 0.002)):  # each of the 3 others' payloads
        bare = ring_allreduce_seconds(inputs(size, collective=collective), n)[0]
        timed = ring_allreduce_seconds(inputs(size, collective=collective, codec_seconds=seconds), n)[0]
        assert timed - bare == pytest.approx(0.03 + decoded)
    bare, timed = (central_exchange(inputs(size, **extra), n)[0] for extra in ({}, {"codec_seconds": seconds}))
    assert timed - bare == pytest.approx(0.005 + 4 * 0.002)  # one compress, the server decompresses 4 pushes
    # one sharded worker alone compresses and decompresses its own (whole) shard too: measured 4.9 ms a step
    # waiting where top-k's compress + decompress took 3.8 + 0.1 (results/validation/lenet-100mbit-topk)
    profile = Profile("toy", 8, t_grad=0.1, t_comm=1.0, bandwidth=1e6, weight_bytes=WEIGHTS, gradient_bytes=size,
                      tensor_bytes=(WEIGHTS // 2, WEIGHTS // 2), codec_seconds=seconds)  # fmt: skip
    one = sharded_exchange(SimpleNamespace(profile=profile, per_count=lambda _, n, f: [f(k) for k in n.tolist()]),
                           np.array([1]))  # fmt: skip
    assert one[0] == pytest.approx(0.005 + 0.002)


def test_an_asynchronous_worker_compresses_before_and_its_server_decompresses_after_each_push() -> None:
    from scaletrain.estimate.refined import predict

    size, seconds = WEIGHTS // 50, {"compress": 0.05, "decompress": 0.02}
    profile = inputs(size, codec_seconds=seconds).profile
    rate = predict(profile, strategy="ps", server="central", sync="async", workers=1).batches_per_second
    # one worker never queues: its cycle is gradient, latencies, compress, push, update, decompress, reply
    cycle = 0.1 + 2 * 0.001 + 0.05 + size / 1e6 + 0.0 + 0.02 + WEIGHTS / 1e6
    assert rate == pytest.approx(1 / cycle)
