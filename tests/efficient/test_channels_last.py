"""Channels-last activations: the same function and gradients, NHWC only inside the training forward pass,
and runs under every strategy (with a network rebuilt mid-run) that end where channels-first ones do."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, assert_same_weights, make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights
from torch import nn

import scaletrain
from scaletrain.efficient.channels_last import (
    ONEDNN_ISA_VARIABLES,
    channels_last_activations,
    hits_onednn_1x1_defect,
    memory_format_technique,
)
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload

pytestmark = pytest.mark.avx2  # CI runs this file on AVX2 kernels too (.ci/run)

RESNET = {"dataset": "fashion-mnist", "stages": "3", "blocks": "1", "width": "4"}


def _layouts(model: nn.Module) -> tuple[list[str], list[torch.utils.hooks.RemovableHandle]]:
    """Record, per convolution call, the layout of its input and output (``nchw``/``nhwc``)."""
    seen: list[str] = []

    def layout(tensor: torch.Tensor) -> str:
        if tensor.is_contiguous():
            return "nchw"
        return "nhwc" if tensor.is_contiguous(memory_format=torch.channels_last) else "other"

    def record(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if module.in_channels > 1:  # with one channel both layouts are the same strides
            # the convolutions oneDNN's AVX2 kernels get wrong take their input channels-first (the module's card)
            expected = "nchw" if hits_onednn_1x1_defect(module, inputs[0]) else "nhwc"
            seen.append(f"in:{layout(inputs[0])}" + ("" if layout(inputs[0]) == expected else " (unexpected)"))
        seen.append(f"out:{layout(output)}")

    handles = [m.register_forward_hook(record) for m in model.modules() if isinstance(m, nn.Conv2d)]
    return seen, handles


def test_channels_last_computes_the_same_outputs_and_gradients_with_nhwc_convolutions() -> None:
    torch.manual_seed(0)
    model = create_workload("resnet", RESNET).build_model()
    twin = copy.deepcopy(model)
    inputs, labels = torch.randn(6, 1, 28, 28), torch.randint(0, 10, (6,))
    seen, handles = _layouts(twin)
    with channels_last_activations():
        out = twin(inputs)
        nn.functional.cross_entropy(out, labels).backward()
    reference = model(inputs)
    nn.functional.cross_entropy(reference, labels).backward()
    torch.testing.assert_close(out, reference, rtol=1e-4, atol=1e-5)
    for mine, theirs in zip(twin.parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-4, atol=1e-5)
        assert mine.is_contiguous(), "the parameters keep their layout"
    assert seen and set(seen) <= {"in:nhwc", "in:nchw", "out:nhwc"} and "out:nhwc" in seen, seen

    seen.clear()
    twin(inputs)  # outside the block: no hook is left behind
    assert "in:nhwc" not in seen and "out:nhwc" not in seen
    for handle in handles:
        handle.remove()


#: oneDNN's AVX2 kernels on any x86 CPU (ATen's too): where oneDNN issue #6035's 1x1 kernel runs.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", **dict.fromkeys(ONEDNN_ISA_VARIABLES, "AVX2")}

#: Strided 1x1 convolutions with 1-8 input channels (a ResNet shortcut's shape), their gradients in float32
#: channels-last against float64 channels-first; prints the worst relative error of any gradient.
SHORTCUTS = """
import itertools, sys, torch
from torch import nn
from scaletrain.efficient.channels_last import channels_last_activations, onednn_below_avx512
assert onednn_below_avx512(), "the AVX2 kernels were asked for"
worst = 0.0
for channels, side, stride in itertools.product(range(1, 9), (8, 9, 16), (2, 3)):
    torch.manual_seed(channels)
    model = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1), nn.Conv2d(channels, 16, 1, stride=stride))
    inputs = torch.randn(4, channels, side, side, dtype=torch.float64)
    out = model.double()(inputs)
    grad = torch.randn(out.shape, dtype=torch.float64)
    out.backward(grad)
    exact = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.float()
    if sys.argv[1] == "hooks":
        with channels_last_activations():
            out = model(inputs.float())
    else:  # the plain channels-last convolutions the hooks replace
        out = model(inputs.float().contiguous(memory_format=torch.channels_last))
    out.backward(grad.float().contiguous(memory_format=torch.channels_last))
    for p, e in zip(model.parameters(), exact):
        worst = max(worst, float((p.grad.double() - e).abs().max() / e.abs().max()))
print(worst)
"""


def _shortcut_gradients(how: str, timeout: float = 120) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), **AVX2}
    return subprocess.run(
        [sys.executable, "-c", SHORTCUTS, how], env=environment, capture_output=True, text=True, timeout=timeout
    )


def test_strided_1x1_convolutions_with_few_channels_get_exact_gradients_on_avx2_kernels() -> None:
    """oneDNN issue #6035 (the module's card): without the workaround these gradients are 0.4-1.3 off."""
    result = _shortcut_gradients("hooks")
    assert result.returncode == 0, result.stderr[-2000:]
    assert float(result.stdout) < 1e-4


def test_the_onednn_defect_is_still_there_so_the_workaround_is_still_needed() -> None:
    """The plain channels-last convolutions on this torch: a wrong gradient, a crash, or a hang (the corrupted
    heap can leave the process waiting forever; the upstream report sees hangs too: it takes ~5 s when it
    finishes). When a torch whose oneDNN is fixed makes this fail, the workaround (``hits_onednn_1x1_defect``) can
    go."""
    try:
        result = _shortcut_gradients("plain", timeout=60)
    except subprocess.TimeoutExpired:  # hung (and killed by subprocess.run): the defect's third face
        result = subprocess.CompletedProcess([], returncode=-9, stdout="hung for 60 s")
    defect = result.returncode < 0 or (result.returncode == 0 and float(result.stdout) > 0.1)
    assert defect, f"oneDNN computes these exactly now ({result.stdout.strip()}): drop the workaround"


def test_the_hooks_go_away_when_the_forward_pass_fails() -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3))
    with pytest.raises(RuntimeError), channels_last_activations():
        model(torch.randn(2, 5, 8, 8))  # wrong channel count
    assert model(torch.randn(2, 3, 8, 8)).is_contiguous()


def test_an_unknown_memory_format_is_refused_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="--memory-format must be one of auto, contiguous, channels_last"):
        memory_format_technique("nhwc")
    with pytest.raises(ConfigError, match="memory-format"):
        scaletrain.TrainConfig("lenet", memory_format="NHWC")


def test_the_cli_refuses_a_bad_memory_format_in_one_line(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--memory-format", "nhwc", "--steps", "1", "--out", str(tmp_path / "r"))
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "channels_last" in result.stderr
    assert not (tmp_path / "r").exists()


# -- real runs ---------------------------------------------------------------------------------------

LENET_PLAN = "1:wider:features.0:26"  # the network is rebuilt mid-run, its first convolution replaced
COMMON = {"epochs": 2, "lr": 0.05, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("channels-last") / "fmnist", train=96, test=32)


def run(data: Path, out: Path, **extra) -> dict:
    settings = {**COMMON, "technique": "net2net", "technique_options": {"plan": LENET_PLAN}, **extra}
    return scaletrain.train("lenet", data_dir=data, out=out, batch_size=12, **settings)


@pytest.fixture(scope="module")
def channels_first(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("channels-first") / "run"
    assert run(data, out, memory_format="contiguous")["memory_format"] == "contiguous"
    return out


@pytest.mark.multiprocess
@pytest.mark.parametrize(("workers", "strategy", "server", "memory_format"), [
    (1, "local", "central", "auto"), (2, "allreduce", "central", "channels_last"), (2, "ps", "sharded", "auto"),
])  # fmt: skip
def test_a_channels_last_run_ends_where_a_channels_first_one_does(
    workers: int, strategy: str, server: str, memory_format: str, data: Path, channels_first: Path, tmp_path: Path
) -> None:
    """LeNet has no batch norm, so a split run computes one process's gradients; the layout changes only
    the order of the convolutions' sums. On a CPU ``auto`` (the default) is channels-last."""
    layout = {"memory_format": memory_format, "strategy": strategy, "server": server}
    summary = run(data, tmp_path / "run", workers=workers, sync="split" if workers > 1 else "join", **layout)
    assert summary["memory_format"] == "channels_last"
    assert summary["parameters"] > summary["parameters_initial"], "the network grew mid-run"
    if workers > 1:
        assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    first, last = weights(channels_first), weights(tmp_path / "run")
    assert_same_weights(first, last)
    if workers == 1:  # one process, the same sums but for the convolutions' kernels: NHWC ones ran
        assert any(not torch.equal(first[name], last[name]) for name in first)
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["kind"] == "reconfiguration" for r in records)


def test_a_run_resumes_in_the_other_layout_like_an_uninterrupted_run(
    data: Path, channels_first: Path, tmp_path: Path
) -> None:
    """The layout is not part of the technique state a checkpoint keeps: the growth planned for the
    second epoch still happens after resuming channels-last from a channels-first checkpoint."""
    run(data, tmp_path / "run", epochs=1, memory_format="contiguous")
    summary = run(data, tmp_path / "run", resume=True, memory_format="channels_last")
    assert summary["memory_format"] == "channels_last"
    assert summary["parameters"] > summary["parameters_initial"]
    assert_same_weights(weights(channels_first), weights(tmp_path / "run"))
