"""Synchronised batch norm (scaletrain.efficient.sync_batchnorm): two processes of a real gloo group, each
with some rows of a batch, compute what one batch norm computes over the whole batch (output, input
gradient, the sums of their weight and bias gradients, running statistics after two passes); evaluation
and a pass outside ``synchronised`` do not communicate; the layers keep the state-dict keys and survive
the surgery; bad settings are one line."""

from __future__ import annotations

import copy
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from tests.helpers import REPO, run_cli
from tests.jobs import sync_batchnorm_job as job
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.efficient import Reconfiguration
from scaletrain.efficient.surgery import reconfigure
from scaletrain.efficient.sync_batchnorm import SyncedBatchNorm2d, sync_batch_norm, synchronised
from scaletrain.errors import ConfigError
from scaletrain.measure.sweep import SweepConfig, plan_runs, run_settings

CASES = list(job.cases())


@pytest.fixture(scope="module")
def computed(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """What each of the two processes computed (tests/jobs/sync_batchnorm_job.py)."""
    out = tmp_path_factory.mktemp("sync-batchnorm")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    command = [sys.executable, str(Path(job.__file__)), "{rank}", str(port), str(out)]
    running = [
        subprocess.Popen([part.format(rank=rank) for part in command], env=env, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    errors = [process.communicate(timeout=120)[1] for process in running]
    assert [p.returncode for p in running] == [0, 0], errors
    return [torch.load(out / f"rank-{rank}.pt", weights_only=False) for rank in (0, 1)]


def one_process(name: str) -> dict:
    """The plain batch norm over the whole batch: the same two passes and the same upstream gradient."""
    module, inputs, upstream = job.cases()[name]
    whole = inputs.clone().requires_grad_(True)
    output = module(whole)
    (output * upstream).sum().backward()
    module(inputs * 0.5 - 1.0)
    return {"module": module, "output": output.detach(), "input_grad": whole.grad, "inputs": inputs}


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", CASES)
def test_two_processes_compute_what_one_computes_over_the_whole_batch(computed: list[dict], name: str) -> None:
    reference = one_process(name)
    for rank, result in enumerate(computed):
        part = result[name]
        rows = job.rows(rank)
        torch.testing.assert_close(part["output"], reference["output"][rows], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(part["input_grad"], reference["input_grad"][rows], rtol=1e-4, atol=1e-5)
        for key, value in reference["module"].state_dict().items():  # running statistics and the counter
            torch.testing.assert_close(part[key], value, rtol=1e-6, atol=1e-6, msg=key)
        if part["channels_last"] is not None:
            assert part["channels_last"], "the output keeps the input's layout"
    module = reference["module"]
    if module.affine:  # each process's own sums; the gradient exchange adds them up
        for which, parameter in (("weight_grad", module.weight), ("bias_grad", module.bias)):
            total = computed[0][name][which] + computed[1][name][which]
            torch.testing.assert_close(total, parameter.grad, rtol=1e-4, atol=1e-5)


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", CASES)
def test_evaluation_and_a_pass_outside_the_block_are_plain_batch_norm(computed: list[dict], name: str) -> None:
    """Run on rank 0 after rank 1 left the group: a collective would have failed."""
    part = computed[0][name]
    reference = one_process(name)
    module, inputs = reference["module"], reference["inputs"]
    module.eval()
    torch.testing.assert_close(part["evaluation"], module(inputs), rtol=1e-6, atol=1e-6)
    module.train()
    torch.testing.assert_close(part["alone"], module(inputs[job.rows(0)]), rtol=1e-5, atol=1e-5)
    for key, value in module.state_dict().items():
        torch.testing.assert_close(part["after_alone"][key], value, rtol=1e-6, atol=1e-6, msg=key)


def test_the_layers_keep_their_state_dict_and_survive_surgery() -> None:
    net = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1), nn.BatchNorm2d(2))
    keys = list(net.state_dict())
    assert sync_batch_norm(net) == 2 and list(net.state_dict()) == keys
    assert isinstance(net[1], nn.BatchNorm2d) and isinstance(net[1], SyncedBatchNorm2d)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    decision = Reconfiguration(keep={"0": {"out": [0, 2]}, "1": {"out": [0, 2]}, "3": {"in": [0, 2]}})
    reconfigure(net, optimizer, decision, lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    assert isinstance(net[1], SyncedBatchNorm2d) and net[1].num_features == 2
    assert list(net.state_dict()) == keys
    plain = nn.BatchNorm2d(2)
    plain.load_state_dict(net[1].state_dict())  # a checkpoint of the synchronised layer loads into plain batch norm
    inputs = torch.randn(4, 2, 3, 3)
    net.eval()
    expected = F.batch_norm(inputs, plain.running_mean, plain.running_var, plain.weight, plain.bias)
    torch.testing.assert_close(net[1](inputs), expected)


def test_a_network_without_batch_norm_one_worker_and_bad_combinations_are_refused() -> None:
    with pytest.raises(ConfigError, match="this network has no batch norm; leave the flag out"):
        sync_batch_norm(nn.Sequential(nn.Linear(2, 2)))
    with pytest.raises(ConfigError, match="asynchronous workers share none"):
        TrainConfig("resnet20", workers=2, strategy="ps", sync="async", sync_batchnorm=True)
    with pytest.raises(ConfigError, match="choose one"):
        TrainConfig("resnet20", workers=2, sync="split", ghost_batch=8, sync_batchnorm=True)
    with pytest.raises(ConfigError, match="true or false"):
        TrainConfig("resnet20", sync_batchnorm="yes")
    with pytest.raises(ConfigError, match="normalises over the batch of several workers, and this run has one"):
        TrainConfig("resnet20", sync_batchnorm=True)


@pytest.mark.parametrize(
    ("workload", "strategy", "message"),
    [
        ("resnet20", "ps-central-async", "asynchronous workers share none"),
        ("lenet", "allreduce-split", "this network has no batch norm"),  # before any process starts
    ],
)
def test_the_command_line_refuses_in_one_line(workload: str, strategy: str, message: str, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli("train", workload, "--workers", "2", "--strategy", strategy, "--sync-batchnorm", "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not out.exists()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device here")
def test_on_a_gpu_an_nccl_group_goes_through_torchs_function(tmp_path: Path) -> None:
    """A world of one process over NCCL: torch's SyncBatchNorm function, called as the layer calls it,
    computes what plain batch norm does (output, input gradient, running statistics)."""
    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        module, inputs, upstream = job.cases()["2d channels-last"]
        plain, synced = copy.deepcopy(module).cuda(), copy.deepcopy(module).cuda()
        sync_batch_norm(synced)
        results = []
        for layer, group in ((plain, None), (synced, dist.group.WORLD)):
            whole = inputs.cuda().requires_grad_(True)
            with synchronised(group):
                output = layer(whole)
            (output * upstream.cuda()).sum().backward()
            results.append((output.detach(), whole.grad, layer.state_dict()))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-4)
        for key, value in results[0][2].items():
            torch.testing.assert_close(results[1][2][key], value, rtol=1e-5, atol=1e-5, msg=key)
    finally:
        dist.destroy_process_group()


def test_a_bench_gives_it_only_to_runs_of_several_synchronous_workers() -> None:
    config = SweepConfig(
        "resnet20",
        Path("out"),
        workers=(1, 2),
        strategies=("allreduce-split", "ps-central-async"),
        settings={"sync_batchnorm": True},
    )
    runs, _ = plan_runs(config)
    given = {(run.sync, run.workers): run_settings(config, run).get("sync_batchnorm") for run in runs}
    assert given == {("split", 1): None, ("split", 2): True, ("async", 1): None, ("async", 2): None}
