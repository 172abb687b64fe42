"""Image (or any) classification: the base of ``lenet``, of the image networks and of user workloads.

Train your own model with the same loop, metrics and outputs as the built-in workloads::

    >>> import torch
    >>> from torch import nn
    >>> from scaletrain.workloads.classification import ClassificationWorkload
    >>> x, y = torch.randn(64, 4), torch.randint(0, 3, (64,))
    >>> workload = ClassificationWorkload.from_tensors(
    ...     "toy", lambda: nn.Linear(4, 3), train=(x, y), test=(x, y), batch_size=16)
    >>> workload.batches_per_epoch(workload.load_data(None), 16)
    4
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from scaletrain.data.sampler import Part
from scaletrain.errors import DataError
from scaletrain.workloads.base import Workload, WorkloadDefaults

__all__ = ["ClassificationData", "ClassificationWorkload", "epoch_permutation"]

EVAL_BATCH = 1000


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


def epoch_permutation(size: int, *, seed: int, epoch: int) -> torch.Tensor:
    """The order of the samples in one epoch; a function of seed and epoch only."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(size, generator=generator)


class ClassificationWorkload(Workload):
    """Softmax cross-entropy classification, metric: test accuracy (fraction correct, 0..1).

    Each epoch visits the training set in a fresh random order; the last incomplete batch is
    dropped so every batch (and every worker's share of it) has the same size.
    """

    metric: str = "test_accuracy"
    eval_batch_size: int = EVAL_BATCH  # test samples per forward pass

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
        order = epoch_permutation(self.train_size(data), seed=seed, epoch=epoch)
        share = part.slice(batch_size)
        # An empty ``numbers`` is no batch at all (an async worker whose share of a short epoch is none).
        for number in range(self.batches_per_epoch(data, batch_size)) if numbers is None else numbers:
            indices = order[number * batch_size : (number + 1) * batch_size][share]
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
        loss = F.cross_entropy(model(inputs), labels)
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
        for inputs, labels in self.test_batches(data):
            inputs, labels = inputs.to(device), labels.to(device)
            logits = model(inputs)
            total_loss += F.cross_entropy(logits, labels, reduction="sum").item()
            correct += (logits.argmax(dim=1) == labels).sum().item()
            count += len(labels)
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
