"""PruneTrain's parts: the group lasso and its weight, dead channels with channel union, block removal.

Removing channels whose weights and batch-norm shift (and running mean) are exactly zero must leave
the network's function unchanged in eval mode, for basic and bottleneck blocks, with and without the
removal of a whole block.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from scaletrain.efficient import Context, EpochEnd, create_technique
from scaletrain.efficient.base import Reconfiguration
from scaletrain.efficient.channels import channel_groups, dead_channel_pruning
from scaletrain.efficient.cost import flops_per_sample
from scaletrain.efficient.prunetrain import following_norms, group_lasso, lasso_weight, regularised_groups
from scaletrain.efficient.surgery import Bypass, apply_architecture, reconfigure, resized_architecture
from scaletrain.workloads.resnet import ResNet, ResNetOptions

INPUTS = torch.randn(4, 1, 12, 12, generator=torch.Generator().manual_seed(3))


def small_resnet(bottleneck: bool) -> nn.Module:
    """Two stages of two blocks, width 4, one input channel; random batch-norm state."""
    torch.manual_seed(0)
    model = ResNet(ResNetOptions(dataset="fashion-mnist", stages=2, blocks="2", width=4, bottleneck=bottleneck), 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5)
                module.bias.uniform_(-0.5, 0.5)
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def silence(model: nn.Module, conv: str, norm: str, channels: list[int]) -> None:
    """Zero the output channels of ``conv`` and the shift and running mean of ``norm`` there."""
    with torch.no_grad():
        model.get_submodule(conv).weight[channels] = 0.0
        model.get_submodule(norm).bias[channels] = 0.0
        model.get_submodule(norm).running_mean[channels] = 0.0


def prune(model: nn.Module) -> Reconfiguration:
    pruning = dead_channel_pruning(model, channel_groups(model, INPUTS), threshold=1e-4)
    decision = Reconfiguration(keep=pruning.keep, remove=pruning.remove)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reconfigure(model, optimizer, decision, lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    return decision


@pytest.mark.parametrize("bottleneck", [False, True], ids=["basic", "bottleneck"])
def test_removing_silent_inner_channels_keeps_the_function(bottleneck: bool) -> None:
    model = small_resnet(bottleneck)
    silence(model, "features.3.residual.0", "features.3.residual.1", [0, 2])  # block 0 of stage 1
    silence(model, "features.5.residual.0", "features.5.residual.1", [1])  # the first block of stage 2
    before = model(INPUTS)
    parameters = sum(p.numel() for p in model.parameters())
    decision = prune(model)
    assert decision.remove == []
    assert model.get_submodule("features.3.residual.0").out_channels == 2
    assert model.get_submodule("features.3.residual.3").in_channels == 2
    assert model.get_submodule("features.5.residual.0").out_channels == 7
    assert sum(p.numel() for p in model.parameters()) < parameters
    torch.testing.assert_close(model(INPUTS), before, rtol=0, atol=1e-5)


@pytest.mark.parametrize("bottleneck", [False, True], ids=["basic", "bottleneck"])
def test_a_block_whose_branch_is_silent_goes_whole_and_the_function_stays(bottleneck: bool) -> None:
    model = small_resnet(bottleneck)
    last_conv = "features.4.residual.6" if bottleneck else "features.4.residual.3"
    silence(model, "features.4.residual.0", "features.4.residual.1", [0, 1, 2, 3])  # every inner channel
    with torch.no_grad():  # what the branch still adds are its later norms' constants: zero them too
        for module in model.get_submodule("features.4.residual").modules():
            if isinstance(module, nn.BatchNorm2d):
                module.bias.zero_()
                module.running_mean.zero_()
    before = model(INPUTS)
    decision = prune(model)
    assert decision.remove == ["features.4"]
    assert isinstance(model.get_submodule("features.4"), Bypass)
    assert not any(path.startswith("features.4.residual") for path in decision.keep)
    torch.testing.assert_close(model(INPUTS), before, rtol=0, atol=1e-5)
    assert last_conv not in dict(model.named_modules())


def test_channel_union_removes_a_residual_channel_only_when_every_member_lets_it_go() -> None:
    model = small_resnet(bottleneck=False)
    # Channel 1 of stage 1's residual stream: written by the stem and by the last conv of both blocks.
    silence(model, "features.0", "features.1", [1])
    silence(model, "features.3.residual.3", "features.3.residual.4", [1])
    untouched = prune(model)
    assert "features.0" not in untouched.keep, "block 4 still writes channel 1: the union keeps it"
    silence(model, "features.4.residual.3", "features.4.residual.4", [1])
    before = model(INPUTS)
    decision = prune(model)
    assert decision.keep["features.0"] == {"out": [0, 2, 3]}
    for reader in ("features.3.residual.0", "features.4.residual.0", "features.5.residual.0", "features.5.shortcut.0"):
        assert model.get_submodule(reader).in_channels == 3, reader
    torch.testing.assert_close(model(INPUTS), before, rtol=0, atol=1e-5)


def test_a_channel_nobody_reads_goes_even_when_it_is_written() -> None:
    model = small_resnet(bottleneck=False)
    with torch.no_grad():
        model.get_submodule("features.3.residual.3").weight[:, 2] = 0.0  # block 0's second conv ignores input 2
    before = model(INPUTS)
    decision = prune(model)
    assert decision.keep["features.3.residual.0"] == {"out": [0, 1, 3]}
    torch.testing.assert_close(model(INPUTS), before, rtol=0, atol=1e-5)


def test_every_group_keeps_one_channel_when_no_block_can_go() -> None:
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Conv2d(3, 2, 3), nn.Flatten(), nn.Linear(2 * 8 * 8, 4))
    with torch.no_grad():
        net[2].weight.zero_()
    decision = dead_channel_pruning(net, channel_groups(net, INPUTS), threshold=1e-4)
    assert [len(decision.keep["2"]["out"]), len(decision.keep["4"]["in"])] == [1, 64]  # flattened: 64 per channel
    assert "0" in decision.keep  # nobody reads conv 0's outputs any more: all but one go


def test_the_architecture_rebuilds_the_pruned_network_from_a_fresh_one() -> None:
    model = small_resnet(bottleneck=False)
    silence(model, "features.4.residual.0", "features.4.residual.1", [0, 1, 2, 3])
    silence(model, "features.5.residual.0", "features.5.residual.1", [3])
    decision = prune(model)
    architecture = resized_architecture({}, decision)
    fresh = ResNet(ResNetOptions(dataset="fashion-mnist", stages=2, blocks="2", width=4), 1)
    apply_architecture(fresh, architecture)
    fresh.load_state_dict(model.state_dict())  # every shape matches
    fresh.eval()
    torch.testing.assert_close(fresh(INPUTS), model(INPUTS))


def test_group_lasso_is_the_sum_of_channel_norms_leaving_out_the_first_inputs_and_the_last_outputs() -> None:
    model = small_resnet(bottleneck=False)
    groups = regularised_groups(model, INPUTS)
    assert groups["features.0"] == (True, False) and groups["classifier.2"] == (False, True)
    expected = 0.0
    for path, (outputs, inputs) in groups.items():
        weight = model.get_submodule(path).weight.detach()
        for index in range(weight.shape[0]) if outputs else ():
            expected += math.sqrt(float((weight[index] ** 2).sum()))
        for index in range(weight.shape[1]) if inputs else ():
            expected += math.sqrt(float((weight[:, index] ** 2).sum()))
    assert group_lasso(model, groups).item() == pytest.approx(expected, rel=1e-5)


def test_lambda_from_the_lasso_penalty_ratio_matches_the_hand_computed_value() -> None:
    model = small_resnet(bottleneck=False).train()
    technique = create_technique("prunetrain", {"ratio": "0.25", "step": "subgradient"})
    technique.start(model, Context(example_inputs=lambda: INPUTS))
    loss = torch.tensor(2.3)
    norms = following_norms(model, INPUTS)
    # every regularised output group's batch norm: the conv before each BatchNorm2d, not the classifier
    assert norms["features.0"] == "features.1" and norms["features.3.residual.3"] == "features.3.residual.4"
    assert technique._norms == {path: norms[path] for path, (outputs, _) in technique._groups.items() if outputs}
    lasso = group_lasso(model, technique._groups, technique._norms).item()
    scales = sum(
        float(model.get_submodule(n).weight.detach().abs().sum() + model.get_submodule(n).bias.detach().abs().sum())
        for n in technique._norms.values()
    )
    assert lasso == pytest.approx(group_lasso(model, technique._groups).item() + scales, rel=1e-6)
    objective = technique.objective(loss, model)
    assert technique.weight == pytest.approx(0.25 * 2.3 / (lasso * 0.75), rel=1e-6)
    assert lasso_weight(0.25, 2.3, lasso) == pytest.approx(technique.weight)
    # the penalty is then the fraction r of the whole objective
    assert (objective.item() - 2.3) / objective.item() == pytest.approx(0.25, rel=1e-5)
    # the proximal step sets the same λ and leaves the loss alone: the penalty acts on the weights
    proximal = create_technique("prunetrain", {"ratio": "0.25"})
    proximal.start(model, Context(example_inputs=lambda: INPUTS))
    assert proximal.objective(loss, model) is loss and proximal.weight == technique.weight


def test_the_proximal_step_soft_thresholds_each_batch_norm_scale_and_shift() -> None:
    model = small_resnet(bottleneck=False).train()
    technique = create_technique("prunetrain", {"ratio": "0.2"})
    technique.start(model, Context(example_inputs=lambda: INPUTS))
    technique.objective(torch.tensor(2.0), model)
    norm = model.get_submodule("features.5.residual.1")
    with torch.no_grad():
        norm.weight[0], norm.bias[0] = 1e-7, -1e-7
    before_scale, before_shift = norm.weight.detach().clone(), norm.bias.detach().clone()
    technique.after_update(dict(model.named_parameters()), lr=0.5)
    amount = 0.5 * technique.weight
    for after, before in ((norm.weight, before_scale), (norm.bias, before_shift)):
        torch.testing.assert_close(after.detach(), before.sign() * (before.abs() - amount).clamp_min(0))
    assert norm.weight[0] == 0 and norm.bias[0] == 0
    off = create_technique("prunetrain", {"batchnorm": "off"})
    off.start(model, Context(example_inputs=lambda: INPUTS))
    assert off._norms == {}


def test_a_channel_whose_batch_norm_is_silent_goes_and_the_function_stays() -> None:
    model = small_resnet(bottleneck=False)
    conv, norm = "features.3.residual.0", "features.3.residual.1"
    with torch.no_grad():  # the conv's weights stay; its batch norm outputs zero for channels 1 and 3
        model.get_submodule(norm).weight[[1, 3]] = 0.0
        model.get_submodule(norm).bias[[1, 3]] = 0.0
    before = model(INPUTS)
    groups = channel_groups(model, INPUTS)
    assert dead_channel_pruning(model, groups, threshold=1e-4).keep == {}, "without the norms nothing is dead"
    pruning = dead_channel_pruning(model, groups, threshold=1e-4, norms=following_norms(model, INPUTS))
    assert pruning.keep[conv] == {"out": [0, 2]} and pruning.keep["features.3.residual.3"] == {"in": [0, 2]}
    decision = Reconfiguration(keep=pruning.keep, remove=pruning.remove)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reconfigure(model, optimizer, decision, lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    model.eval()
    torch.testing.assert_close(model(INPUTS), before, rtol=1e-5, atol=1e-5)


def test_the_proximal_step_shrinks_every_group_by_rate_times_lambda_and_zeroes_the_small_ones() -> None:
    model = small_resnet(bottleneck=False).train()
    technique = create_technique("prunetrain", {"ratio": "0.2"})
    technique.start(model, Context(example_inputs=lambda: INPUTS))
    technique.objective(torch.tensor(2.0), model)
    path = "features.5.residual.0"  # a conv with regularised outputs and inputs
    assert technique._groups[path] == (True, True)
    weight = model.get_submodule(path).weight
    with torch.no_grad():
        weight[1].mul_(1e-6)  # one output channel far smaller than the shrink
    before = weight.detach().clone()
    first = "features.0.weight"  # its inputs (the image) are not regularised
    image_side = model.get_submodule("features.0").weight.detach().clone()
    technique.after_update(dict(model.named_parameters()), lr=0.5)
    amount = 0.5 * technique.weight
    expected = before.clone()
    rows = torch.linalg.vector_norm(expected.flatten(1), dim=1)
    expected *= (1 - amount / rows).clamp_min(0).view(-1, 1, 1, 1)
    columns = torch.linalg.vector_norm(expected.transpose(0, 1).flatten(1), dim=1)
    expected *= (1 - amount / columns.clamp_min(1e-30)).clamp_min(0).view(1, -1, 1, 1)
    torch.testing.assert_close(weight.detach(), expected)
    assert torch.count_nonzero(weight[1]) == 0, "a channel smaller than the shrink becomes exactly zero"
    assert technique._norms[path] == "features.5.residual.1"  # shrunk too: the next test
    assert torch.count_nonzero(weight[0]) == weight[0].numel()
    rows_first = torch.linalg.vector_norm(image_side.flatten(1), dim=1)
    torch.testing.assert_close(
        dict(model.named_parameters())[first].detach(),
        image_side * (1 - amount / rows_first).clamp_min(0).view(-1, 1, 1, 1),
    )


def test_lambda_uses_the_mean_of_every_workers_first_loss() -> None:
    model = small_resnet(bottleneck=False).train()
    technique = create_technique("prunetrain", {})
    seen = []

    def mean(name: str, value: float, weight: float) -> float:
        seen.append((name, value))
        return 4.0  # what the other workers' losses average to with ours

    technique.start(model, Context(example_inputs=lambda: INPUTS, mean=mean))
    technique.objective(torch.tensor(1.0), model)
    technique.objective(torch.tensor(9.0), model)  # later losses leave λ alone
    lasso = group_lasso(model, technique._groups, technique._norms).item()
    assert seen == [("prunetrain/loss", 1.0)]
    assert technique.weight == pytest.approx(lasso_weight(0.2, 4.0, lasso))
    assert technique.state_dict() == {
        "weight": technique.weight,
        "initial_parameters": sum(p.numel() for p in model.parameters()),
    }


def test_prunetrain_decides_only_every_interval_and_counts_fewer_flops_after() -> None:
    model = small_resnet(bottleneck=False).train()
    technique = create_technique("prunetrain", {"every": "2"})
    technique.start(model, Context(example_inputs=lambda: INPUTS))
    silence(model, "features.5.residual.0", "features.5.residual.1", [0, 1])
    assert technique.epoch_end(EpochEnd(epoch=0, batch_size=8, step=4), model) is None  # epoch 1 of 2
    decision = technique.epoch_end(EpochEnd(epoch=1, batch_size=8, step=8), model)
    assert decision is not None and decision.keep["features.5.residual.0"] == {"out": [2, 3, 4, 5, 6, 7]}
    flops = flops_per_sample(model, INPUTS)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    reconfigure(model, optimizer, decision, lambda parameters: torch.optim.SGD(parameters, lr=0.1))
    technique.reconfigured(model)
    assert flops_per_sample(model, INPUTS) < flops


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"ratio": "1.5"}, "between 0 and 1"),
        ({"every": "0"}, "N ≥ 1"),
        ({"weight": "3"}, "no option 'weight'"),
        ({"step": "newton"}, "step must be one of proximal, subgradient"),
    ],
)
def test_bad_prunetrain_options_name_the_fix(options: dict, message: str) -> None:
    from scaletrain.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        create_technique("prunetrain", options)
