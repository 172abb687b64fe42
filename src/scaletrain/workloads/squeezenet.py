"""``squeezenet``: SqueezeNet v1.0 as in Šlampa (2017, table 2.4; SPEC §4), after Iandola et al. (2016).

conv 7×7/2 96 → max-pool 3×3/2 → fire 2, 3, 4 → max-pool → fire 5, 6, 7, 8 → max-pool → fire 9 →
dropout 0.5 → conv 1×1 classes → ReLU → global average pool. A fire module squeezes with a 1×1
convolution and expands with parallel 1×1 and 3×3 convolutions whose outputs are concatenated; all
convolutions have biases and ReLU. Pools round up (``ceil_mode``) as in the authors' Caffe model.
1,248,424 parameters at 1000 classes. The last convolution starts from N(0, 0.01) as in the
reference implementation; the others are Kaiming-initialised.
"""

from __future__ import annotations

import torch
from torch import nn

from scaletrain.workloads.imagenet import ImageClassificationWorkload, init_weights

__all__ = ["Fire", "SqueezeNet", "SqueezeNetWorkload"]


class Fire(nn.Module):
    """Squeeze (1×1) then expand (1×1 ‖ 3×3), each followed by ReLU."""

    def __init__(self, in_channels: int, squeeze: int, expand1x1: int, expand3x3: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(in_channels, squeeze, kernel_size=1), nn.ReLU(inplace=True))
        self.expand1x1 = nn.Sequential(nn.Conv2d(squeeze, expand1x1, kernel_size=1), nn.ReLU(inplace=True))
        self.expand3x3 = nn.Sequential(nn.Conv2d(squeeze, expand3x3, kernel_size=3, padding=1), nn.ReLU(inplace=True))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        squeezed = self.squeeze(inputs)
        return torch.cat([self.expand1x1(squeezed), self.expand3x3(squeezed)], dim=1)


class SqueezeNet(nn.Module):
    """SqueezeNet v1.0 for 3×S×S images, S ≥ 32 (global pooling: any size works)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, kernel_size=7, stride=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(96, 16, 64, 64),
            Fire(128, 16, 64, 64),
            Fire(128, 32, 128, 128),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(256, 32, 128, 128),
            Fire(256, 48, 192, 192),
            Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Fire(512, 64, 256, 256),
        )
        final = nn.Conv2d(512, num_classes, kernel_size=1)
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), final, nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d(1), nn.Flatten()
        )
        init_weights(self)
        # Kaiming's fan-out scale would make the class scores huge at the start.
        nn.init.normal_(final.weight, 0.0, 0.01)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


class SqueezeNetWorkload(ImageClassificationWorkload):
    """SqueezeNet v1.0 on an image folder (Caltech256) or synthetic images; metric: test accuracy."""

    name: str = "squeezenet"

    def build_model(self) -> nn.Module:
        return SqueezeNet(self.options.num_classes)
