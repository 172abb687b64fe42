"""Every weight of a built-in network learns from the data: its gradient is not zero in exact arithmetic.

A weight whose gradient is zero in exact arithmetic (a key's bias before softmax, a bias before a batch norm)
receives only rounding noise, which AdamW's ``m/√v`` scales up to steps of the rate's size, different in every
summation order: split workers would then drift from one process. Measured on ``gpt`` with a key bias: its
gradient was 2.7e-12 where the value's bias had 1.8e-2.
"""

from __future__ import annotations

import pytest
import torch

from scaletrain.workloads import create_workload

#: name, workload options, one batch of inputs (small shapes)
CASES = [
    ("lenet", {}, lambda: torch.randn(4, 1, 28, 28)),
    ("resnet20", {"dataset": "fashion-mnist"}, lambda: torch.randn(4, 1, 28, 28)),
    ("gpt", {"layers": "2", "heads": "2", "width": "16", "context": "8", "vocab_size": "50"},
     lambda: torch.randint(0, 50, (4, 8))),
]  # fmt: skip


@pytest.mark.parametrize(("name", "options", "inputs"), CASES, ids=[case[0] for case in CASES])
def test_every_weight_gets_a_gradient_above_rounding(name: str, options: dict, inputs) -> None:
    """Element by element, the largest gradient over 3 random batches against the largest of any weight."""
    torch.manual_seed(0)
    model = create_workload(name, options).build_model()
    seen = {parameter_name: torch.zeros_like(parameter) for parameter_name, parameter in model.named_parameters()}
    for _ in range(3):
        model.zero_grad()
        output = model(inputs()).float()
        (output * torch.randn_like(output)).sum().backward()
        for parameter_name, parameter in model.named_parameters():
            seen[parameter_name] = torch.maximum(seen[parameter_name], parameter.grad.abs())
    largest = max(grads.max().item() for grads in seen.values())
    for parameter_name, grads in seen.items():
        smallest = grads.min().item()
        assert smallest > 1e-6 * largest, f"{parameter_name}: {smallest:.1e} against {largest:.1e}"
