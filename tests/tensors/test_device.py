"""``--device``: which device a process takes, the one-line refusals, and the GPU path's host staging of
the parameter server run on the CPU (no GPU on these machines: only the device calls are left out)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, model_weights, run_cli

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.ps.exchange import HOST_STAGING
from scaletrain.tensors.device import backend_for, resolve_device, to_device


def test_auto_takes_the_local_ranks_gpu_when_there_is_one_and_the_cpu_otherwise() -> None:
    assert resolve_device("auto", local_rank=3, cuda_available=True, cuda_count=4) == torch.device("cuda", 3)
    assert resolve_device("auto", local_rank=5, cuda_available=True, cuda_count=4) == torch.device("cuda", 1)
    assert resolve_device("cuda:2", cuda_available=True, cuda_count=4) == torch.device("cuda", 2)
    assert resolve_device("auto", local_rank=1, cuda_available=False) == torch.device("cpu")
    assert backend_for(torch.device("cuda", 0)) == "cpu:gloo,cuda:nccl" and backend_for(torch.device("cpu")) == "gloo"


@pytest.mark.parametrize(
    ("spec", "available", "message"),
    [
        ("cuda", False, "torch sees no CUDA device here"),
        ("cuda:4", True, "this machine has 2 CUDA device(s), numbered 0 to 1"),
        ("gpu", True, "--device must be auto, cpu, cuda or cuda:K"),
        ("cpu:1", True, "--device must be auto, cpu, cuda or cuda:K"),
    ],
)
def test_a_device_that_cannot_be_had_is_refused_naming_the_fix(spec: str, available: bool, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_device(spec, cuda_available=available, cuda_count=2)


def test_batches_of_any_shape_move_and_stay_put_on_the_cpu() -> None:
    batch = {"x": (torch.zeros(2), [torch.ones(1)])}
    assert to_device(batch, torch.device("cpu")) is batch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--steps", "1", "--device", "cuda", "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch sees no CUDA device here" in lines[0] and "--device cpu" in lines[0]


def test_a_run_records_its_device(tiny_fmnist: Path, tmp_path: Path) -> None:
    summary = scaletrain.train(
        "lenet", data_dir=tiny_fmnist, out=tmp_path / "run", steps=2, progress="off", tensorboard=False
    )
    assert summary["device"] == ("cuda:0" if torch.cuda.is_available() else "cpu")


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ps-central-split", "ps-sharded-split"])
def test_the_parameter_servers_host_staging_trains_the_same_weights(
    strategy: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a GPU worker does — flat buffers in host memory, gradients copied down and weights copied
    up once per owner each step, timed apart — run on the CPU, equals the CPU path weight for weight."""
    data = make_fashion_mnist(tmp_path / "fmnist", train=96, test=16)
    settings = dict(data_dir=data, steps=8, batch_size=12, momentum=0.9, workers=2, strategy=strategy, threads=1)
    plain = scaletrain.train("lenet", out=tmp_path / "plain", progress="off", tensorboard=False, **settings)
    monkeypatch.setenv(HOST_STAGING, "1")
    staged = scaletrain.train("lenet", out=tmp_path / "staged", progress="off", tensorboard=False, **settings)
    assert plain["steps"] == staged["steps"] == 8
    assert all(w["host_copy_seconds"] == 0 for w in plain["per_worker"])
    assert all(w["host_copy_seconds"] > 0 for w in staged["per_worker"])
    assert len({w["weights_digest"] for w in staged["per_worker"]}) == 1
    first, second = model_weights(tmp_path / "plain"), model_weights(tmp_path / "staged")
    for name in first:
        assert torch.equal(first[name], second[name]), name
