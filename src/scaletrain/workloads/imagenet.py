"""What the four ImageNet-class CNNs of Šlampa (2017, ch. 2; SPEC §4) share: options, data, loss and metric.

``vgg16e``, ``googlenet``, ``squeezenet`` and ``resnet34`` differ only in their model; each is an
:class:`ImageClassificationWorkload` with one ``build_model``. Their data is either an image folder
(Caltech256's ``256_ObjectCategories``: one sub-folder per class, see :mod:`scaletrain.data.image_folder`) or, with
``-o data=synthetic``, random images made on demand, which time a network without any data: their accuracy means
nothing, and the workload's ``dataset`` text (written to ``summary.json``) says so. Images are kept as uint8 and
normalised per batch with the ImageNet channel means and deviations, a quarter of float32's memory
(docs/workloads.md gives Caltech256's).

Workload options (``-o KEY=VALUE``, or ``--num-classes`` / ``--image-size``): ``num_classes`` (257: Caltech256 as
its archive ships, 256 object classes and clutter), ``image_size`` (224; 128 for ``vgg16e`` as in the thesis table;
at least 32), ``data`` (``folder`` or ``synthetic``), ``synthetic_train`` / ``synthetic_test`` (sample counts),
``test_fraction`` (the share of each class's images held out for testing, spread evenly).

>>> from scaletrain.workloads import create_workload
>>> workload = create_workload("squeezenet", {"data": "synthetic", "image_size": "32", "synthetic_train": "8"})
>>> inputs, labels = next(workload.train_batches(workload.load_data(None), epoch=0, batch_size=4, seed=0))
>>> tuple(inputs.shape), inputs.dtype, labels.shape
((4, 3, 32, 32), torch.float32, torch.Size([4]))
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from scaletrain.data.image_folder import find_image_folder, image_cache_dir, load_image_folder
from scaletrain.data.synthetic import SyntheticImages
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import ClassificationWorkload

__all__ = [
    "DATA_MODES",
    "MIN_IMAGE_SIZE",
    "ImageClassificationWorkload",
    "ImageData",
    "ImageOptions",
    "ImageSet",
    "init_weights",
    "normalise",
]

DATA_MODES = ("folder", "synthetic")
#: Every network halves its input five times; below 32 pixels nothing is left to pool.
MIN_IMAGE_SIZE = 32
# The ImageNet channel statistics every reference implementation of these networks normalises with.
_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


@dataclass(frozen=True)
class ImageOptions:
    """Workload options of the image networks (``-o key=value``)."""

    num_classes: int = 257
    image_size: int = 224
    data: str = "folder"
    synthetic_train: int = 1024
    synthetic_test: int = 256
    test_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.num_classes < 2:
            raise ValueError(f"workload option num_classes must be ≥ 2, got {self.num_classes}")
        if self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(
                f"workload option image_size must be ≥ {MIN_IMAGE_SIZE} (the networks halve it five times), "
                f"got {self.image_size}; pass --image-size {MIN_IMAGE_SIZE} or more"
            )
        if self.data not in DATA_MODES:
            raise ValueError(f"workload option data must be one of {', '.join(DATA_MODES)}, got {self.data!r}")
        for name in ("synthetic_train", "synthetic_test"):
            if getattr(self, name) < 1:
                raise ValueError(f"workload option {name} must be ≥ 1, got {getattr(self, name)}")
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"workload option test_fraction must be between 0 and 1, got {self.test_fraction}")


class ImageSet(Protocol):
    """Labelled uint8 images, N×3×S×S, read by index (in memory, or generated on demand)."""

    def __len__(self) -> int: ...

    def take(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass(frozen=True)
class ImageData:
    """The training and test images of one run."""

    train: ImageSet
    test: ImageSet


def normalise(images: torch.Tensor) -> torch.Tensor:
    """uint8 RGB images → float inputs with the ImageNet channel means and deviations removed."""
    return (images.float() / 255.0 - _MEAN) / _STD


def init_weights(model: nn.Module) -> None:
    """Kaiming-normal convolutions (He et al. 2015, for ReLU), N(0, 0.01) linear layers, zero biases, unit BN."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, 0.01)
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
        else:
            continue
        if module.bias is not None:
            nn.init.zeros_(module.bias)


class ImageClassificationWorkload(ClassificationWorkload):
    """An image classification network on an image folder or on synthetic images; metric: test accuracy.

    Subclasses set ``name`` and implement ``build_model`` (and may change ``options_type`` or
    ``training_loss``, as GoogLeNet does for its auxiliary heads).
    """

    options_type: type = ImageOptions
    defaults: WorkloadDefaults = WorkloadDefaults(epochs=1, batch_size=32, lr=0.01, momentum=0.9)
    eval_batch_size: int = 64  # a 224×224 batch of 64 is 38 MB of inputs; 1000 would be 600 MB

    def __init__(self, options: dict[str, object] | None = None) -> None:
        super().__init__(options)
        o = self.options
        size = f"{o.image_size}×{o.image_size}"
        if o.data == "synthetic":
            self.dataset = (
                f"synthetic random {size} images, {o.num_classes} classes, {o.synthetic_train} train / "
                f"{o.synthetic_test} test (for timing only; accuracy is meaningless)"
            )
        else:
            self.dataset = (
                f"Caltech256 (30,607 images, 257 classes) or another image folder at {size}, "
                f"{o.test_fraction:.0%} of each class held out"
            )

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ImageData:
        o = self.options
        if o.data == "synthetic":
            return ImageData(
                SyntheticImages(o.synthetic_train, o.image_size, o.num_classes, split="train"),
                SyntheticImages(o.synthetic_test, o.image_size, o.num_classes, split="test"),
            )
        loaded = load_image_folder(
            find_image_folder(data_dir),
            image_size=o.image_size,
            test_fraction=o.test_fraction,
            num_classes=o.num_classes,
            cache=image_cache_dir(),
        )
        return ImageData(loaded.train, loaded.test)

    def train_size(self, data: ImageData) -> int:
        return len(data.train)

    def train_samples(self, data: ImageData, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = data.train.take(indices)
        return normalise(images), labels

    def test_batches(self, data: ImageData) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for begin in range(0, len(data.test), self.eval_batch_size):
            images, labels = data.test.take(torch.arange(begin, min(begin + self.eval_batch_size, len(data.test))))
            yield normalise(images), labels
