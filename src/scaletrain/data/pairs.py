"""Datasets of ``(input, label)`` pairs for classification, and the checks that turn a dataset of another
shape, or a label the model has no output for, into one line naming the fix instead of a traceback from
deep inside a ``DataLoader`` or ``cross_entropy``.

The checks are cheap: a dataset's first sample when it is handed over, and a batch's labels (a look at two
numbers on the CPU).

    >>> from torch.utils.data import TensorDataset
    >>> DatasetData(TensorDataset(torch.zeros(3, 2), torch.tensor([0, 1, 2])), [(torch.zeros(2), "cat")])
    Traceback (most recent call last):
    scaletrain.errors.DataError: sample 0 of the test dataset has the label 'cat', not a class index; \
make the dataset's __getitem__ return (input, label): an input tensor and an int class index
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, IterableDataset

from scaletrain.errors import ConfigError, DataError

__all__ = ["DatasetData", "check_labels", "checked_pair"]

_PAIR_FIX = "make the dataset's __getitem__ return (input, label): an input tensor and an int class index"


@dataclass(frozen=True)
class DatasetData:
    """A training and a test set as map-style datasets whose samples are ``(input, label)`` pairs; checked
    when made, from their first samples."""

    train: Dataset
    test: Dataset

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            _check_pairs(getattr(self, split), f"the {split} dataset")


def check_labels(labels: torch.Tensor, classes: int, where: str) -> int:
    """``classes`` when every label is a class index of a model with that many outputs; else one line naming
    the fix.

    >>> check_labels(torch.tensor([0, 12]), 10, "the first training batch")
    Traceback (most recent call last):
    scaletrain.errors.DataError: the first training batch has label 12, outside the model's 10 classes (0 to 9); \
make the dataset's labels class indices 0 to 9, or give the model 13 outputs
    """
    low, high = int(labels.min()), int(labels.max())
    if low < 0 or high >= classes:
        raise DataError(
            f"{where} has label {low if low < 0 else high}, outside the model's {classes} classes "
            f"(0 to {classes - 1}); make the dataset's labels class indices 0 to {classes - 1}, or give the model "
            f"{max(high + 1, classes)} outputs"
        )
    return classes


def checked_pair(batch: Any, where: str, classes: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A collated batch as ``(inputs, int64 labels)``, its labels checked against ``classes`` when known.

    >>> checked_pair([torch.zeros(2, 3), torch.tensor([1, 0], dtype=torch.uint8)], "a batch")[1].dtype
    torch.int64
    """
    if not (isinstance(batch, list | tuple) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise DataError(f"{where} is not a pair of input and label tensors; {_PAIR_FIX}")
    inputs, labels = batch
    if labels.ndim != 1 or labels.is_floating_point() or labels.dtype == torch.bool or len(labels) != len(inputs):
        raise DataError(f"{where} has labels of shape {list(labels.shape)} and type {labels.dtype}; {_PAIR_FIX}")
    labels = labels.long()
    if classes is not None:
        check_labels(labels, classes, where)
    return inputs, labels


def _check_pairs(dataset: Any, what: str) -> None:
    """A map-style dataset whose first sample is an ``(input, label)`` pair; one line naming the fix if not."""
    if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise ConfigError(
            f"{what} is a {type(dataset).__name__}, not a map-style dataset; give an object with __len__ and "
            "__getitem__ (a torch.utils.data.Dataset), whose samples are read by index"
        )
    if len(dataset) == 0:
        raise DataError(f"{what} is empty")
    sample = dataset[0]
    if not (isinstance(sample, list | tuple) and len(sample) == 2):
        shown = f"a {type(sample).__name__}" + (f" of {len(sample)}" if isinstance(sample, list | tuple) else "")
        raise DataError(f"sample 0 of {what} is {shown}, not an (input, label) pair; {_PAIR_FIX}")
    inputs, label = sample
    if not isinstance(inputs, torch.Tensor | np.ndarray):
        raise DataError(
            f"sample 0 of {what} has a {type(inputs).__name__} as its input, not a tensor; {_PAIR_FIX} "
            "(torchvision: transform=ToTensor())"
        )
    index = label.item() if isinstance(label, torch.Tensor | np.ndarray) and label.ndim == 0 else label
    if isinstance(index, bool) or not isinstance(index, int | np.integer):
        raise DataError(f"sample 0 of {what} has the label {label!r}, not a class index; {_PAIR_FIX}")
