"""A user's Fashion-MNIST read image by image from the IDX file (:mod:`scaletrain.data.idx_lazy`), through a
``DataLoader`` with worker processes, for the loader tests (tests/parallel/test_loader_workers.py).

Two ways to the same data and network: :func:`workload`, a ``ClassificationWorkload.from_datasets`` object
(trained by processes started with the torchrun variables, tests/jobs/datasets_job.py), and
``lazy-fashion``, a :class:`~scaletrain.workloads.classification.DatasetClassification` class that the local
launcher's processes build when ``SCALETRAIN_PLUGINS`` names :mod:`tests.parallel.lazy_fashion_plugin`, which
registers it. When ``LAZY_FASHION_READERS``
names a folder, every sample read is noted there with the process that read it (:class:`Recorded`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import Dataset

import scaletrain
from scaletrain.data.idx_lazy import IdxImages, lazy_fashion_mnist
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import DatasetClassification

ENV_READERS = "LAZY_FASHION_READERS"
PLUGIN_MODULE = "tests.parallel.lazy_fashion_plugin"  # registers LazyFashion as lazy-fashion
BATCH = 12  # the global batch of a split step, each worker's of a join step
LOADER_WORKERS = 2


def network() -> nn.Module:
    """A small convolutional network for 28×28 grey images (cheap enough for many short runs)."""
    return nn.Sequential(nn.Conv2d(1, 4, 5, stride=2), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 12 * 12, 10))


class Recorded(Dataset):
    """``dataset`` as it is, each sample read noted in ``folder``: its index appended to the file
    ``SPLIT-PARENT-PID`` of the reading process (``PID``) and of its parent (``PARENT``, the training process
    when a loader worker reads)."""

    def __init__(self, dataset: IdxImages, folder: Path, split: str) -> None:
        self.dataset, self.folder, self.split = dataset, folder, split

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        with (self.folder / f"{self.split}-{os.getppid()}-{os.getpid()}").open("a") as notes:
            notes.write(f"{index}\n")
        return self.dataset[index]


def datasets(data_dir: Path | None, *, download: bool = True) -> tuple[Dataset, Dataset]:
    train, test = lazy_fashion_mnist(data_dir, download=download)
    readers = os.environ.get(ENV_READERS)
    if not readers:
        return train, test
    Path(readers).mkdir(parents=True, exist_ok=True)
    return Recorded(train, Path(readers), "train"), Recorded(test, Path(readers), "test")


def workload(data_dir: Path) -> DatasetClassification:
    """The ``from_datasets`` object: the network above on the lazily read files of ``data_dir``."""
    return scaletrain.ClassificationWorkload.from_datasets(
        network, *datasets(data_dir), name="lazy-fashion", batch_size=BATCH, lr=0.05, loader_workers=LOADER_WORKERS
    )


class Broken(Dataset):
    """``dataset`` with samples of another shape: ``"pairs"``, the image alone; ``"labels"``, the label 10 classes
    further (past the network's outputs) for every sample but those ``spared``."""

    def __init__(self, dataset: Dataset, how: str, spared: frozenset[int] = frozenset()) -> None:
        self.dataset, self.how, self.spared = dataset, how, spared

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> object:
        image, label = self.dataset[index]
        if self.how == "pairs":
            return image
        return image, label if index in self.spared else label + 10


@dataclass(frozen=True)
class Options:
    broken: str = ""  # "pairs" or "labels": the training set's samples broken as Broken says


class LazyFashion(DatasetClassification):
    """The same as a registered workload class: every process reads the files of ``--data-dir`` itself."""

    name = "lazy-fashion"
    dataset = "Fashion-MNIST read image by image from the IDX file"
    defaults = WorkloadDefaults(epochs=1, batch_size=BATCH, lr=0.05, momentum=0.9, loader_workers=LOADER_WORKERS)
    options_type = Options

    def build_model(self) -> nn.Module:
        return network()

    def datasets(self, data_dir: Path | None, *, download: bool = True) -> tuple[Dataset, Dataset]:
        train, test = datasets(data_dir, download=download)
        return (Broken(train, self.options.broken) if self.options.broken else train), test
