"""``vgg16e``: VGG16E as in Šlampa (2017, table 2.1; SPEC §4), after Simonyan & Zisserman (2015).

16 convolutions 3×3/1 with padding 1 and ReLU in blocks of 2×64, 2×128, 4×256, 4×512 and 4×512, each
block followed by max-pool 2×2/2, then FC 512·(S/32)² → 4096 → 4096 → classes with ReLU and dropout
0.5 between them. The thesis table feeds 128×128 images, so the first FC is 8192×4096 and 128 is this
workload's default ``image_size``; at 1000 classes that is 74,461,224 parameters (20,024,384 in the
convolutions, 54,436,840 in the FC layers). There is no adaptive pooling: the first FC grows with the
image (224×224 gives 25088×4096).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from scaletrain.workloads.imagenet import ImageClassificationWorkload, ImageOptions, init_weights

__all__ = ["VGG16E", "VGG16EOptions", "VGG16EWorkload"]

#: Output channels of the convolutions of each block; every block ends with a max-pool.
BLOCKS = ((64, 64), (128, 128), (256, 256, 256, 256), (512, 512, 512, 512), (512, 512, 512, 512))


class VGG16E(nn.Module):
    """VGG16E for 3×S×S images, S ≥ 32; the first FC layer has 512·(S//32)² inputs."""

    def __init__(self, num_classes: int = 1000, image_size: int = 128) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for block in BLOCKS:
            for width in block:
                layers += [nn.Conv2d(channels, width, kernel_size=3, padding=1), nn.ReLU(inplace=True)]
                channels = width
            layers.append(nn.MaxPool2d(2, 2))
        self.features = nn.Sequential(*layers)
        side = image_size // 2 ** len(BLOCKS)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(channels * side * side, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )
        init_weights(self)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


@dataclass(frozen=True)
class VGG16EOptions(ImageOptions):
    """The image options with the thesis table's 128×128 input as default."""

    image_size: int = 128


class VGG16EWorkload(ImageClassificationWorkload):
    """VGG16E on an image folder (Caltech256) or synthetic images; metric: test accuracy."""

    name: str = "vgg16e"
    options_type: type = VGG16EOptions

    def build_model(self) -> nn.Module:
        return VGG16E(self.options.num_classes, self.options.image_size)
