"""``--strategy diloco -S overlap_steps=K``: the outer exchange travels while each worker takes K more inner steps,
then lands on the new anchor plus what the worker trained since it left. Two real processes with a model the test
follows by hand (tests/jobs/diloco_overlap_job.py), with and without a resume while an exchange is in flight; real
LeNet runs whose replicas end equal and whose resumed run ends as the whole one; the estimator's hidden exchange;
what is not built is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from tests import helpers
from tests.helpers import free_ports, make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights
from tests.jobs import diloco_overlap_job as job

import scaletrain
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.refined import Terms
from scaletrain.parallel.strategies.allreduce import ring_allreduce_seconds
from scaletrain.parallel.strategies.diloco import outer_step_seconds

pytestmark = pytest.mark.multiprocess

COMMON = {"batch_size": 16, "lr": 0.05, "momentum": 0.9, "seed": 4, "threads": 1, "progress": "off"}
COMMON |= {"tensorboard": False, "workers": 2, "strategy": "diloco", "sync_every": 4}
CUT = 4  # one inner step after the exchange of step 3 left, one before it lands


def by_hand(cut: int) -> tuple[list[list[dict]], list[dict], int]:
    """The job's run followed by hand: each rank's weights and buffer after every step, at the end, the outer steps."""
    every, overlap, rate = job.OPTIONS["sync_every"], job.OPTIONS["overlap_steps"], job.OPTIONS["outer_lr"]
    weight = [torch.zeros(3), torch.zeros(3)]
    statistic = [torch.zeros(2), torch.zeros(2)]
    anchor, left, outer, last = torch.zeros(3), None, 0, 0
    traces: list[list[dict]] = [[], []]

    def land() -> None:
        nonlocal anchor, left, outer
        _, sent, sent_statistic, change, mean_statistic = left
        anchor = anchor - rate * change
        for rank in range(2):
            weight[rank] = anchor + (weight[rank] - sent[rank])
            statistic[rank] = mean_statistic + (statistic[rank] - sent_statistic[rank])
        left, outer = None, outer + 1

    for step in range(1, job.STEPS + 1):
        for rank in range(2):
            statistic[rank] = statistic[rank] + rank + 1
        if step == cut:
            statistic = [(statistic[0] + statistic[1]) / 2] * 2
        for rank in range(2):
            weight[rank] = weight[rank] - job.gradient(rank, step)
        if left is not None and step - left[0] >= overlap:
            land()
        if step % every == 0:
            change = ((anchor - weight[0]) + (anchor - weight[1])) / 2
            left = (step, list(weight), list(statistic), change, (statistic[0] + statistic[1]) / 2)
            last = step
        for rank in range(2):
            traces[rank].append({"weight": weight[rank].tolist(), "statistic": statistic[rank].tolist()})
    if left is not None:  # the run's end: what is in flight lands, then one more outer step over the rest
        land()
    if last != job.STEPS:
        anchor = anchor - rate * ((anchor - weight[0]) + (anchor - weight[1])) / 2
        weight = [anchor, anchor]
        statistic = [(statistic[0] + statistic[1]) / 2] * 2
        outer += 1
    final = [{"weight": weight[rank].tolist(), "statistic": statistic[rank].tolist()} for rank in range(2)]
    return traces, final, outer


@pytest.mark.parametrize("resume", [False, True], ids=["whole", "resumed-in-flight"])
def test_each_exchange_lands_k_steps_after_it_left_on_what_the_worker_trained_since(
    tmp_path: Path, resume: bool
) -> None:
    port = free_ports(1)[0]
    variables = [
        {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        for rank in range(2)
    ]
    helpers.run_job(job.__name__, [str(tmp_path), str(CUT), "1" if resume else "0"], variables, out=tmp_path / "j")
    traces, final, outer = by_hand(CUT)
    payload = 4 * 3 + 4 * 2  # the change, then the buffer, in float32
    for rank in range(2):
        record = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        for step, (got, wanted) in enumerate(zip(record["trace"], traces[rank], strict=True), 1):
            for key in ("weight", "statistic"):
                assert got[key] == pytest.approx(wanted[key], abs=1e-6), (rank, step, key)
        for key in ("weight", "statistic"):
            assert record["final"][key] == pytest.approx(final[rank][key], abs=1e-6), (rank, key)
        assert record["outer_steps"] == outer == 3
        assert record["sent_bytes"] == [0, 0, payload, 0, 0, payload, 0]
    assert final[0] == final[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("overlap") / "fmnist", train=192, test=32)


def test_a_run_stopped_with_an_exchange_in_flight_resumes_to_the_uninterrupted_weights(
    data: Path, tmp_path: Path
) -> None:
    """LeNet, 6 join steps an epoch, H = 4, K = 2: exchanges leave at 4, 8 and 12 and land at 6 and 10 (the last at
    the run's end); a run cut at step 5, between the first's leaving and landing, resumes to the whole run."""
    settings = {**COMMON, "epochs": 2, "strategy_options": {"overlap_steps": 2}}
    whole = scaletrain.train("lenet", data_dir=data, out=tmp_path / "whole", **settings)
    assert whole["outer_steps"] == 3 and whole["steps"] == 12
    assert whole["strategy_options"]["overlap_steps"] == 2
    assert len({worker["weights_digest"] for worker in whole["per_worker"]}) == 1
    scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", steps=5, **settings)
    resumed = scaletrain.train("lenet", data_dir=data, out=tmp_path / "cut", resume=True, **settings)
    assert resumed["resumed_from_step"] == 5 and resumed["outer_steps"] == 3
    reference = weights(tmp_path / "whole")
    for name, tensor in weights(tmp_path / "cut").items():
        torch.testing.assert_close(tensor, reference[name], rtol=1e-5, atol=1e-6, msg=name)


def test_the_estimator_counts_only_the_exchange_k_inner_steps_do_not_hide() -> None:
    toy = Profile("toy", 8, t_grad=0.1, t_comm=0.04, t_update=0.002, latency=0.0, weight_bytes=10**6, bandwidth=1e6)
    two = np.array([2])
    plain = Terms(toy, None).using({"sync_every": 10}, sync="split")
    exchange = ring_allreduce_seconds(plain, two).item()
    inner = plain.gradient("split", two, probe="allreduce", meetings=np.array([0.1])).item() + toy.t_update
    assert exchange > 3 * inner  # a slow link: one inner step hides a part of it
    for overlap in (0, 1, 3):
        terms = Terms(toy, None).using({"sync_every": 10, "overlap_steps": overlap}, sync="split")
        hidden = max(exchange - overlap * inner, 0.0)
        assert outer_step_seconds(terms, two).item() == pytest.approx(toy.t_update + hidden / 10), overlap
    fast = Profile("toy", 8, t_grad=0.1, t_comm=0.04, t_update=0.002, latency=0.0, weight_bytes=10**6, bandwidth=1e9)
    hidden_whole = Terms(fast, None).using({"sync_every": 10, "overlap_steps": 1}, sync="split")
    assert outer_step_seconds(hidden_whole, two).item() == pytest.approx(fast.t_update)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-S", "overlap_steps=4"], "-S overlap_steps must be from 0 to --sync-every - 1 (3), got 4"),
        (["-S", "overlap_steps=-1"], "-S overlap_steps must be from 0 to --sync-every - 1 (3), got -1"),
        (["-S", "overlap_steps=2", "--min-workers", "1"], "-S overlap_steps does not work with --min-workers yet"),
        (["-S", "overlap_steps=2", "-S", "outer_exchange=sharded"], "does not work with -S outer_exchange=sharded"),
        (["-S", "overlap_steps=2", "--technique", "rebatch", "-T", "batch_size=8"], "does not work with --technique"),
        (["--overlap"], "drop --overlap; -S overlap_steps=K overlaps its outer exchange with K inner steps"),
    ],
)
def test_refusals_are_one_line_exit_2_and_write_nothing(flags: list[str], message: str, tmp_path: Path) -> None:
    done = run_cli(
        "train", "lenet", "--workers", "2", "--strategy", "diloco", "--sync-every", "4",
        "--out", str(tmp_path / "run"), *flags,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and message in done.stderr, done.stderr
    assert not (tmp_path / "run").exists()
