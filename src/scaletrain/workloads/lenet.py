"""``lenet``: the LeNet-5 variant on Fashion-MNIST used by Jäger (2018, SPEC §4).

conv 5×5/1 20 → tanh → max-pool 2×2/2 → conv 5×5/1 50 → tanh → max-pool 2×2/2 → FC 500 → tanh → FC 10,
no padding (28 → 24 → 12 → 8 → 4), 431,080 parameters. The thesis trains it with plain SGD,
batch 512, lr 0.025 for 8 epochs; our default (batch 32, lr 0.01, momentum 0.9, 2 epochs) reaches
≥ 85 % test accuracy in 2 epochs.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from scaletrain.data.idx import find_fashion_mnist, load_fashion_mnist
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import ClassificationData, ClassificationWorkload

__all__ = ["LeNet5", "LeNetWorkload"]


class LeNet5(nn.Module):
    """LeNet-5 with tanh activations for 1×28×28 inputs (Jäger 2018, listings 5.12/5.19)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 20, kernel_size=5),
            nn.Tanh(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(20, 50, kernel_size=5),
            nn.Tanh(),
            nn.MaxPool2d(2, 2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(50 * 4 * 4, 500),
            nn.Tanh(),
            nn.Linear(500, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(images))


class LeNetWorkload(ClassificationWorkload):
    """LeNet-5 on Fashion-MNIST; metric: test accuracy."""

    name: str = "lenet"
    dataset: str = "Fashion-MNIST (60,000 train / 10,000 test, 28×28 grey, 10 classes)"
    defaults: WorkloadDefaults = WorkloadDefaults(epochs=2, batch_size=32, lr=0.01, momentum=0.9)

    def build_model(self) -> nn.Module:
        return LeNet5()

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ClassificationData:
        directory = find_fashion_mnist(data_dir, download=download)
        fmnist = load_fashion_mnist(directory)
        return ClassificationData(fmnist.train_images, fmnist.train_labels, fmnist.test_images, fmnist.test_labels)
