"""Net2Net (Chen et al. 2016): widening and deepening keep the function; training goes on from the grown
network with 2 workers exactly as in one process; a resume rebuilds the grown network."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from tests.helpers import assert_same_weights, make_fashion_mnist, run_cli
from tests.helpers import model_weights as weights
from torch import nn

import scaletrain
from scaletrain.efficient.net2net import deepen, deeper_decision, widen, wider_decision
from scaletrain.efficient.surgery import apply_architecture, reconfigure, resized_architecture
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload

pytestmark = pytest.mark.avx2  # CI runs this file on AVX2 kernels too (.ci/run)

RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "2", "width": "4"}
#: (workload, options, input shape, changes: ("wider", layer, width) or ("deeper", after))
NETWORKS = {
    "lenet": ("lenet", {}, (3, 1, 28, 28), [
        ("wider", "features.0", 27), ("wider", "features.3", 64), ("wider", "classifier.1", 560),
        ("deeper", "features.1"), ("deeper", "classifier.2"),
    ]),
    "resnet-basic": ("resnet", RESNET, (3, 1, 28, 28), [
        ("wider", "features.0", 6), ("wider", "features.3.residual.0", 7), ("deeper", "features.3"),
        ("wider", "features.6.residual.0", 11), ("deeper", "features.2"),
    ]),
    "resnet-bottleneck": ("resnet", {**RESNET, "bottleneck": "true"}, (3, 1, 28, 28), [
        ("wider", "features.0", 6), ("wider", "features.3.residual.3", 5), ("wider", "features.3.residual.6", 21),
        ("deeper", "features.4"),
    ]),
    "squeezenet": ("squeezenet", {"data": "synthetic", "image_size": "32", "num_classes": "5"}, (2, 3, 32, 32), [
        ("wider", "features.3.squeeze.0", 20), ("wider", "features.3.expand1x1.0", 70),
        ("wider", "features.3.expand3x3.0", 80), ("wider", "features.0", 100), ("deeper", "features.1"),
    ]),
}  # fmt: skip


def _trained_statistics(model: nn.Module, inputs: torch.Tensor) -> None:
    """Batch norms with statistics of their own (not the fresh 0 / 1) and non-trivial weights."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(inputs * 2 + 0.5)
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.2, 0.2)


@pytest.mark.parametrize("network", list(NETWORKS))
def test_widening_and_deepening_leave_the_outputs_unchanged(network: str) -> None:
    name, options, shape, changes = NETWORKS[network]
    torch.manual_seed(0)
    model = create_workload(name, options).build_model()
    inputs = torch.randn(shape)
    _trained_statistics(model, inputs)
    model.eval()
    reference = model(inputs)
    parameters = sum(p.numel() for p in model.parameters())
    for change in changes:
        if change[0] == "wider":
            widen(model, change[1], change[2], inputs[:1])
        else:
            deepen(model, change[1])
        model.eval()
        torch.testing.assert_close(model(inputs), reference, rtol=1e-5, atol=1e-5, msg=f"{network} after {change}")
        grown = sum(p.numel() for p in model.parameters())
        assert grown > parameters, change
        parameters = grown


def test_a_widened_layer_copies_channels_and_divides_their_readers_and_momentum() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(5, 3)).sum().backward()
    optimizer.step()
    old_reader, old_momentum = model[2].weight.detach().clone(), optimizer.state[model[2].weight]["momentum_buffer"]
    decision = wider_decision(model, "0", 7, torch.zeros(1, 3), seed=3)
    mapping = decision.keep["0"]["out"]
    assert mapping[:4] == [0, 1, 2, 3] and len(mapping) == 7
    renewed = reconfigure(model, optimizer, decision, lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9))
    counts = torch.bincount(torch.tensor(mapping), minlength=4).float()
    expected = old_reader[:, mapping] / counts[mapping]
    torch.testing.assert_close(model[2].weight, expected)
    torch.testing.assert_close(
        renewed.state[model[2].weight]["momentum_buffer"], old_momentum[:, mapping] / counts[mapping]
    )
    assert torch.equal(model[0].weight[4:], model[0].weight[mapping[4:]])


def test_noise_moves_only_the_copies_and_the_same_seed_draws_the_same() -> None:
    inputs = torch.randn(4, 1, 28, 28)
    grown = []
    for _ in range(2):
        torch.manual_seed(0)
        model = create_workload("lenet").build_model()
        decision = wider_decision(model, "features.0", 30, inputs[:1], noise=0.1, seed=7)
        reconfigure(model, torch.optim.SGD(model.parameters(), lr=0.1), decision, lambda p: torch.optim.SGD(p, lr=0.1))
        grown.append(model)
    assert torch.equal(grown[0].features[0].weight, grown[1].features[0].weight)
    weight, mapping = grown[0].features[0].weight, decision.keep["features.0"]["out"]
    assert torch.equal(weight[:20], create_workload("lenet").build_model().features[0].weight * 0 + weight[:20])
    assert not torch.allclose(weight[20:], weight[mapping[20:]])  # the copies moved


def test_the_architecture_rebuilds_a_grown_network_from_scratch() -> None:
    torch.manual_seed(0)
    model = create_workload("resnet", RESNET).build_model()
    inputs = torch.randn(2, 1, 28, 28)
    architecture: dict = {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    changes = (
        lambda: wider_decision(model, "features.0", 6, inputs),
        lambda: deeper_decision(model, "features.3"),  # a copy of the widened block
        lambda: deeper_decision(model, "features.2"),  # a convolution before it: the blocks move up
        lambda: wider_decision(model, "features.5.residual.0", 9, inputs),  # inside the inserted block
    )
    for change in changes:
        decision = change()
        optimizer = reconfigure(model, optimizer, decision, lambda p: torch.optim.SGD(p, lr=0.1))
        architecture = resized_architecture(architecture, decision)
    fresh = create_workload("resnet", RESNET).build_model()
    apply_architecture(fresh, json.loads(json.dumps(architecture)))
    fresh.load_state_dict(model.state_dict())
    model.eval(), fresh.eval()
    torch.testing.assert_close(fresh(inputs), model(inputs))


def test_bad_plans_and_places_are_refused_in_one_line() -> None:
    for plan in ("2:wider:features.0", "x:deeper:a", "1:deeper:a;1:deeper:b", "0:deeper:a", "2:taller:a"):
        with pytest.raises(ConfigError, match="net2net: plan entry"):
            scaletrain.efficient.create_technique("net2net", {"plan": plan})
    model = create_workload("resnet", RESNET).build_model()
    with pytest.raises(ConfigError, match="shortcut is a projection"):
        deeper_decision(model, "features.5")
    with pytest.raises(ConfigError, match="give a larger width"):
        wider_decision(model, "features.0", 4, torch.zeros(1, 1, 28, 28))
    with pytest.raises(ConfigError, match="not a module inside an nn.Sequential"):
        deeper_decision(model, "features.3.residual")


# -- in real runs -----------------------------------------------------------------------------------

RESNET_PLAN = "1:wider:features.0:6;2:deeper:features.3"
LENET_PLAN = "1:wider:features.0:26;2:deeper:classifier.2"  # after a tanh: a linear identity layer
COMMON = {"epochs": 3, "lr": 0.05, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 3}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("net2net") / "fmnist", train=96, test=32)


def grow(data: Path, out: Path, workload: str = "resnet", **extra) -> dict:
    plan, options = (RESNET_PLAN, RESNET) if workload == "resnet" else (LENET_PLAN, {})
    settings = {**COMMON, "technique": "net2net", "technique_options": {"plan": plan}, **extra}
    return scaletrain.train(workload, options=options, data_dir=data, out=out, batch_size=12, **settings)


@pytest.fixture(scope="module")
def local_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("net2net-local") / "run"
    grow(data, out)
    return out


def test_a_run_grows_without_changing_what_it_computes_at_the_change(local_run: Path) -> None:
    summary = json.loads((local_run / "summary.json").read_text())
    records = [json.loads(line) for line in (local_run / "metrics.jsonl").read_text().splitlines()]
    changes = [r for r in records if r["kind"] == "reconfiguration"]
    assert len(changes) == 2
    assert changes[1]["modules_inserted"] == ["features.4"]
    for change in changes:
        assert change["parameters"] > change["parameters_before"]
        for key in ("test_accuracy", "test_loss"):
            assert change["quality_after"][key] == pytest.approx(change["quality_before"][key], rel=1e-4, abs=1e-5)
    assert summary["parameters"] == changes[-1]["parameters"] > summary["parameters_initial"]


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("strategy", "extra"),
    [
        ("allreduce", {}),
        ("ps", {"server": "sharded"}),
        ("diloco", {"sync_every": 1, "strategy_options": {"outer_lr": 1, "outer_momentum": 0}}),  # local SGD, H = 1
    ],
)
def test_two_workers_grow_lenet_exactly_as_one_process(strategy: str, extra: dict, data: Path, tmp_path: Path) -> None:
    """LeNet has no batch norm, so a split run computes one process's gradients and must end equal."""
    local = grow(data, tmp_path / "local", "lenet")
    summary = grow(data, tmp_path / "run", "lenet", workers=2, strategy=strategy, sync="split", **extra)
    assert summary["architecture"] == local["architecture"] and "classifier.3" in summary["architecture"]
    assert summary["parameters"] == local["parameters"] > local["parameters_initial"]
    assert_same_weights(weights(tmp_path / "local"), weights(tmp_path / "run"))


@pytest.mark.multiprocess
def test_two_workers_train_on_from_a_grown_resnet_with_the_sharded_server(data: Path, tmp_path: Path) -> None:
    summary = grow(data, tmp_path / "run", workers=2, strategy="ps", server="sharded", sync="join")
    assert summary["parameters"] > summary["parameters_initial"]
    digests = {worker["weights_digest"] for worker in summary["per_worker"]}
    assert len(digests) == 1, "both workers hold the same grown network and weights"
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    changes = [r for r in records if r["kind"] == "reconfiguration"]
    assert len(changes) == 2  # the owners' master weights came back whole: the function is unchanged
    for change in changes:
        assert change["quality_after"]["test_loss"] == pytest.approx(change["quality_before"]["test_loss"], rel=1e-4)
    assert math.isfinite(summary["test_loss"])


def test_resuming_after_growth_ends_like_an_uninterrupted_run(data: Path, local_run: Path, tmp_path: Path) -> None:
    grow(data, tmp_path / "run", epochs=2)
    grow(data, tmp_path / "run", resume=True)
    assert_same_weights(weights(local_run), weights(tmp_path / "run"))


def test_a_bad_plan_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--technique", "net2net", "-T", "plan=1:wider:nowhere:9", "--steps", "2",
                     "--out", str(tmp_path / "run"), timeout=120)  # fmt: skip
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "net2net" in lines[0], result.stderr


def test_prunetrain_then_net2net_rewidens_the_pruned_shape_to_the_starting_size(tmp_path: Path) -> None:
    """PruneTrain + Net2Net (004 §3.5): prune, then (after epoch 2) widen uniformly back to the start's size.
    The settings of the PruneTrain tests, which prune within two epochs."""
    data = make_fashion_mnist(tmp_path / "fmnist", train=192, test=32)
    small = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "4"}
    options = {"ratio": "0.5", "threshold": "0.05", "every": "1", "rewiden": "2"}
    settings = {**COMMON, "epochs": 3, "lr": 0.1, "seed": 5, "batch_size": 12}
    summary = scaletrain.train("resnet", options=small, data_dir=data, out=tmp_path / "run", technique="prunetrain",
                               technique_options=options, **settings)  # fmt: skip
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    changes = [r for r in records if r["kind"] == "reconfiguration"]
    assert changes and changes[-1]["epoch"] == 1, "the re-widening after epoch 2 is the last change"
    last = changes[-1]
    assert last["parameters"] == summary["parameters"]
    assert abs(summary["parameters"] / summary["parameters_initial"] - 1) < 0.05
    start = {p: m.out_channels for p, m in create_workload("resnet", small).build_model().named_modules()
             if isinstance(m, nn.Conv2d)}  # fmt: skip
    assert any(last["channels"][path] != width for path, width in start.items()), "the pruned shape, not the start's"
