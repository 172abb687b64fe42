"""A workload from plain functions, for any model and any loss: a model factory, ``loss(model, batch)``, the
training and test data, and optionally ``evaluate(model, test)`` with its metric and direction.

``loss`` returns the objective (a scalar tensor), or ``(objective, logged)`` where ``logged`` is the scalar the
run reports (default: the objective, detached). Data: a tuple of tensors sharing their first dimension (a batch
is the same rows of each), or a map-style ``Dataset`` (a batch is its samples collated); the test data may also
be any iterable of batches. Batches are cut from one shuffled order per epoch exactly as the built-in workloads'
(:class:`~scaletrain.data.sampler.EpochBatches`), so ``split`` over N workers computes what one process does.
Without ``evaluate`` the metric is ``test_loss``, the mean of ``loss`` over the test batches (lower is better).

    >>> import torch
    >>> from torch import nn
    >>> x = torch.randn(64, 3); y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1
    >>> regression = from_functions(lambda: nn.Linear(3, 1), lambda m, b: ((m(b[0]).squeeze(1) - b[1]) ** 2).mean(),
    ...                             train=(x, y), test=(x[:16], y[:16]), name="regression", lr=0.1)
    >>> regression.metric, regression.lower_is_better
    ('test_loss', True)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from scaletrain.data.sampler import EpochBatches, Part
from scaletrain.errors import ConfigError
from scaletrain.workloads.base import Workload, WorkloadDefaults

__all__ = ["FunctionsWorkload", "from_functions"]

Loss = Callable[[nn.Module, Any], "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"]
Evaluate = Callable[[nn.Module, Any], dict[str, float]]
TEST_BATCH = 256  # test rows per batch where the test data is tensors or a dataset


def from_functions(
    model: Callable[[], nn.Module],
    loss: Loss,
    *,
    train: tuple[torch.Tensor, ...] | Dataset,
    test: tuple[torch.Tensor, ...] | Dataset | Iterable[Any],
    evaluate: Evaluate | None = None,
    metric: str = "test_loss",
    higher_is_better: bool = False,
    name: str = "functions",
    batch_size: int = 32,
    lr: float = 0.01,
    momentum: float = 0.9,
    epochs: int = 1,
) -> FunctionsWorkload:
    """A workload over these functions and data (see the module); ``metric`` names the key of ``evaluate``'s
    result that ``summary.json`` reports, ``higher_is_better`` its direction."""
    if not callable(model) or not callable(loss):
        raise ConfigError("from_functions takes a model factory and a loss function (model, batch) -> loss first")
    if evaluate is None and (metric != "test_loss" or higher_is_better):
        raise ConfigError(f"metric {metric!r} comes from an evaluate function; give evaluate=, or drop metric=")
    _check_data(train, "train")
    defaults = WorkloadDefaults(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum)
    return FunctionsWorkload(name, model, loss, train, test, evaluate, metric, higher_is_better, defaults)


def _check_data(data: Any, which: str) -> None:
    if isinstance(data, tuple | list):
        rows = {len(tensor) for tensor in data if torch.is_tensor(tensor)}
        if len(rows) != 1 or not all(torch.is_tensor(tensor) for tensor in data):
            raise ConfigError(f"{which}= must be tensors with the same number of rows (a tuple), or a Dataset")
    elif not (hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        raise ConfigError(f"{which}= must be a tuple of tensors or a map-style Dataset (one with len and [i])")


class FunctionsWorkload(Workload):
    """The workload :func:`from_functions` makes (picklable when its functions are importable ones)."""

    dataset = "user data"

    def __init__(
        self,
        name: str,
        model: Callable[[], nn.Module],
        loss: Loss,
        train: Any,
        test: Any,
        evaluate: Evaluate | None,
        metric: str,
        higher_is_better: bool,
        defaults: WorkloadDefaults,
    ) -> None:
        super().__init__()
        self.name, self.metric, self.defaults = name, metric, defaults
        self.higher_is_better = higher_is_better
        self._model, self._loss, self._evaluate = model, loss, evaluate
        self._data = (train, test)

    def build_model(self) -> nn.Module:
        return self._model()

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> tuple[Any, Any]:
        return self._data

    def batches_per_epoch(self, data: tuple[Any, Any], batch_size: int) -> int:
        return _rows(data[0]) // batch_size

    def train_batches(
        self, data: tuple[Any, Any], *, epoch: int, batch_size: int, seed: int, part: Part = Part(), numbers=None
    ) -> Iterator[Any]:
        batches = EpochBatches(
            _rows(data[0]), batch_size=batch_size, seed=seed, epoch=epoch, part=part, numbers=numbers
        )
        for number in batches.numbers:
            yield _take(data[0], batches.indices(number))

    def example_inputs(self, data: tuple[Any, Any]) -> Any:
        batch = _take(data[0], torch.arange(min(2, _rows(data[0]))))
        return batch[0] if isinstance(batch, tuple | list) else batch

    def training_loss(self, model: nn.Module, batch: Any, state: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        result = self._loss(model, batch)
        objective, logged = result if isinstance(result, tuple) else (result, result)
        if not (torch.is_tensor(objective) and objective.dim() == 0):
            raise ConfigError(f"workload {self.name}: loss must return a scalar tensor (or (objective, logged))")
        return objective, logged.detach(), None

    @torch.no_grad()
    def evaluate(self, model: nn.Module, data: tuple[Any, Any]) -> dict[str, float]:
        was_training = model.training
        model.eval()
        try:
            if self._evaluate is not None:
                result = {key: float(value) for key, value in self._evaluate(model, data[1]).items()}
                if self.metric not in result:
                    raise ConfigError(f"workload {self.name}: evaluate returned {sorted(result)}, not {self.metric!r}")
                return result
            device = next(model.parameters()).device
            total, count = 0.0, 0
            for batch in _test_batches(data[1]):
                _, logged = self.training_loss(model, _to(batch, device), None)[:2]
                total, count = total + float(logged), count + 1
            return {"test_loss": total / max(count, 1)}
        finally:
            model.train(was_training)


def _rows(data: Any) -> int:
    return len(data[0]) if isinstance(data, tuple | list) else len(data)


def _take(data: Any, indices: torch.Tensor) -> Any:
    if isinstance(data, tuple | list):
        return tuple(tensor[indices] for tensor in data)
    return default_collate([data[int(index)] for index in indices])


def _test_batches(test: Any) -> Iterator[Any]:
    if isinstance(test, tuple | list) or (hasattr(test, "__getitem__") and hasattr(test, "__len__")):
        rows = _rows(test)
        for begin in range(0, rows, TEST_BATCH):
            yield _take(test, torch.arange(begin, min(begin + TEST_BATCH, rows)))
    else:
        yield from test


def _to(batch: Any, device: torch.device) -> Any:
    if torch.is_tensor(batch):
        return batch.to(device)
    if isinstance(batch, tuple | list):
        return type(batch)(_to(value, device) for value in batch)
    if isinstance(batch, dict):
        return {key: _to(value, device) for key, value in batch.items()}
    return batch
