"""PowerSGD and top-k (scaletrain.tensors.powersgd, scaletrain.tensors.topk) through their own collectives
on a real 2-process gloo group (tests/jobs/compression_job.py), then in 2-worker training runs: full rank and ratio 1
equal the dense all-reduce, error feedback keeps the accumulated sent sum within what is still carried of
the accumulated true sum, every worker gets the same sum, and bad options are one line before any process
starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO
from tests.jobs import compression_job as job

from scaletrain.tensors.codec import TensorLayout, WireCodec

pytestmark = pytest.mark.multiprocess


@pytest.fixture(scope="module")
def computed(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What each of the two processes got back, per case of compression_job.cases()."""
    out = tmp_path_factory.mktemp("compression")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    running = [
        subprocess.Popen(
            [sys.executable, str(Path(job.__file__)), str(rank), str(port), str(out)],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    errors = [process.communicate(timeout=120)[1] for process in running]
    assert [p.returncode for p in running] == [0, 0], errors
    return [torch.load(out / f"rank-{rank}.pt", weights_only=False) for rank in (0, 1)]


@pytest.mark.parametrize("name", list(job.cases()))
def test_every_worker_gets_the_same_sum(computed: list[dict], name: str) -> None:
    assert torch.equal(computed[0][name]["sent"], computed[1][name]["sent"])


def test_powersgd_at_full_rank_is_the_dense_all_reduce(computed: list[dict]) -> None:
    """Rank 6 ≥ both matrices' widths (4 and 5): P Pᵀ projects onto the whole column space; only
    float32 rounding of the QR and the products remains (measured: 1.9·10⁻⁶ at most, on sums of norm 25)."""
    case = computed[0]["powersgd-full-rank"]
    torch.testing.assert_close(case["sent"], case["dense"], rtol=0, atol=1e-5)
    assert case["bytes"] == 4 * (6 + (6 * 4 + 4 * 4) + (5 * 5 + 12 * 5))  # the bias, then P and Q of each


def test_topk_with_ratio_one_is_the_dense_all_reduce(computed: list[dict]) -> None:
    case = computed[0]["topk-ratio1"]
    assert torch.equal(case["sent"], case["dense"])
    assert case["bytes"] == 8 * sum(s.numel() for s in job.SHAPES)


def test_powersgd_sends_dense_until_it_starts_then_the_factors(computed: list[dict]) -> None:
    case = computed[0]["powersgd-cold-start"]  # start=2, rank 1, warm start off
    assert torch.equal(case["sent"][:2], case["dense"][:2])
    assert not torch.allclose(case["sent"][2:], case["dense"][2:], atol=1e-3)
    assert case["bytes"] == 4 * (6 + 6 + 5 + 4 + 12)  # the bias and both Ps, then both Qs


@pytest.mark.parametrize("codec", ["powersgd-rank1", "topk-tenth"])
def test_error_feedback_keeps_the_accumulated_sum_within_what_is_carried(computed: list[dict], codec: str) -> None:
    """After 40 steps of gradients that share a drift, the sum of what was sent differs from the sum of
    the true gradients by exactly what the two workers still carry (Σ sent = Σ true − Σ residuals), which
    stays below 3 single steps' sums (measured: 2.5 for PowerSGD rank 1, 2.6 for top-k 10 %); without
    feedback the loss grows with the steps (measured: 21× and 19× one step's sum), and with it is below a
    fifth of that."""
    feedback = computed[0][f"{codec}-feedback"]
    true_sum, sent_sum = feedback["dense"].sum(0), feedback["sent"].sum(0)
    carried = computed[0][f"{codec}-feedback"]["carried"] + computed[1][f"{codec}-feedback"]["carried"]
    torch.testing.assert_close(sent_sum, true_sum - carried, rtol=0, atol=1e-3)
    one_step = feedback["dense"][0].norm()
    assert (sent_sum - true_sum).norm() < 3 * one_step
    plain = computed[0][f"{codec}-plain"]
    lost_for_good = (plain["sent"].sum(0) - plain["dense"].sum(0)).norm()
    assert lost_for_good > 10 * one_step
    assert (sent_sum - true_sum).norm() < 0.2 * lost_for_good


def test_a_vector_and_a_narrow_matrix_go_dense() -> None:
    from scaletrain.tensors.powersgd import PowerSGD

    codec = PowerSGD(rank=4)
    layout = TensorLayout.of([torch.zeros(100, 3), torch.zeros(64, 64), torch.zeros(64)])
    codec._steps = 1
    # 100 × 3 at rank 3 would send 309 values for 300; 64 × 64 at rank 4 sends 512 for 4,096
    assert codec.payload_spec(layout) == [(300 + 64 * 4 + 64, torch.float32), (64 * 4, torch.float32)]


def test_a_codec_takes_only_its_own_saved_state() -> None:
    """What a worker saves beside a checkpoint; a run resumed with another ``--wire`` starts afresh."""
    from scaletrain.tensors.powersgd import PowerSGD
    from scaletrain.tensors.topk import TopK

    layout = TensorLayout.of([torch.zeros(8)])
    topk = TopK(error_feedback=True, ratio=0.25)
    topk.compress(torch.arange(8.0), layout, stream=1)
    state = topk.state_dict()
    again = TopK(error_feedback=True, ratio=0.25)
    assert again.load_state_dict(state) and torch.equal(again._residuals[1], torch.tensor([0, 1, 2, 3, 4, 5, 0, 0.0]))
    other = PowerSGD(error_feedback=True)
    assert not other.load_state_dict(state) and other._residuals == {}


def test_the_compressing_codecs_carry_error_feedback_without_being_asked() -> None:
    assert WireCodec.of("powersgd").error_feedback and WireCodec.of("topk", options={"ratio": "0.5"}).error_feedback
    assert not WireCodec.of("bf16").error_feedback and WireCodec.of("bf16", error_feedback=True).error_feedback
