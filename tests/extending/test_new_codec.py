"""A wire codec of one's own that changes the message's size and runs its own collective
(tests/extending/made_up_codec.py: scaled signs, one module and one registry line), loaded by
SCALETRAIN_PLUGINS into every process and trained for real under all-reduce and both parameter
servers: the message shrinks to what the codec promises and training still works."""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import scaletrain
from scaletrain.tensors.codec import CODECS, TensorLayout, WireMismatch
from tests.extending.made_up_codec import ScaledSign
from tests.helpers import REPO, make_fashion_mnist, run_cli

PLUGIN = "tests.extending.made_up_codec"
COMMON = {"progress": "off", "tensorboard": False, "threads": 1}
STEPS = 30


@pytest.fixture
def plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The processes a run starts import the codec too (this one already has: it is registered)."""
    monkeypatch.setenv("SCALETRAIN_PLUGINS", PLUGIN)
    monkeypatch.setenv("PYTHONPATH", f"{REPO / 'src'}:{REPO}")


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("codec") / "fmnist", train=1536, test=64)


def sign_bytes(values: int) -> int:
    """A scaled-sign message of ``values``: a float32 scale per 256 values and a bit per value."""
    return 4 * math.ceil(values / 256) + math.ceil(values / 8)


def test_one_registry_line_makes_a_codec_of_a_bit_and_an_eighth_a_value() -> None:
    assert CODECS["scaledsign"] is ScaledSign
    gradient = torch.randn(1000)
    layout = TensorLayout.of([gradient.view(10, 100)])
    codec = ScaledSign()
    payload, context = codec.compress(gradient, layout)
    spec = [(4, torch.float32), (125, torch.uint8)]  # a scale for each of 4 blocks, 1000 bits in 125 bytes
    assert [(p.numel(), p.dtype) for p in payload] == codec.payload_spec(layout) == spec
    assert codec.payload_bytes(layout) == sum(p.nbytes for p in payload) == sign_bytes(1000) == 141  # 4,000 / 28
    sent = codec.decompress(payload, context)
    assert torch.equal(sent > 0, gradient >= 0)  # every sign travels
    for start in (0, 256, 512, 768):  # as its block's mean magnitude (the last block: its 232 values')
        block = slice(start, start + 256)
        torch.testing.assert_close(sent[block].abs(), gradient[block].abs().mean().expand_as(sent[block]))


def test_a_payload_of_several_tensors_travels_as_one_message_and_must_be_what_the_codec_promised() -> None:
    gradient = torch.randn(100)
    layout = TensorLayout.of([gradient])
    codec = ScaledSign()
    payload, _ = codec.compress(gradient, layout)
    body = codec.to_message(payload, layout)
    assert body.dtype == torch.uint8 and body.nbytes == codec.payload_bytes(layout) == 4 + 13
    received = codec.message_buffer(layout, torch.zeros(100))
    received.copy_(body)
    assert all(torch.equal(a, b) for a, b in zip(codec.from_message(received, layout), payload, strict=True))
    with pytest.raises(WireMismatch, match="compressed into"):
        codec.to_message([payload[0], payload[1].long()], layout)


def test_error_feedback_sends_what_was_left_out_later() -> None:
    torch.manual_seed(0)
    gradients = [torch.randn(512) for _ in range(64)]
    truth = torch.stack(gradients).sum(0)
    layout = TensorLayout.of([gradients[0]])
    totals = {}
    for feedback in (False, True):
        codec = ScaledSign(error_feedback=feedback)
        totals[feedback] = sum(codec.decompress(*codec.compress(g, layout, stream="s")) for g in gradients)
    # without feedback every message's error stays in the sum; with it, only what is still carried
    # (measured: 108.4 against 18.1)
    assert (totals[True] - truth).norm() < 0.25 * (totals[False] - truth).norm()


def test_the_command_offers_the_plugin_codec() -> None:
    env = {"SCALETRAIN_PLUGINS": PLUGIN, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    result = run_cli("train", "--help", env=env)
    assert result.returncode == 0, result.stderr
    assert "scaledsign" in result.stdout
    assert "scaledsign" not in run_cli("train", "--help").stdout


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["allreduce-join", "ps-central-join", "ps-sharded-join"])
def test_a_size_changing_codec_trains_two_workers_and_sends_a_twenty_eighth_of_the_bytes(
    strategy: str, data: Path, plugin: None, tmp_path: Path
) -> None:
    settings = dict(data_dir=data, steps=STEPS, batch_size=16, momentum=0.9, seed=5, workers=2, strategy=strategy)
    signs = scaletrain.train(
        "lenet", out=tmp_path / "signs", wire="scaledsign", error_feedback=True, **settings, **COMMON
    )
    fp32 = scaletrain.train("lenet", out=tmp_path / "fp32", **settings, **COMMON)
    assert signs["wire"] == "scaledsign" and signs["steps"] == fp32["steps"] == STEPS

    # What the float32 wire sends per step: the whole gradient (4 bytes a value), to the other owner only
    # when the server is sharded; scaled signs send a bit a value and 4 bytes per 256 values of the same.
    full = [w["gradient_bytes_sent"] / STEPS for w in fp32["per_worker"]]
    sent = [w["gradient_bytes_sent"] / STEPS for w in signs["per_worker"]]
    if strategy == "ps-sharded-join":
        assert sum(full) == 4 * fp32["parameters"] and all(0 < f < 4 * fp32["parameters"] for f in full)
    else:
        assert full == [4 * fp32["parameters"]] * 2
    assert sent == [sign_bytes(int(f) // 4) for f in full]
    assert all(s < f / 28 for s, f in zip(sent, full, strict=True))

    # training still works: every worker's loss falls, and the workers hold the same weights
    for summary in (signs, fp32):
        workers = summary["per_worker"]
        assert all(w["last_step_loss"] < 0.5 * w["first_step_loss"] for w in workers), workers
        assert len({w["weights_digest"] for w in workers}) == 1
    assert signs["test_accuracy"] >= fp32["test_accuracy"] - 0.1
    assert signs["per_worker"][0]["weights_digest"] != fp32["per_worker"][0]["weights_digest"]


REFUSAL_JOB = """
import datetime, os, sys
import torch, torch.distributed as dist
from torch import nn
from scaletrain.errors import ScaletrainError
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.protocol import pair_groups
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.tensors.codec import WireCodec
from tests.extending.made_up_codec import ScaledSign

rank, port = int(sys.argv[1]), int(sys.argv[2])
timeout = datetime.timedelta(seconds=30)
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timeout)
group = pair_groups(2, [(0, 1)], timeout=30)[(0, 1)]
model = nn.Linear(4, 2)
try:
    if rank == 0:  # the owner: the float32 wire
        master = [nn.Parameter(p.detach().clone()) for p in model.parameters()]
        server = ShardServer(master=master, optimizer=torch.optim.SGD(master, lr=0.1), peers={1: group},
                             contributors=1, synchronous=True, timeout=30, codec=WireCodec())
        server.start()
        server.join(60)
    else:  # the worker: scaled signs
        exchange = PSExchange(
            rank=1, plan=lambda parameters: [0] * len(parameters), groups={0: group}, codec=ScaledSign()
        )
        exchange.start(model, torch.optim.SGD(model.parameters(), lr=0.1))
    print("no error")
except ScaletrainError as exc:
    print(f"{type(exc).__name__}: {exc}")
sys.stdout.flush()
os._exit(0)
"""


@pytest.mark.multiprocess
def test_a_worker_and_a_server_of_different_codecs_stop_naming_both_before_a_gradient_travels(tmp_path: Path) -> None:
    """Every request and reply header carries the bytes of a gradient message of its sender's codec: a
    scaled-sign worker (6 bytes for the 10 values of a Linear(4, 2)) and a float32 owner (40 bytes) both stop
    at the first reply with both sizes named, instead of mis-reading a payload or hanging."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", REFUSAL_JOB, str(rank), str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    server, worker = (process.communicate(timeout=120) for process in processes)
    assert server[0].strip() == (
        "WireMismatch: worker rank 1 encodes a gradient of layout #2020ff89 (10 elements) in 6 bytes but its "
        "server's wire codec 'fp32' in 40; every process must use the same wire codec"
    ), server
    assert worker[0].strip() == (
        "WireMismatch: worker rank 1's wire codec 'scaledsign' encodes a gradient of layout #2020ff89 (10 elements) "
        "in 6 bytes but the server at rank 0's in 40; every process must use the same wire codec"
    ), worker
