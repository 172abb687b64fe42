"""Image (or any) classification: the base of ``lenet``, of the image networks and of user workloads.

Train your own model with the same loop, metrics and outputs as the built-in workloads, on tensors in
memory or on any map-style ``torch.utils.data.Dataset`` (read through a ``DataLoader``)::

    >>> import torch
    >>> from torch import nn
    >>> from torch.utils.data import TensorDataset
    >>> from scaletrain.workloads.classification import ClassificationWorkload
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> workload = ClassificationWorkload.from_tensors(
    ...     "toy", lambda: nn.Linear(4, 3), train=(x, y), test=(x, y), batch_size=16)
    >>> workload.batches_per_epoch(workload.load_data(None), 16)
    4
    >>> read = ClassificationWorkload.from_datasets(
    ...     lambda: nn.Linear(4, 3), TensorDataset(x, y), TensorDataset(x, y), name="toy", loader_workers=2)
    >>> read.batches_per_epoch(read.load_data(None), 16), read.defaults.loader_workers
    (4, 2)
"""

from __future__ import annotations

import contextlib
from abc import abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import Dataset, default_collate

from scaletrain.data.loading import Loading, load_batches
from scaletrain.data.pairs import DatasetData, check_labels, checked_pair
from scaletrain.data.sampler import EpochBatches, Part, epoch_permutation
from scaletrain.errors import ConfigError, DataError
from scaletrain.workloads.base import Workload, WorkloadDefaults

__all__ = ["ClassificationData", "ClassificationWorkload", "DatasetClassification", "DatasetData", "epoch_permutation"]

#: test samples a forward pass takes. Small enough that no buffer of a forward pass reaches glibc's 32 MiB mmap
#: threshold (src/scaletrain/train/runtime.py), where every batch maps and faults its buffers in afresh, and that
#: a layer's output stays in cache: on one thread of a 2-core Xeon (2026-12-06), 5,000 images took ResNet-20 4.17 s
#: in batches of 1,000 (613k page faults) and 2.76 s in batches of 128 (none), LeNet 0.358 s and 0.284 s
#: (``benchmarks/evaluation_batch.py``, medians of 3).
EVAL_BATCH = 128


@dataclass(frozen=True)
class ClassificationData:
    """Inputs and integer class labels of a training and a test set."""

    train_inputs: torch.Tensor
    train_labels: torch.Tensor
    test_inputs: torch.Tensor
    test_labels: torch.Tensor

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            inputs, labels = getattr(self, f"{split}_inputs"), getattr(self, f"{split}_labels")
            if len(inputs) != len(labels):
                raise DataError(f"{split} set has {len(inputs)} inputs but {len(labels)} labels")
            if len(inputs) == 0:
                raise DataError(f"{split} set is empty")


class ClassificationWorkload(Workload):
    """Softmax cross-entropy classification, metric: test accuracy (fraction correct, 0..1).

    Each epoch visits the training set in a fresh random order; the last incomplete batch is
    dropped so every batch (and every worker's share of it) has the same size.
    """

    metric: str = "test_accuracy"
    eval_batch_size: int = EVAL_BATCH  # test samples per forward pass
    _classes: int | None = None  # the model's outputs, once the first training batch has shown them

    @classmethod
    def from_tensors(
        cls,
        name: str,
        model_factory: Callable[[], nn.Module],
        *,
        train: tuple[torch.Tensor, torch.Tensor],
        test: tuple[torch.Tensor, torch.Tensor],
        batch_size: int = 32,
        lr: float = 0.01,
        momentum: float = 0.9,
        epochs: int = 1,
    ) -> ClassificationWorkload:
        """A workload for your own model and data held in tensors ``(inputs, labels)``."""
        data = ClassificationData(train[0], train[1].long(), test[0], test[1].long())
        defaults = WorkloadDefaults(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum)
        return _TensorClassification(name, model_factory, data, defaults)

    @classmethod
    def from_datasets(
        cls,
        model_factory: Callable[[], nn.Module],
        train_dataset: Dataset,
        test_dataset: Dataset,
        *,
        name: str = "datasets",
        batch_size: int = 32,
        lr: float = 0.01,
        momentum: float = 0.9,
        epochs: int = 1,
        loader_workers: int = 0,
    ) -> DatasetClassification:
        """A workload for your own model and map-style datasets whose samples are ``(input, label)`` pairs,
        read through a ``DataLoader`` with ``loader_workers`` worker processes (a run's ``loader_workers``
        wins; see :class:`DatasetClassification`)."""
        if isinstance(model_factory, str):
            raise ConfigError(
                f"from_datasets takes the model factory first and the name as a keyword: "
                f"from_datasets(make_model, train_dataset, test_dataset, name={model_factory!r})"
            )
        data = DatasetData(train_dataset, test_dataset)
        defaults = WorkloadDefaults(
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            momentum=momentum,
            loader_workers=Loading(loader_workers).workers,
        )
        return _GivenDatasets(name, model_factory, data, defaults)

    def batches_per_epoch(self, data: Any, batch_size: int) -> int:
        return self.train_size(data) // batch_size

    # The three hooks below are all that a subclass with its own kind of data (uint8 images
    # normalised per batch, images generated on demand) overrides; order, parts and metrics stay here.

    def train_size(self, data: ClassificationData) -> int:
        """Number of training samples."""
        return len(data.train_inputs)

    def train_samples(self, data: ClassificationData, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Model inputs and labels of the training samples at ``indices``."""
        return data.train_inputs[indices], data.train_labels[indices]

    def test_batches(self, data: ClassificationData) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The test set as ``(inputs, labels)`` batches of at most :attr:`eval_batch_size` samples."""
        for begin in range(0, len(data.test_inputs), self.eval_batch_size):
            end = begin + self.eval_batch_size
            yield data.test_inputs[begin:end], data.test_labels[begin:end]

    def train_batches(
        self,
        data: Any,
        *,
        epoch: int,
        batch_size: int,
        seed: int,
        part: Part = Part(),
        numbers: range | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = EpochBatches(
            self.train_size(data), batch_size=batch_size, seed=seed, epoch=epoch, part=part, numbers=numbers
        )
        for number in batches.numbers:
            indices = batches.indices(number)
            inputs, labels = self.train_samples(data, indices)
            yield self.augment(inputs, indices, seed=seed, epoch=epoch), labels

    def augment(self, inputs: torch.Tensor, indices: torch.Tensor, *, seed: int, epoch: int) -> torch.Tensor:
        """Training inputs after data augmentation (none here); a function of the sample ``indices``,
        ``seed`` and ``epoch`` only, so that every worker's part of a batch is augmented as in one process."""
        return inputs

    def example_inputs(self, data: ClassificationData) -> torch.Tensor:
        """Two test inputs, as the model takes them (to trace the network or count its FLOPs)."""
        return next(self.test_batches(data))[0][:2]

    def training_loss(
        self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], state: Any
    ) -> tuple[torch.Tensor, torch.Tensor, Any]:
        inputs, labels = batch
        logits = model(inputs)
        if self._classes is None:  # this process's first batch: one look at its labels against the outputs
            self._classes = check_labels(labels, logits.shape[-1], "the first training batch")
        try:
            loss = F.cross_entropy(logits, labels)
        except IndexError:  # a later batch's label out of range, as the CPU reports it
            check_labels(labels, logits.shape[-1], "a training batch")
            raise
        return loss, loss.detach(), None

    def chance_quality(self, data: Any) -> float:
        """The accuracy of always answering the test set's most common class."""
        labels = getattr(data, "test_labels", None)
        if labels is None:
            labels = torch.cat([labels for _, labels in self.test_batches(data)])
        return float(torch.bincount(labels.long()).max()) / max(len(labels), 1)

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: Any) -> dict[str, float]:
        was_training = model.training
        model.eval()
        correct, total_loss, count = 0, 0.0, 0
        device = next(model.parameters()).device
        batches = self.test_batches(data)
        try:
            for inputs, labels in batches:
                inputs, labels = inputs.to(device), labels.to(device)
                logits = model(inputs)
                check_labels(labels, logits.shape[-1], "a test batch")  # beside .item() below: no extra wait
                total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
                correct += (logits.argmax(dim=1) == labels).sum().item()
                count += len(labels)
        finally:  # a loader's workers stop now, also when a batch is refused
            close = getattr(batches, "close", None)
            if close is not None:
                close()
        model.train(was_training)
        return {"test_accuracy": correct / count, "test_loss": total_loss / count}


class _TensorClassification(ClassificationWorkload):
    """A classification workload over a user's model factory and in-memory data."""

    def __init__(
        self,
        name: str,
        model_factory: Callable[[], nn.Module],
        data: ClassificationData,
        defaults: WorkloadDefaults,
    ) -> None:
        super().__init__()
        self.name = name
        self.dataset = f"user tensors ({len(data.train_inputs)} train / {len(data.test_inputs)} test)"
        self.defaults = defaults
        self._model_factory = model_factory
        self._data = data

    def build_model(self) -> nn.Module:
        return self._model_factory()

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ClassificationData:
        return self._data


class DatasetClassification(ClassificationWorkload):
    """Classification over map-style ``torch.utils.data.Dataset`` objects, read through a ``DataLoader``.

    Each sample is an ``(input, label)`` pair: an input tensor (or array) and a class index. Batches hold the
    same samples in the same order as the tensor workloads' (:class:`~scaletrain.data.sampler.EpochBatches`
    is the loader's batch sampler), so every strategy gets its exact share of each global batch, a resumed
    run continues the order, and a split run equals one process. The run's :class:`~scaletrain.data.loading.Loading`
    says how many worker processes read (``loader_workers``). Random transforms inside a dataset run in
    whichever loader worker reads the sample, so they differ between layouts; :meth:`augment`, a function
    of the indices, seed and epoch, does not.

    Make one from dataset objects with :meth:`ClassificationWorkload.from_datasets`, or subclass it with
    :meth:`datasets` (and ``name``, ``dataset``, ``defaults``, ``build_model``) and register the class, so
    that the processes the local launcher starts can build it too.
    """

    loading: Loading = Loading()
    _chance: float | None = None  # the most common test label's share, from the last full pass

    def set_loading(self, loading: Loading) -> None:
        self.loading = loading

    @abstractmethod
    def datasets(self, data_dir: Path | None, *, download: bool = True) -> tuple[Dataset, Dataset]:
        """The training and the test dataset."""

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> DatasetData:
        return DatasetData(*self.datasets(data_dir, download=download))

    def train_size(self, data: DatasetData) -> int:
        return len(data.train)

    def train_samples(self, data: DatasetData, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self._pair(default_collate([data.train[index] for index in indices.tolist()]), "a training batch")

    def train_batches(
        self,
        data: Any,
        *,
        epoch: int,
        batch_size: int,
        seed: int,
        part: Part = Part(),
        numbers: range | None = None,
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = EpochBatches(
            len(data.train), batch_size=batch_size, seed=seed, epoch=epoch, part=part, numbers=numbers
        )
        # the workers' generators seeded by seed and epoch: the same random transforms in a resumed run
        read = load_batches(data.train, batches, self.loading, seed=seed * 1_000_003 + epoch)
        with contextlib.closing(read):
            for number, batch in zip(batches.numbers, read, strict=True):
                inputs, labels = self._pair(batch, "a training batch")
                yield self.augment(inputs, batches.indices(number), seed=seed, epoch=epoch), labels

    def test_batches(self, data: DatasetData) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        size = len(data.test)
        batches = [
            list(range(begin, min(begin + self.eval_batch_size, size)))
            for begin in range(0, size, self.eval_batch_size)
        ]
        seen = []
        with contextlib.closing(load_batches(data.test, batches, self.loading, seed=0)) as read:
            for batch in read:
                inputs, labels = self._pair(batch, "a test batch")
                seen.append(labels)
                yield inputs, labels
        self._chance = float(torch.bincount(torch.cat(seen).clamp(min=0)).max()) / size

    def chance_quality(self, data: Any) -> float | None:
        """The accuracy of always answering the most common test label, once an evaluation has read the test
        set (reading it again only for this would cost a second pass)."""
        return self._chance

    def example_inputs(self, data: DatasetData) -> torch.Tensor:
        return default_collate([data.test[index] for index in range(min(2, len(data.test)))])[0]

    def _pair(self, batch: Any, where: str) -> tuple[torch.Tensor, torch.Tensor]:
        # the labels checked against the model's classes once the first batch has shown them: a look at a few
        # numbers on the CPU, before they travel to a device
        return checked_pair(batch, where, self._classes)


class _GivenDatasets(DatasetClassification):
    """A dataset workload over a user's model factory and dataset objects."""

    def __init__(
        self, name: str, model_factory: Callable[[], nn.Module], data: DatasetData, defaults: WorkloadDefaults
    ) -> None:
        super().__init__()
        self.name = name
        kind = type(data.train).__name__
        self.dataset = f"user datasets ({kind}: {len(data.train)} train / {len(data.test)} test)"
        self.defaults = defaults
        self._model_factory = model_factory
        self._data = data

    def build_model(self) -> nn.Module:
        return self._model_factory()

    def datasets(self, data_dir: Path | None, *, download: bool = True) -> tuple[Dataset, Dataset]:
        return self._data.train, self._data.test

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> DatasetData:
        return self._data  # checked when the workload was made
