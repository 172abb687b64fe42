"""``--strategy diloco --min-workers``: a worker killed (SIGKILL) between two outer steps; the survivors find it
lost at the next outer step, drop its inner steps since the last one, do the step in flight again with their new
parts of the batch, average their own changes only, and finish the epoch with the rest of it cut over two. A worker
started mid-run (``--join``) is admitted after an outer step with the anchor and the outer optimizer's state, and
ends with the others' weights. An outer step interrupted by a lost peer leaves the worker as before its inner step.
The elastic all-reduce's workload and helpers (:mod:`tests.parallel.test_elastic`): the fault comes from inside the
victim at a chosen step, and every process records the samples it drew."""

from __future__ import annotations

import copy
import json
import math
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, make_fashion_mnist, model_weights, run_cli
from tests.parallel.test_elastic import BATCH, FAULTY, STEP, TRAIN, assert_every_sample_once, train_with_fault
from torch import nn

import scaletrain
from scaletrain.data.sampler import epoch_permutation
from scaletrain.parallel.strategies.diloco import DiLoCo, DiLoCoExchange
from scaletrain.parallel.strategies.elastic import request_key
from scaletrain.tensors.codec import WireCodec
from scaletrain.train.exchange import PeerLost
from scaletrain.train.state import Membership

pytestmark = pytest.mark.multiprocess

EVERY = 3  # outer steps after steps 3, 6, 9, 12; the victim dies at its 5th forward pass, between two of them


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("diloco-elastic") / "fmnist", train=TRAIN, test=32)


def test_the_survivors_drop_a_killed_workers_inner_steps_and_finish(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture
) -> None:
    victim, last_outer = 2, STEP - 1 - (STEP - 1) % EVERY  # 3: the steps (and batches) before it count for three
    settings = {"strategy": "diloco", "sync": "split", "sync_every": EVERY, "min_workers": 2, "timeout": 10}
    summary, samples = train_with_fault(data, tmp_path, monkeypatch, f"{victim}:{STEP}:SIGKILL", **settings)
    [change] = summary["membership"]
    assert change["left"] == [{"rank": victim, "why": "died"}]
    # found at the next outer step's all-reduce (step 6), whose inner step the survivors undid and did again
    in_flight = last_outer + EVERY
    assert (change["workers"], change["members"], change["step"], change["steps_redone"]) == (
        2,
        [0, 1],
        in_flight - 1,
        1,
    )
    assert (summary["steps"], summary["outer_steps"], summary["workers_at_end"]) == (TRAIN // BATCH, 4, 2)
    segments = summary["membership_segments"]
    assert [(s["workers"], s["steps"]) for s in segments] == [(3, in_flight - 1), (2, TRAIN // BATCH - in_flight)]
    assert f"step {in_flight}: worker rank {victim} (died) left; going on with 2 workers" in capfd.readouterr().err
    # the survivors' weights are the anchor at the end, and sane
    workers = {worker["rank"]: worker for worker in summary["per_worker"]}
    assert sorted(workers) == [0, 1] and len({worker["weights_digest"] for worker in workers.values()}) == 1
    assert all(torch.isfinite(tensor).all() for tensor in model_weights(tmp_path / "run").values())
    assert math.isfinite(summary["final_train_loss"]) and math.isfinite(summary["test_loss"])
    # Every sample of the epoch was trained once, but the victim's parts since the last outer step (batches 3 and
    # 4; it died drawing 4): three parts a batch before the change, two from its batch on; the parts of the step in
    # flight drawn by three were undone.
    records = [json.loads(line) for path in samples.glob("samples-*.jsonl") for line in path.read_text().splitlines()]
    dropped = [r for r in records if r["rank"] == victim and r["number"] >= last_outer]
    assert sorted(r["number"] for r in dropped) == list(range(last_outer, STEP))
    trained = [r for r in records if r not in dropped and r["count"] == (3 if r["number"] < in_flight - 1 else 2)]
    seen = sorted(index for record in trained for index in record["indices"])
    lost = {index for record in dropped for index in record["indices"]}
    epoch = epoch_permutation(TRAIN, seed=5, epoch=0)[: TRAIN // BATCH * BATCH].tolist()
    assert seen == sorted(index for index in epoch if index not in lost) and len(lost) == 2 * BATCH // 3


def test_a_worker_started_mid_run_joins_at_an_outer_step_with_the_anchor(
    data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two workers train; a third, started with ``--join`` in a process of its own, asks to join while rank 0
    holds its second step, is admitted after the outer step of step 3 and the three finish the epoch."""
    out, samples = tmp_path / "run", tmp_path / "samples"
    samples.mkdir()
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO / "src"), str(REPO)]))
    monkeypatch.setenv("SCALETRAIN_TEST_SAMPLES", str(samples))
    monkeypatch.setenv("SCALETRAIN_TEST_WAIT", f"0:2:store:{request_key(1)}")
    settings = {"epochs": 1, "momentum": 0.9, "threads": 1, "seed": 5, "batch_size": BATCH, "sync": "split"}
    settings |= {"strategy": "diloco", "sync_every": EVERY, "min_workers": 2, "max_workers": 3, "timeout": 30}
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in settings.items()]
    command = ["train", FAULTY, f"--data-dir={data}", f"--out={out}", "--workers=2", *flags, "--join"]
    joiners: list = []

    def join() -> None:  # once the run says where its store is
        deadline = time.monotonic() + 60
        while not (out / "rendezvous.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        joiners.append(run_cli(*command, env={"PYTHONPATH": os.environ["PYTHONPATH"]}, timeout=90))

    thread = threading.Thread(target=join)
    thread.start()
    try:
        summary = scaletrain.train(
            FAULTY, data_dir=data, out=out, workers=2, progress="plain", tensorboard=False, **settings
        )
    finally:
        thread.join()
    [run] = joiners
    assert run.returncode == 0, run.stderr
    [change] = summary["membership"]
    assert change["left"] == [] and [who["rank"] for who in change["joined"]] == [2]
    assert (change["step"], change["workers"], change["members"], change["steps_redone"]) == (EVERY, 3, [0, 1, 2], 0)
    assert (summary["steps"], summary["outer_steps"], summary["workers_at_end"]) == (TRAIN // BATCH, 4, 3)
    workers = {worker["rank"]: worker for worker in summary["per_worker"]}
    assert sorted(workers) == [0, 1, 2] and workers[2]["steps"] == TRAIN // BATCH - EVERY
    # the joiner's last outer step is the members': the same anchor (a joiner out of step would hang or differ)
    assert len({worker["weights_digest"] for worker in workers.values()}) == 1
    assert_every_sample_once(samples, summary["membership"], workers=2)


class _Members(Membership):
    """A membership whose peers are never said lost and nobody asks to join."""

    def peer_lost(self) -> bool:
        return False


def test_an_interrupted_outer_step_is_undone_and_the_next_averages_over_the_live_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    values = DiLoCo().option_values({"sync_every": "2", "outer_lr": "1", "outer_momentum": "0"})
    exchange = DiLoCoExchange(1, WireCodec(), values, membership=_Members())
    exchange.start(model, optimizer)
    exchange.resize(2)  # as after a regroup: the outer step is an all-reduce now

    def inner_step() -> None:
        optimizer.zero_grad()
        model(torch.ones(4, 3)).square().sum().backward()

    inner_step()
    exchange.step(model, optimizer, None)  # an inner step only
    before = [p.detach().clone() for p in model.parameters()]
    momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in model.parameters()]

    def fail(self: DiLoCoExchange, gradients: list, layout: object) -> None:
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(DiLoCoExchange, "_reduce", fail)
    inner_step()
    with pytest.raises(PeerLost) as lost:
        exchange.step(model, optimizer, None)
    assert lost.value.why == "died" and exchange.inner_steps == 1 and exchange.outer_steps == 0
    for parameter, weights, buffer in zip(model.parameters(), before, momentum, strict=True):
        assert torch.equal(parameter.detach(), weights) and torch.equal(
            optimizer.state[parameter]["momentum_buffer"], buffer
        )

    # done again among two live workers whose changes are equal: their mean, at rate 1, is this worker's weights
    def reduce_two(self: DiLoCoExchange, changes: list, layout: object) -> tuple[float, torch.Tensor]:
        return 0.0, 2 * torch.cat([change.reshape(-1) for change in changes])

    monkeypatch.setattr(DiLoCoExchange, "_reduce", reduce_two)
    stepped = copy.deepcopy((model, optimizer))  # the inner step by hand (a deep copy leaves the gradients out)
    for copied, parameter in zip(stepped[0].parameters(), model.parameters(), strict=True):
        copied.grad = parameter.grad.clone()
    stepped[1].step()
    exchange.step(model, optimizer, None)
    assert exchange.outer_steps == 1
    for parameter, expected in zip(model.parameters(), stepped[0].parameters(), strict=True):
        torch.testing.assert_close(parameter.detach(), expected.detach(), rtol=0, atol=1e-7)
