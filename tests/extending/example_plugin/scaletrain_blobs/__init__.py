"""An example plug-in: ``pip install`` this package and ``scaletrain train blobs`` trains its workload, on any
number of workers; its ``pyproject.toml`` declares it in the entry-point group ``scaletrain.workloads``."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from scaletrain import ClassificationWorkload, ConfigError

__all__ = ["make_blobs"]

FEATURES = 8


def make_blobs(options: dict[str, Any]) -> ClassificationWorkload:
    """Gaussian blobs around ``classes`` centres (option, default 3) in 8 dimensions; a 8-32-classes MLP."""
    unknown = set(options) - {"classes"}
    if unknown:
        raise ConfigError(f"blobs has no option {', '.join(sorted(unknown))}; its one option is classes")
    classes = int(options.get("classes", 3))
    generator = torch.Generator().manual_seed(0)
    centres = 3 * torch.randn(classes, FEATURES, generator=generator)
    labels = torch.randint(0, classes, (640,), generator=generator)
    inputs = centres[labels] + torch.randn(640, FEATURES, generator=generator)
    return ClassificationWorkload.from_tensors(
        "blobs",
        lambda: nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, classes)),
        train=(inputs[:512], labels[:512]),
        test=(inputs[512:], labels[512:]),
        batch_size=32,
        lr=0.05,
        epochs=2,
    )
