"""Ghost batch normalisation (Hoffer et al. 2017): against plain batch norm, chunk by chunk."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from tests.helpers import model_weights, run_cli
from torch import nn

import scaletrain
from scaletrain.efficient.ghost import GhostBatchNorm2d, ghost_batch_norm
from scaletrain.errors import ConfigError


def _pair(kind: type[nn.Module], channels: int, momentum: float | None) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    plain = kind(channels, momentum=momentum)
    with torch.no_grad():
        plain.weight.uniform_(0.5, 1.5)
        plain.bias.uniform_(-0.5, 0.5)
        plain.running_mean.uniform_(-1, 1)
        plain.running_var.uniform_(0.5, 2)
    ghost = copy.deepcopy(plain)
    holder = nn.Sequential(ghost)
    ghost_batch_norm(holder, 10**6)
    return plain, holder[0]


@pytest.mark.parametrize("momentum", [0.1, None])
@pytest.mark.parametrize(("kind", "shape"), [(nn.BatchNorm1d, (12, 5)), (nn.BatchNorm2d, (12, 5, 4, 3))])
def test_a_ghost_batch_as_large_as_the_batch_is_plain_batch_norm(kind, shape, momentum) -> None:
    plain, ghost = _pair(kind, shape[1], momentum)
    ghost.virtual_batch_size = shape[0]
    inputs = torch.randn(shape) * 3 + 1
    for _ in range(3):  # three steps: the running statistics compound
        mine, theirs = inputs.clone().requires_grad_(), inputs.clone().requires_grad_()
        out_ghost, out_plain = ghost(mine), plain(theirs)
        weights = torch.randn_like(out_plain)
        (out_ghost * weights).sum().backward()
        (out_plain * weights).sum().backward()
        torch.testing.assert_close(out_ghost, out_plain, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-5, atol=1e-5)
        inputs = inputs * 0.7 + 0.2
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(ghost, name), getattr(plain, name), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ghost.weight.grad, plain.weight.grad, rtol=1e-5, atol=1e-5)
    ghost.eval(), plain.eval()
    torch.testing.assert_close(ghost(inputs), plain(inputs))


def test_each_ghost_batch_is_normalised_alone_and_the_running_statistics_average_them() -> None:
    plain, ghost = _pair(nn.BatchNorm2d, 4, 0.25)
    ghost.virtual_batch_size = 4
    inputs = torch.randn(10, 4, 3, 3) * torch.arange(1, 11).view(10, 1, 1, 1)  # ghost batches differ in scale
    outputs = ghost(inputs)
    chunks = (inputs[:4], inputs[4:7], inputs[7:])  # ceil(10/4) = 3 nearly equal ghost batches
    means, variances = [], []
    start = 0
    for chunk in chunks:
        alone = copy.deepcopy(plain)
        alone.momentum = 1.0  # the running statistics become this chunk's own
        torch.testing.assert_close(outputs[start : start + len(chunk)], alone(chunk), rtol=1e-5, atol=1e-5)
        means.append(alone.running_mean)
        variances.append(alone.running_var)
        start += len(chunk)
    expected_mean = 0.75 * plain.running_mean + 0.25 * torch.stack(means).mean(0)
    expected_var = 0.75 * plain.running_var + 0.25 * torch.stack(variances).mean(0)
    torch.testing.assert_close(ghost.running_mean, expected_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ghost.running_var, expected_var, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(outputs, plain(inputs), atol=1e-3)  # and it is not plain batch norm


def test_the_transformation_keeps_parameters_buffers_and_state_dict() -> None:
    model = nn.Sequential(nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
    model(torch.randn(2, 1, 5, 5))
    before = dict(model.named_parameters())
    state = {key: value.clone() for key, value in model.state_dict().items()}
    assert ghost_batch_norm(model, 8) == 1
    assert isinstance(model[1], GhostBatchNorm2d) and isinstance(model[1], nn.BatchNorm2d)
    assert all(before[name] is parameter for name, parameter in model.named_parameters())
    assert model.state_dict().keys() == state.keys()
    assert "virtual_batch_size=8" in repr(model[1])


def test_bad_sizes_and_networks_without_batch_norm_are_refused() -> None:
    with pytest.raises(ConfigError, match="at least 2"):
        ghost_batch_norm(nn.Sequential(nn.BatchNorm1d(2)), 1)
    with pytest.raises(ConfigError, match="no batch norm"):
        ghost_batch_norm(nn.Sequential(nn.Linear(2, 2)), 8)


# -- in real runs ----------------------------------------------------------------------------------

RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "4"}
RUN = {"steps": 6, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1}


def test_a_run_with_ghost_batches_as_large_as_the_batch_ends_where_plain_batch_norm_does(
    tiny_fmnist: Path, tmp_path: Path
) -> None:
    """2 workers, split: each normalises its own 8 samples, so ghost batches of 8 change nothing and 4 do."""
    settings = {"options": RESNET, "data_dir": tiny_fmnist, "workers": 2, "sync": "split", **RUN}
    plain = scaletrain.train("resnet", out=tmp_path / "plain", **settings)
    same = scaletrain.train("resnet", out=tmp_path / "ghost8", ghost_batch=8, **settings)
    smaller = scaletrain.train("resnet", out=tmp_path / "ghost4", ghost_batch=4, **settings)
    assert (plain["ghost_batch"], same["ghost_batch"], smaller["ghost_batch"]) == (None, 8, 4)
    first, second, third = (model_weights(tmp_path / name) for name in ("plain", "ghost8", "ghost4"))
    for name in first:
        torch.testing.assert_close(second[name], first[name], rtol=1e-4, atol=1e-5)
    assert any(not torch.allclose(third[name].float(), first[name].float(), atol=1e-4) for name in first)


def test_a_network_without_batch_norm_or_a_ghost_batch_of_one_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for flags, message in (
        (["lenet", "--ghost-batch", "8"], "no batch norm"),
        (["resnet20", "--ghost-batch", "1"], "≥ 2"),
    ):
        result = run_cli("train", *flags, "--steps", "1", "--out", str(tmp_path / flags[-1]), timeout=120)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], result.stderr
