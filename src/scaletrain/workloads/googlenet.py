"""``googlenet``: GoogLeNet (Inception v1) as in Šlampa (2017, tables 2.2 and 2.3; SPEC §4).

Szegedy et al. (2015): conv 7×7/2 64 → max-pool 3×3/2 → conv 1×1 64 → conv 3×3 192 → max-pool →
inception 3a, 3b → max-pool → 4a … 4e → max-pool → 5a, 5b → global average pool → dropout 0.4 →
linear. An inception module runs four branches side by side and concatenates them: 1×1; 1×1 reduce
→ 3×3; 1×1 reduce → "5×5"; max-pool 3×3/1 → 1×1 projection (widths in :data:`INCEPTION`). Two
auxiliary classifiers read the outputs of 4a and 4d during training only (table 2.3: average pool to
4×4, conv 1×1 128, FC 2048 → 1024 with ReLU, dropout 0.7, FC → classes); the training objective is
main + 0.3 · (aux1 + aux2) as in the paper, and evaluation uses the main head alone.

Where this differs from the paper, and why: the project's issue pins the parameter count at
6,624,904 (without the auxiliary heads, 1000 classes), the count of the widely used reference
implementation (torchvision's). Counting by hand, only that implementation's structure gives it:

- every convolution is conv (no bias) + batch normalisation (eps 0.001) + ReLU — the paper predates
  batch normalisation and has plain convolutions with biases;
- the "5×5" branch convolves with a 3×3 kernel (a known quirk of that implementation).

The paper's structure (biases, no BN, 5×5) would have 6,998,552 parameters. With both auxiliary
heads there are 13,004,888 (the heads hold 6,379,984). Pools round up (``ceil_mode``), as in the
authors' Caffe model, so that every image size from 32 pixels up works.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from scaletrain.workloads.imagenet import ImageClassificationWorkload, init_weights

__all__ = ["AUX_WEIGHT", "INCEPTION", "GoogLeNet", "GoogLeNetOutputs", "GoogLeNetWorkload", "googlenet_loss"]

#: Weight of each auxiliary classifier's loss in the training objective (Szegedy et al. 2015).
AUX_WEIGHT = 0.3
#: Inception widths (table 2.2): 1×1, 3×3 reduce, 3×3, 5×5 reduce, 5×5, pool projection.
INCEPTION = {
    "3a": (64, 96, 128, 16, 32, 32),
    "3b": (128, 128, 192, 32, 96, 64),
    "4a": (192, 96, 208, 16, 48, 64),
    "4b": (160, 112, 224, 24, 64, 64),
    "4c": (128, 128, 256, 24, 64, 64),
    "4d": (112, 144, 288, 32, 64, 64),
    "4e": (256, 160, 320, 32, 128, 128),
    "5a": (256, 160, 320, 32, 128, 128),
    "5b": (384, 192, 384, 48, 128, 128),
}
_POOL_AFTER = ("3b", "4e")  # a max-pool 3×3/2 follows these modules
_AUX_AFTER = ("4a", "4d")


class GoogLeNetOutputs(NamedTuple):
    """What the network returns in training mode with auxiliary heads."""

    logits: torch.Tensor
    aux1: torch.Tensor
    aux2: torch.Tensor


def _conv(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False),
        nn.BatchNorm2d(out_channels, eps=0.001),
        nn.ReLU(inplace=True),
    )


class Inception(nn.Module):
    """Four parallel branches, concatenated along the channels."""

    def __init__(self, in_channels: int, widths: tuple[int, int, int, int, int, int]) -> None:
        super().__init__()
        one, reduce3, three, reduce5, five, pool = widths
        self.branches = nn.ModuleList(
            [
                _conv(in_channels, one, 1),
                nn.Sequential(_conv(in_channels, reduce3, 1), _conv(reduce3, three, 3)),
                nn.Sequential(_conv(in_channels, reduce5, 1), _conv(reduce5, five, 3)),  # "5×5": see module doc
                nn.Sequential(nn.MaxPool2d(3, 1, padding=1, ceil_mode=True), _conv(in_channels, pool, 1)),
            ]
        )
        self.out_channels = one + three + five + pool

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return torch.cat([branch(inputs) for branch in self.branches], dim=1)


class AuxiliaryClassifier(nn.Module):
    """Table 2.3: average pool to 4×4, conv 1×1 128, FC 2048 → 1024, ReLU, dropout 0.7, FC → classes."""

    def __init__(self, in_channels: int, num_classes: int) -> None:
        super().__init__()
        # Adaptive rather than 5×5/3 pooling: the same 4×4 map (at 224 pixels) for any image size.
        self.layers = nn.Sequential(
            nn.AdaptiveAvgPool2d(4),
            _conv(in_channels, 128, 1),
            nn.Flatten(),
            nn.Linear(128 * 4 * 4, 1024),
            nn.ReLU(inplace=True),
            nn.Dropout(0.7),
            nn.Linear(1024, num_classes),
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.layers(inputs)


class GoogLeNet(nn.Module):
    """GoogLeNet for 3×S×S images, S ≥ 32.

    In training mode with ``aux_logits`` it returns :class:`GoogLeNetOutputs`; otherwise the main
    logits. ``GoogLeNet(aux_logits=False)`` leaves the auxiliary heads out altogether.
    """

    def __init__(self, num_classes: int = 1000, *, aux_logits: bool = True) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            _conv(3, 64, 7, 2),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            _conv(64, 64, 1),
            _conv(64, 192, 3),
            nn.MaxPool2d(3, 2, ceil_mode=True),
        )
        self.stages = nn.ModuleDict()
        self.pools = nn.ModuleDict({name: nn.MaxPool2d(3, 2, ceil_mode=True) for name in _POOL_AFTER})
        self.aux = nn.ModuleDict()
        channels = 192
        for name, widths in INCEPTION.items():
            module = Inception(channels, widths)
            self.stages[name] = module
            channels = module.out_channels
            if aux_logits and name in _AUX_AFTER:
                self.aux[name] = AuxiliaryClassifier(channels, num_classes)
        self.head = nn.Sequential(
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.4), nn.Linear(channels, num_classes)
        )
        init_weights(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor | GoogLeNetOutputs:
        features = self.stem(images)
        aux: list[torch.Tensor] = []
        for name, module in self.stages.items():
            features = module(features)
            if self.training and name in self.aux:
                aux.append(self.aux[name](features))
            if name in self.pools:
                features = self.pools[name](features)
        logits = self.head(features)
        return GoogLeNetOutputs(logits, *aux) if aux else logits


def googlenet_loss(outputs: torch.Tensor | GoogLeNetOutputs, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(objective, main-head loss)``: main + :data:`AUX_WEIGHT` · (aux1 + aux2) when the aux heads ran.

    >>> labels = torch.tensor([0])
    >>> outputs = GoogLeNetOutputs(torch.zeros(1, 2), torch.zeros(1, 2), torch.zeros(1, 2))
    >>> objective, main = googlenet_loss(outputs, labels)  # log 2 · (1 + 0.3 · 2)
    >>> round(objective.item(), 4), round(main.item(), 4)
    (1.109, 0.6931)
    """
    if not isinstance(outputs, GoogLeNetOutputs):
        main = F.cross_entropy(outputs, labels)
        return main, main
    main = F.cross_entropy(outputs.logits, labels)
    aux = F.cross_entropy(outputs.aux1, labels) + F.cross_entropy(outputs.aux2, labels)
    return main + AUX_WEIGHT * aux, main


class GoogLeNetWorkload(ImageClassificationWorkload):
    """GoogLeNet on an image folder (Caltech256) or synthetic images; metric: test accuracy.

    The objective adds the auxiliary losses; the logged loss is the main head's, comparable with the
    test loss.
    """

    name: str = "googlenet"

    def build_model(self) -> nn.Module:
        return GoogLeNet(self.options.num_classes)

    def training_loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], state: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        inputs, labels = batch
        objective, main = googlenet_loss(model(inputs), labels)
        return objective, main.detach(), None
