"""Two workloads written as plain functions (:func:`scaletrain.from_functions`), made by ``module:factory``:
a linear regression with a mean-squared-error loss, and a network with two heads (a class and a value) whose loss
adds both; each with its own evaluation and metric."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

import scaletrain


def _inputs(rows: int, seed: int) -> torch.Tensor:
    return torch.randn(rows, 6, generator=torch.Generator().manual_seed(seed))


TRUE_WEIGHTS = torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0, -1.0])


def linear() -> nn.Module:
    return nn.Linear(6, 1)


def squared_error(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return F.mse_loss(model(inputs).squeeze(1), targets)


def regression() -> scaletrain.FunctionsWorkload:
    train, test = _inputs(192, 1), _inputs(64, 2)
    return scaletrain.from_functions(
        linear, squared_error, train=(train, train @ TRUE_WEIGHTS), test=(test, test @ TRUE_WEIGHTS),
        name="regression", lr=0.05, momentum=0.9, batch_size=16,
    )  # fmt: skip


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU())
        self.classes, self.value = nn.Linear(16, 3), nn.Linear(16, 1)

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.body(inputs)
        return self.classes(hidden), self.value(hidden).squeeze(1)


def both_losses(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    inputs, labels, values = batch
    logits, predicted = model(inputs)
    classification = F.cross_entropy(logits, labels)
    return classification + F.mse_loss(predicted, values), classification.detach()


def accuracy_and_error(model: nn.Module, test: tuple[torch.Tensor, ...]) -> dict[str, float]:
    inputs, labels, values = test
    logits, predicted = model(inputs)
    return {
        "test_accuracy": float((logits.argmax(1) == labels).float().mean()),
        "test_value_error": float(F.mse_loss(predicted, values)),
    }


def _two_head_data(rows: int, seed: int) -> tuple[torch.Tensor, ...]:
    inputs = _inputs(rows, seed)
    return inputs, (inputs[:, 0] > 0).long() + (inputs[:, 1] > 0).long(), inputs @ TRUE_WEIGHTS


def two_heads() -> scaletrain.FunctionsWorkload:
    return scaletrain.from_functions(
        TwoHeads, both_losses, train=_two_head_data(192, 3), test=_two_head_data(64, 4), evaluate=accuracy_and_error,
        metric="test_accuracy", higher_is_better=True, name="two-heads", lr=0.05, batch_size=16,
    )  # fmt: skip
