"""A user's own workload in a module outside the package, named by reference
(``tests.workloads.own_workload:make_workload``) in tests/workloads/test_reference.py: a small MLP on four Gaussian
blobs that every process makes alike from the seed."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scaletrain import ClassificationWorkload

REFERENCE = f"{__name__}:make_workload"
FEATURES, CLASSES = 8, 4


def blobs(samples: int, *, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``samples`` points around four well-apart centres, with their centre's number as label."""
    generator = torch.Generator().manual_seed(seed)
    centres = 3 * torch.randn(CLASSES, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (samples,), generator=generator)
    return centres[labels] + torch.randn(samples, FEATURES, generator=generator), labels


def make_workload(options: dict[str, Any] | None = None) -> ClassificationWorkload:
    """The workload; option ``hidden``: the width of the hidden layer (default 16)."""
    hidden = int((options or {}).get("hidden", 16))
    inputs, labels = blobs(640)
    return ClassificationWorkload.from_tensors(
        "own-blobs",
        lambda: nn.Sequential(nn.Linear(FEATURES, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES)),
        train=(inputs[:512], labels[:512]),
        test=(inputs[512:], labels[512:]),
        batch_size=32,
        lr=0.05,
        epochs=2,
    )


# What a reference may wrongly name (each is one line and exit code 2 in the tests).
NOT_CALLABLE = 42


def needs_two(first: Any, second: Any) -> ClassificationWorkload:
    raise AssertionError("never called: its signature is refused first")


def returns_nothing() -> None:
    return None


def raises() -> ClassificationWorkload:
    raise ValueError("no blobs\ntoday")
