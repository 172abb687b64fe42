"""``--compile`` (scaletrain.train.compiled): the training forward under torch.compile.

- A compiled LeNet run follows the eager run of the same seed step by step (losses) and ends on its weights,
  through a reconfiguration (``narrow`` halves the hidden layer after epoch 1) whose new network it compiles
  again; ``model.pt`` has the eager model's keys.
- Two compiled workers (all-reduce, split) end where one eager process does, through the same reconfiguration.
- Below AVX-512 inductor keeps a network with a convolution oneDNN's 1x1 defect hits channels-first: exact
  gradients on the AVX2 kernels (with inductor's channels-last layout some calls' were 0.5-0.8 off).
- Refused in one line, exit 2, nothing written: ``--compile`` where inductor finds no C++ compiler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, assert_same_weights, make_fashion_mnist, model_weights, run_cli
from torch import nn

import scaletrain
from scaletrain.config import load_toml
from scaletrain.efficient import channels_last, techniques_for
from scaletrain.efficient.channels_last import ONEDNN_ISA_VARIABLES, inductor_layout_optimization
from scaletrain.errors import ConfigError

NARROW = {"technique": "narrow", "technique_options": {"layer": "classifier.1", "fraction": "0.5", "epoch": "1"}}
COMMON = {"epochs": 2, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "seed": 3, "log_every": 1, "progress": "off"}
SETTINGS = {**COMMON, **NARROW, "tensorboard": False}


def step_losses(out: Path) -> list[float]:
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [record["loss"] for record in records if record["kind"] == "step"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One process, eager and compiled, on tiny Fashion-MNIST files (16 steps an epoch); how often the
    compiled run made a compiled module."""
    root = tmp_path_factory.mktemp("compile")
    data = make_fashion_mnist(root / "fmnist")
    made = []
    real_compile = torch.compile

    def counted(model: nn.Module, **options: object) -> nn.Module:
        made.append(type(model).__name__)
        return real_compile(model, **options)

    summaries = {"eager": scaletrain.train("lenet", data_dir=data, out=root / "eager", threads=1, **SETTINGS)}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "compile", counted)
        summaries["compiled"] = scaletrain.train(
            "lenet", data_dir=data, out=root / "compiled", threads=1, compile=True, **SETTINGS
        )
    return {"root": root, "data": data, "summaries": summaries, "made": made}


def test_a_compiled_run_follows_the_eager_one_step_by_step(runs: dict) -> None:
    root, summaries = runs["root"], runs["summaries"]
    eager, compiled = step_losses(root / "eager"), step_losses(root / "compiled")
    assert len(eager) == len(compiled) == 32
    assert compiled == pytest.approx(eager, rel=1e-4, abs=1e-5)
    assert compiled[-1] < compiled[0]  # it trained
    assert summaries["compiled"]["compile"] is True and summaries["compiled"]["compile_seconds"] > 0
    assert summaries["eager"]["compile"] is False and summaries["eager"]["compile_seconds"] is None
    assert [worker["compile_seconds"] for worker in summaries["compiled"]["per_worker"]] == [
        summaries["compiled"]["compile_seconds"]
    ]


def test_a_compiled_run_compiles_the_reconfigured_network_and_ends_on_the_eager_weights(runs: dict) -> None:
    root, summaries = runs["root"], runs["summaries"]
    assert runs["made"] == ["LeNet5", "LeNet5"], "one compiled module for each network"
    weights = model_weights(root / "compiled")
    assert weights["classifier.1.weight"].shape == (250, 800), "narrowed after epoch 1"
    assert not any("_orig_mod" in key for key in weights)
    assert_same_weights(weights, model_weights(root / "eager"))
    assert summaries["compiled"]["architecture"] == summaries["eager"]["architecture"]


@pytest.mark.multiprocess
def test_two_compiled_workers_split_end_where_one_eager_process_does(runs: dict) -> None:
    """Each worker computes 16 rows of a batch of 32, as the compiled run above did: inductor's cache serves
    the graphs it compiled (the test pays no compilation of its own twice over)."""
    root, data, settings = runs["root"], runs["data"], {**SETTINGS, "batch_size": 32}
    scaletrain.train("lenet", data_dir=data, out=root / "one", threads=1, **settings)
    summary = scaletrain.train(
        "lenet", data_dir=data, out=root / "split", workers=2, sync="split", compile=True, **settings
    )
    assert summary["compile"] is True and all(worker["compile_seconds"] > 0 for worker in summary["per_worker"])
    assert_same_weights(model_weights(root / "split"), model_weights(root / "one"))


#: A ResNet shortcut's shape that oneDNN's AVX2 1x1 kernel gets wrong in channels-last (channels_last's card),
#: compiled as --compile compiles it, its gradients against float64 eager ones; prints the worst relative error.
SHORTCUT = """
import torch
from torch import nn
from scaletrain.efficient.channels_last import onednn_below_avx512
from scaletrain.train.compiled import TrainingForward
assert onednn_below_avx512(), "the AVX2 kernels were asked for"
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 16, 1, stride=2))
compiled = TrainingForward(model, compiled=True).module
worst = 0.0
for _ in range(10):  # the defect strikes some calls: with inductor's NHWC layout 1 to 8 of 10, in 4 processes
    inputs, grad = torch.randn(4, 4, 8, 8, dtype=torch.float64), torch.randn(4, 16, 4, 4, dtype=torch.float64)
    model.double()(inputs).backward(grad)
    exact = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.float()
    compiled(inputs.float()).backward(grad.float())
    errors = [float((p.grad.double() - e).abs().max() / e.abs().max()) for p, e in zip(model.parameters(), exact)]
    worst = max(worst, *errors)
    model.zero_grad()
print(worst)
"""


def test_below_avx512_a_compiled_strided_1x1_convolution_gets_exact_gradients() -> None:
    avx2 = {"ATEN_CPU_CAPABILITY": "avx2", **dict.fromkeys(ONEDNN_ISA_VARIABLES, "AVX2")}
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), **avx2}
    result = subprocess.run(
        [sys.executable, "-c", SHORTCUT], env=environment, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout) < 1e-4


def test_inductor_lays_out_channels_last_unless_told_or_the_defect_is_there(monkeypatch: pytest.MonkeyPatch) -> None:
    shortcut = nn.Sequential(nn.Conv2d(4, 16, 1, stride=2))
    monkeypatch.setattr(channels_last, "onednn_below_avx512", lambda: True)
    assert not inductor_layout_optimization(shortcut, "auto")
    assert inductor_layout_optimization(nn.Sequential(nn.Conv2d(8, 16, 1, stride=2)), "auto")
    assert not inductor_layout_optimization(nn.Sequential(nn.Conv2d(8, 16, 1)), "contiguous")
    monkeypatch.setattr(channels_last, "onednn_below_avx512", lambda: False)
    assert inductor_layout_optimization(shortcut, "channels_last")
    # the hooks stay off under --compile: new ones each step would make dynamo compile each step again
    settings = {"technique": None, "memory_format": "auto", "ghost_batch": None, "batch_budget": None}
    settings |= {"precision": "fp32", "loss_scale": None}
    assert techniques_for(settings)[1] is not None
    assert techniques_for({**settings, "compile": True})[1] is None


def test_a_config_file_turns_it_on_and_a_non_boolean_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run.toml").write_text('workload = "lenet"\ncompile = true\n')
    assert load_toml(tmp_path / "run.toml") == {"workload": "lenet", "compile": True}
    with pytest.raises(ConfigError, match="compile must be true or false"):
        scaletrain.TrainConfig("lenet", compile="yes")


def test_without_a_cpp_compiler_it_is_one_line_exit_2_and_nothing_written(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli("train", "lenet", "--compile", "--steps", "1", "--out", str(out), env={"CXX": "/nowhere/g++"})
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "C++ compiler" in lines[0] and "--compile" in lines[0], result.stderr
    assert not out.exists()
