"""What a reconfiguration produces is well formed (scaletrain.efficient.surgery.check_well_formed): each parameter,
buffer and optimizer state in a storage of its own, contiguous, also when the old network's tensors were views
into one flat buffer, as a parameter server's worker keeps them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from scaletrain.efficient.base import Reconfiguration
from scaletrain.efficient.surgery import reconfigure
from scaletrain.efficient.well_formed import check_well_formed

pytestmark = pytest.mark.avx2  # CI runs this file on AVX2 kernels too (.ci/run)


def _flat_views(model: nn.Module) -> torch.Tensor:
    """Make every parameter and buffer of ``model`` a view into one flat buffer, as a parameter server's worker does."""
    tensors = [*model.parameters(), *(b for b in model.buffers() if b.is_floating_point())]
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    offset = 0
    for tensor in tensors:
        tensor.data = flat[offset : offset + tensor.numel()].view_as(tensor)
        offset += tensor.numel()
    return flat


def test_a_resized_network_owns_every_tensor_even_when_the_old_one_lived_in_a_flat_buffer() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.BatchNorm2d(6), nn.ReLU(), nn.Flatten(), nn.Linear(6 * 4 * 4, 5))
    flat = _flat_views(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 6, 6)).sum().backward()
    optimizer.step()
    kept = [0, 2, 5]
    columns = [c * 16 + i for c in kept for i in range(16)]
    decision = Reconfiguration(keep={"0": {"out": kept}, "1": {"out": kept}, "4": {"in": columns}})
    renewed = reconfigure(model, optimizer, decision, lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    # the linear layer keeps its bias whole: before, its new bias was still a view into the old flat buffer
    bias = model[4].bias
    assert bias.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()
    named = [*model.named_parameters(), *model.named_buffers()]
    named += [(f"state {key}", value) for state in renewed.state.values() for key, value in state.items()]
    check_well_formed(named)  # raises on a view, a strided tensor or a shared storage
    assert all(tensor.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr() for _, tensor in named)


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([("w", torch.zeros(4, 6)[:, :3])], "w is not contiguous"),
        ([("w", torch.zeros(10)[2:6])], "w is a view at offset 2 into 40 bytes"),
        ([("w", torch.zeros(10)[:4])], "w is a view at offset 0 into 40 bytes"),
        ([("w", torch.zeros(4, 4, 3, 3).contiguous(memory_format=torch.channels_last))], "w is not contiguous"),
    ],
)
def test_a_malformed_tensor_is_named(tensors: list, message: str) -> None:
    with pytest.raises(RuntimeError, match=message):
        check_well_formed(tensors)


def test_two_tensors_on_one_storage_are_named_and_one_tensor_twice_is_not() -> None:
    weight = torch.zeros(3)
    check_well_formed([("a", weight), ("again", weight)])
    alias = weight.view(3)
    with pytest.raises(RuntimeError, match="b shares its storage with a"):
        check_well_formed([("a", weight), ("b", alias)])
