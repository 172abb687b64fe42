"""``resnet34``: ResNet-34 as in Šlampa (2017, table 2.5; SPEC §4), after He et al. (2016).

conv 7×7/2 64 + BN + ReLU → max-pool 3×3/2 → basic blocks 3×64, 4×128, 6×256, 3×512 → global average
pool → FC. A basic block is two 3×3 convolutions with batch normalisation, ReLU after the first and
after the sum with the shortcut. The first block of each later stage halves the feature map with a
stride-2 first convolution; its shortcut is a 1×1/2 convolution with BN (He et al.'s option B, the
thesis also allows zero padding). Convolutions have no bias (the BN after them has one).
21,797,672 parameters at 1000 classes.
"""

from __future__ import annotations

import torch
from torch import nn

from scaletrain.workloads.imagenet import ImageClassificationWorkload, init_weights

__all__ = ["BasicBlock", "ResNet34", "ResNet34Workload"]

#: (blocks, channels) of the four stages.
STAGES = ((3, 64), (4, 128), (6, 256), (3, 512))


def _conv_bn(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False)
    return [conv, nn.BatchNorm2d(out_channels)]


class BasicBlock(nn.Module):
    """Two 3×3 conv + BN with a shortcut; a stride or a width change gets a 1×1 conv + BN shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            *_conv_bn(in_channels, out_channels, 3, stride),
            nn.ReLU(inplace=True),
            *_conv_bn(out_channels, out_channels, 3),
        )
        changes_shape = stride != 1 or in_channels != out_channels
        self.shortcut = (
            nn.Sequential(*_conv_bn(in_channels, out_channels, 1, stride)) if changes_shape else nn.Identity()
        )
        self.relu = nn.ReLU(inplace=True)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.relu(self.residual(inputs) + self.shortcut(inputs))


class ResNet34(nn.Module):
    """ResNet-34 for 3×S×S images, S ≥ 32 (global pooling: any size works)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, padding=1)]
        channels = 64
        for stage, (blocks, width) in enumerate(STAGES):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(channels, width, stride))
                channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
        init_weights(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


class ResNet34Workload(ImageClassificationWorkload):
    """ResNet-34 on an image folder (Caltech256) or synthetic images; metric: test accuracy."""

    name: str = "resnet34"

    def build_model(self) -> nn.Module:
        return ResNet34(self.options.num_classes)
