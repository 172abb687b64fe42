"""``resnet`` (and the presets ``resnet20``, ``resnet32``, ``resnet56``): the parametric ResNet of the
Dortmund thesis (004 §3.1.3; SPEC §4) for 32×32 CIFAR-10 or 28×28 Fashion-MNIST.

Shape: conv 3×3 ``width`` + BN + ReLU → ``stages`` stages of ``blocks`` residual blocks (widths ``width``·2^s; the
first block of every later stage halves the feature map with stride 2) → global average pool → FC 10. A block is
``layers`` conv + BN layers with ReLU between them: all 3×3 (basic), or 1×1 to reduce, ``layers`` − 2 of 3×3 and
1×1 to expand ×4 (bottleneck); ReLU follows the sum with the shortcut, which is a 1×1 conv + BN where the shape
changes (He et al.'s option B) and the identity elsewhere. Convolutions have no bias. The presets are He et al.'s
(2016, §4.2: 6n+2 layers, widths 16/32/64) with n = 3, 5 and 9 blocks per stage; docs/workloads.md compares their
parameter counts with the published ones.

Blocks are modules with ``residual``, ``shortcut`` and ``relu`` children, so PruneTrain can replace a block whose
residual branch lost all its channels by its shortcut (:mod:`scaletrain.efficient.surgery`).

Options (``-o KEY=VALUE``): ``dataset`` (``cifar10`` or ``fashion-mnist``), ``stages`` (3), ``blocks`` (per stage:
one number for all, or ``3,4,6``), ``layers`` (2 for basic, 3 for bottleneck by default), ``bottleneck`` (false),
``width`` (16), ``augment`` (``auto``: random crop with padding 4 and horizontal flip on CIFAR-10 only; ``on``;
``off``), ``train_samples`` (0: the whole training set; N: its first N images, for short experiments; the test set
stays whole).

>>> from scaletrain.workloads import create_workload
>>> from scaletrain.workloads.base import count_parameters
>>> count_parameters(create_workload("resnet32").build_model())
466906
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from scaletrain.data import cifar
from scaletrain.data.idx import find_fashion_mnist, load_fashion_mnist
from scaletrain.errors import ConfigError
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import ClassificationData, ClassificationWorkload

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "ResNet", "ResNetOptions", "ResNetWorkload", "ResidualBlock"]

DATASETS = ("cifar10", "fashion-mnist")
#: The CIFAR-10 training set's per-channel mean and deviation of pixels scaled to [0, 1] (as computed
#: and published with many CIFAR ResNet implementations; recomputing them on the 50,000 images agrees).
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)
PAD = 4  # random-crop padding of the standard CIFAR augmentation (He et al. 2016, §4.2)
EXPANSION = 4  # bottleneck output channels per stage width


@dataclass(frozen=True)
class ResNetOptions:
    """Workload options of the parametric ResNet (``-o key=value``)."""

    dataset: str = "cifar10"
    stages: int = 3
    blocks: str = "3"
    layers: int = 0  # 0: 2 for basic blocks, 3 for bottleneck blocks
    bottleneck: bool = False
    width: int = 16
    augment: str = "auto"
    train_samples: int = 0  # 0: the whole training set; N: its first N images (short experiments)

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {self.dataset!r}")
        if self.stages < 1 or self.width < 1:
            raise ValueError("stages and width must be ≥ 1")
        counts = self.blocks_per_stage
        if len(counts) not in (1, self.stages) or min(counts) < 1:
            raise ValueError(
                f"blocks must be one count ≥ 1 or {self.stages} comma-separated counts, got {self.blocks!r}"
            )
        if self.layers and self.layers < (3 if self.bottleneck else 1):
            raise ValueError("a bottleneck block needs layers ≥ 3 (1×1, 3×3…, 1×1); a basic block layers ≥ 1")
        if self.train_samples < 0:
            raise ValueError(f"train_samples must be ≥ 0 (0: all), got {self.train_samples}")
        if self.augment not in ("auto", "on", "off"):
            raise ValueError(f"augment must be auto, on or off, got {self.augment!r}")

    @property
    def blocks_per_stage(self) -> list[int]:
        try:
            counts = [int(part) for part in str(self.blocks).split(",")]
        except ValueError:
            raise ValueError(f"blocks must be whole numbers separated by commas, got {self.blocks!r}") from None
        return counts * self.stages if len(counts) == 1 else counts

    @property
    def block_layers(self) -> int:
        return self.layers or (3 if self.bottleneck else 2)

    @property
    def augmenting(self) -> bool:
        return self.augment == "on" or (self.augment == "auto" and self.dataset == "cifar10")


def _conv_bn(in_channels: int, out_channels: int, kernel_size: int, stride: int = 1) -> list[nn.Module]:
    conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride, padding=kernel_size // 2, bias=False)
    return [conv, nn.BatchNorm2d(out_channels)]


class ResidualBlock(nn.Module):
    """``layers`` conv + BN layers (ReLU between them) plus a shortcut, then ReLU."""

    def __init__(self, in_channels: int, width: int, stride: int, layers: int, bottleneck: bool) -> None:
        super().__init__()
        if bottleneck:
            kernels, widths = [1] + [3] * (layers - 2) + [1], [width] * (layers - 1) + [width * EXPANSION]
        else:
            kernels, widths = [3] * layers, [width] * layers
        strided = kernels.index(3) if 3 in kernels else 0  # the stride sits on the first 3×3 convolution
        parts: list[nn.Module] = []
        channels = in_channels
        for index, (kernel, out) in enumerate(zip(kernels, widths, strict=True)):
            parts += _conv_bn(channels, out, kernel, stride if index == strided else 1)
            if index < layers - 1:
                parts.append(nn.ReLU(inplace=True))
            channels = out
        self.residual = nn.Sequential(*parts)
        changes_shape = stride != 1 or in_channels != channels
        self.shortcut = nn.Sequential(*_conv_bn(in_channels, channels, 1, stride)) if changes_shape else nn.Identity()
        self.relu = nn.ReLU(inplace=True)
        self.out_channels = channels

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.relu(self.residual(inputs) + self.shortcut(inputs))


class ResNet(nn.Module):
    """The parametric ResNet for small images (any size: the pooling at the end is global)."""

    def __init__(self, options: ResNetOptions, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = [*_conv_bn(in_channels, options.width, 3), nn.ReLU(inplace=True)]
        channels = options.width
        for stage, count in enumerate(options.blocks_per_stage):
            width = options.width * 2**stage
            for block in range(count):
                stride = 2 if stage > 0 and block == 0 else 1
                unit = ResidualBlock(channels, width, stride, options.block_layers, options.bottleneck)
                layers.append(unit)
                channels = unit.out_channels
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes))
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


@dataclass(frozen=True)
class _Images(ClassificationData):
    """Training images kept as uint8 (CIFAR-10: 150 MB rather than 600 MB), normalised per batch."""

    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()


class ResNetWorkload(ClassificationWorkload):
    """The parametric ResNet on CIFAR-10 or Fashion-MNIST; metric: test accuracy."""

    name: str = "resnet"
    dataset: str = "CIFAR-10 (50,000 train / 10,000 test, 32×32 colour, 10 classes) or Fashion-MNIST"
    # He et al. (2016) §4.2: batch 128, lr 0.1, momentum 0.9 (and weight decay 1e-4: --weight-decay).
    defaults: WorkloadDefaults = WorkloadDefaults(epochs=10, batch_size=128, lr=0.1, momentum=0.9)
    options_type = ResNetOptions
    preset_blocks: str | None = None

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        given = dict(options or {})
        if self.preset_blocks is not None:
            fixed = {"blocks": self.preset_blocks, "stages": 3, "bottleneck": False, "layers": 0}
            for key, value in fixed.items():
                if key in given and str(given[key]).lower() != str(value).lower():
                    raise ConfigError(f"{self.name} fixes {key} (to {value}); use the workload 'resnet' to choose it")
            given["blocks"] = self.preset_blocks
        super().__init__(given)
        self._augmentation: tuple[int, int, torch.Tensor, torch.Tensor] | None = None

    def build_model(self) -> nn.Module:
        return ResNet(self.options, in_channels=3 if self.options.dataset == "cifar10" else 1)

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ClassificationData:
        first = slice(None, self.options.train_samples or None)
        if self.options.dataset == "fashion-mnist":
            fmnist = load_fashion_mnist(find_fashion_mnist(data_dir, download=download))
            return ClassificationData(
                fmnist.train_images[first], fmnist.train_labels[first], fmnist.test_images, fmnist.test_labels
            )
        images = cifar.load_cifar10(cifar.find_cifar10(data_dir, download=download))
        return _Images(
            images.train_images[first],
            images.train_labels[first],
            images.test_images,
            images.test_labels,
            CIFAR10_MEAN,
            CIFAR10_STD,
        )

    def train_samples(self, data: ClassificationData, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._normalised(data, data.train_inputs[indices]), data.train_labels[indices]

    def test_batches(self, data: ClassificationData):
        for inputs, labels in super().test_batches(data):
            yield self._normalised(data, inputs), labels

    def augment(self, inputs: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int) -> torch.Tensor:
        """Random crop (padding 4) and horizontal flip, drawn per sample from ``seed`` and ``epoch`` only,
        so every worker and a resumed run augment each sample alike."""
        if not self.options.augmenting:
            return inputs
        shifts, flips = self._draws(seed, epoch, indices.max().item() + 1)
        return crop_and_flip(inputs, shifts[indices], flips[indices])

    def _draws(self, seed: int, epoch: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        cached = self._augmentation
        if cached is None or cached[:2] != (seed, epoch) or len(cached[2]) < size:
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch + 7)
            count = max(size, 65_536)
            shifts = torch.randint(0, 2 * PAD + 1, (count, 2), generator=generator)
            flips = torch.rand(count, generator=generator) < 0.5
            self._augmentation = cached = (seed, epoch, shifts, flips)
        return cached[2], cached[3]

    @staticmethod
    def _normalised(data: ClassificationData, images: torch.Tensor) -> torch.Tensor:
        if not isinstance(data, _Images):
            return images
        mean = torch.tensor(data.mean).view(1, -1, 1, 1)
        std = torch.tensor(data.std).view(1, -1, 1, 1)
        return (images.float() / 255.0 - mean) / std


def crop_and_flip(images: torch.Tensor, shifts: torch.Tensor, flips: torch.Tensor) -> torch.Tensor:
    """Each image zero-padded by 4, cropped back to its size at ``shifts[i]`` (0…8 per axis), and
    mirrored left-right where ``flips[i]``.

    >>> image = torch.arange(4.0).view(1, 1, 2, 2)
    >>> crop_and_flip(image, torch.tensor([[PAD, PAD]]), torch.tensor([True]))[0, 0].tolist()
    [[1.0, 0.0], [3.0, 2.0]]
    """
    height, width = images.shape[-2:]
    padded = F.pad(images, (PAD, PAD, PAD, PAD))
    out = torch.stack([padded[i, :, y : y + height, x : x + width] for i, (y, x) in enumerate(shifts.tolist())])
    return torch.where(flips.view(-1, 1, 1, 1), out.flip(-1), out)


class ResNet20Workload(ResNetWorkload):
    """ResNet-20 (n = 3)."""

    name = "resnet20"
    preset_blocks = "3"


class ResNet32Workload(ResNetWorkload):
    """ResNet-32 (n = 5), the network of the Dortmund thesis's and PruneTrain's CIFAR-10 experiments."""

    name = "resnet32"
    preset_blocks = "5"


class ResNet56Workload(ResNetWorkload):
    """ResNet-56 (n = 9)."""

    name = "resnet56"
    preset_blocks = "9"
