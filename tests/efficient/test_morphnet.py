"""MorphNet (Gordon et al. 2018): resource-weighted costs, the shrink-then-expand decision, and runs
that end on the FLOPs target."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, run_cli
from torch import nn

import scaletrain
from scaletrain.efficient.channels import channel_groups, dead_channel_pruning
from scaletrain.efficient.cost import flops_per_sample
from scaletrain.efficient.morphnet import channel_costs
from scaletrain.efficient.net2net import composed, expansion_decision, uniform_wider_decision
from scaletrain.efficient.prunetrain import following_norms
from scaletrain.efficient.surgery import reconfigure
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload

pytestmark = pytest.mark.avx2  # CI runs this file on AVX2 kernels too (.ci/run)

RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "8"}


def _apply(model: nn.Module, decision) -> None:
    reconfigure(model, torch.optim.SGD(model.parameters(), lr=0.0), decision, lambda p: torch.optim.SGD(p, lr=0.0))


def test_a_channel_costs_what_its_writer_and_readers_spend_on_it() -> None:
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
        nn.Conv2d(4, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Flatten(), nn.Linear(6 * 5 * 5, 3),
    )  # fmt: skip
    costs = channel_costs(net, torch.zeros(1, 1, 5, 5))
    pixels = 25
    first = 2 * 1 * 9 * pixels + 2 * 6 * 9 * pixels  # its own output channel, and one input of the next conv
    second = 2 * 4 * 9 * pixels + 2 * 3 * pixels  # its output channel, and the linear layer's 25 inputs for it
    assert costs == pytest.approx({"1": first, "4": second})
    assert channel_costs(net, torch.zeros(1, 1, 5, 5), "parameters") == pytest.approx({"1": 9 + 6 * 9, "4": 4 * 9 + 75})


def test_shrinking_then_expanding_as_one_decision_equals_both_in_turn() -> None:
    torch.manual_seed(0)
    model = create_workload("resnet", RESNET).build_model()
    example = torch.randn(2, 1, 28, 28)
    with torch.no_grad():  # silence some channels of the first stage and of a block's inner layer
        for path, channels in (("features.1", [1, 4, 6]), ("features.3.residual.1", [0, 2])):
            norm = model.get_submodule(path)
            norm.weight[channels] = 0
            norm.bias[channels] = 0
    norms = following_norms(model, example)
    pruning = dead_channel_pruning(model, channel_groups(model, example), 1e-6, norms)
    shrink = scaletrain.efficient.Reconfiguration(keep=pruning.keep, remove=pruning.remove)
    stepwise = copy.deepcopy(model)
    _apply(stepwise, shrink)
    expand = uniform_wider_decision(stepwise, 1.5, example, seed=4)
    _apply(stepwise, expand)
    at_once = copy.deepcopy(model)
    _apply(at_once, composed(shrink, expand))
    for (name, first), (_, second) in zip(stepwise.state_dict().items(), at_once.state_dict().items(), strict=True):
        torch.testing.assert_close(first, second, msg=name)
    model.eval(), at_once.eval()
    torch.testing.assert_close(at_once(example), model(example), rtol=1e-5, atol=1e-5)  # the silent channels only


def test_the_expansion_reaches_the_target_within_a_few_per_cent() -> None:
    model = create_workload("resnet", {**RESNET, "width": "4"}).build_model()
    example = torch.zeros(1, 1, 28, 28)
    have = flops_per_sample(model, example)
    for target in (1.7 * have, 3.1 * have):
        decision, reached = expansion_decision(model, example, target)
        grown = copy.deepcopy(model)
        _apply(grown, decision)
        assert flops_per_sample(grown, example) == pytest.approx(reached)
        assert abs(reached / target - 1) < 0.05
    assert expansion_decision(model, example, 0.5 * have)[0] is None


def test_bad_options_are_refused() -> None:
    for options in ({"resource": "joules"}, {"target": "0"}, {"every": "0"}):
        with pytest.raises(ConfigError, match="morphnet"):
            scaletrain.efficient.create_technique("morphnet", options)


# -- in real runs -----------------------------------------------------------------------------------

COMMON = {"lr": 0.05, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 2}
MORPH = {"technique": "morphnet", "technique_options": {"strength": "0.05", "every": "2", "threshold": "1e-3"}}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("morphnet") / "fmnist", train=192, test=32)


def test_a_run_reshapes_the_network_and_ends_on_its_flops(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    scaletrain.train("resnet", options=RESNET, data_dir=data, out=out, epochs=3, batch_size=16, **MORPH, **COMMON)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (change,) = [r for r in records if r["kind"] == "reconfiguration"]
    assert change["epoch"] == 1  # after the round's two epochs; none after (the penalty stops)
    before, after = change["flops_per_sample_before"], change["flops_per_sample"]
    assert abs(after / before - 1) < 0.05
    assert change["quality_after"]["test_loss"] == pytest.approx(change["quality_before"]["test_loss"], rel=1e-4)
    initial = create_workload("resnet", RESNET).build_model()
    widths = {path: module.out_channels for path, module in initial.named_modules() if isinstance(module, nn.Conv2d)}
    assert any(change["channels"][path] != width for path, width in widths.items()), "the shape changed"
    final = scaletrain.load_model(out)
    assert flops_per_sample(final, torch.zeros(1, 1, 28, 28)) == pytest.approx(after)


@pytest.mark.multiprocess
def test_two_workers_reshape_the_same_way(data: Path, tmp_path: Path) -> None:
    options = {**MORPH["technique_options"], "strength": "0.3"}  # half the steps per epoch of one process: press harder
    settings = {"epochs": 3, "batch_size": 16, "workers": 2, "sync": "join", **COMMON}
    summary = scaletrain.train("resnet", options=RESNET, data_dir=data, out=tmp_path / "run", technique="morphnet",
                               technique_options=options, **settings)  # fmt: skip
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    assert summary["parameters"] != summary["parameters_initial"]


def test_a_network_without_batch_norm_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--technique", "morphnet", "--steps", "2", "--out", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "morphnet" in lines[0], result.stderr
