"""The workload interface: a model, its data, its loss and its quality metric.

A workload knows nothing about distribution. The training loop (and later each parallel strategy)
asks it for the batches of one epoch, optionally only one worker's part of each batch, and for the
loss of a batch. Adding a workload means one module with a :class:`Workload` subclass and one line in
:mod:`scaletrain.workloads`.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from scaletrain.data.loading import Loading
from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError

__all__ = ["Origin", "Part", "Workload", "WorkloadDefaults", "count_parameters", "parse_options"]


@dataclass(frozen=True)
class WorkloadDefaults:
    """Hyper-parameters a workload brings when the user does not set them (``loader_workers``: the worker
    processes of a workload that reads through a ``DataLoader``)."""

    epochs: int
    batch_size: int
    lr: float
    momentum: float = 0.0
    clip_norm: float | None = None
    loader_workers: int = 0
    optimizer: str = "sgd"
    lr_schedule: str = "step"
    lr_warmup: int = 0


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def parse_options(options_type: type, given: dict[str, Any]) -> Any:
    """Build a workload's options dataclass from strings or values, naming the valid keys on error."""
    known = {f.name: f for f in dataclasses.fields(options_type)}
    values: dict[str, Any] = {}
    for key, raw in given.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown workload option {key!r}; valid options: {', '.join(sorted(known)) or 'none'}")
        kind = type(getattr(options_type(), name))
        try:
            values[name] = _convert(raw, kind)
        except ValueError:
            raise ConfigError(f"workload option {key}={raw!r} is not a valid {kind.__name__}") from None
    try:
        return options_type(**values)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _convert(raw: Any, kind: type) -> Any:
    if not isinstance(raw, str):
        return kind(raw)
    if kind is bool:
        lowered = raw.lower()
        if lowered not in ("1", "0", "true", "false", "yes", "no"):
            raise ValueError(raw)
        return lowered in ("1", "true", "yes")
    return kind(raw)


@dataclass(frozen=True)
class Origin:
    """How to make a workload again in another process: ``create_workload(reference, options)``.

    ``reference`` is what it was made from: a registered name, the name of a workload an installed
    package declares, or a ``module:attribute`` reference (:mod:`scaletrain.workloads.reference`).
    """

    reference: str
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoOptions:
    """A workload without options."""


class Workload(ABC):
    """Model + data + loss + quality metric of one task.

    Subclasses set the class attributes and implement the abstract methods. ``state`` is whatever
    a workload carries from one batch to the next within an epoch (the LSTM's hidden state); it is
    ``None`` for stateless workloads and is saved in checkpoints.
    """

    name: str
    dataset: str
    metric: str  # key written to summary.json, e.g. "test_accuracy"
    #: Whether a larger :attr:`metric` is better; None: told by its name (a loss or a perplexity is lower-better).
    higher_is_better: bool | None = None
    defaults: WorkloadDefaults
    options_type: type = NoOptions
    #: What :func:`~scaletrain.workloads.create_workload` made it from; ``None`` for an object made otherwise,
    #: which reaches other processes pickled instead (:func:`scaletrain.train` with ``workers``).
    origin: Origin | None = None

    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = parse_options(self.options_type, options or {})

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A freshly initialised model (its initial weights follow torch's global seed)."""

    @abstractmethod
    def load_data(self, data_dir: Path | None, *, download: bool = True) -> Any:
        """Load the datasets; raise :class:`~scaletrain.errors.DataError` with the fix if impossible."""

    @abstractmethod
    def batches_per_epoch(self, data: Any, batch_size: int) -> int:
        """How many global batches of ``batch_size`` one epoch has."""

    @abstractmethod
    def train_batches(
        self,
        data: Any,
        *,
        epoch: int,
        batch_size: int,
        seed: int,
        part: Part = Part(),
        numbers: range | None = None,
    ) -> Iterator[Any]:
        """The epoch's batches with the given ``numbers`` (default: all), each cut down to ``part``.

        The order depends only on ``seed`` and ``epoch``, so every worker and a resumed run see the
        same global batches.
        """

    def set_loading(self, loading: Loading) -> None:
        """How this process reads the data (the run's ``loader_workers``, pinned memory on a GPU, ``timeout``),
        given before :meth:`load_data`. A workload that reads through a ``DataLoader`` keeps it; one whose data
        is in memory refuses loader workers, which it would not use."""
        if loading.workers:
            raise ConfigError(
                f"--loader-workers {loading.workers}: workload {self.name} holds its data in memory and reads it "
                "without a loader; loader workers are for workloads that read a torch Dataset "
                "(ClassificationWorkload.from_datasets); leave out --loader-workers"
            )

    def example_inputs(self, data: Any) -> Any:
        """A couple of inputs as the model takes them: techniques trace the network with them."""
        raise ConfigError(f"workload {self.name} gives no example inputs, which this technique needs to trace it")

    def initial_state(self, model: nn.Module, batch_rows: int) -> Any:
        """The state at the start of an epoch; ``None`` for stateless workloads."""
        return None

    @abstractmethod
    def training_loss(self, model: nn.Module, batch: Any, state: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Return ``(objective, loss_for_logging, next_state)`` for one batch.

        ``objective`` is what is differentiated; ``loss_for_logging`` is the per-sample (or per-word)
        mean loss people read, detached.
        """

    @abstractmethod
    def evaluate(self, model: nn.Module, data: Any) -> dict[str, float]:
        """Quality metrics on held-out data; must include :attr:`metric`."""

    def chance_quality(self, data: Any) -> float | None:
        """The :attr:`metric` of a model that learned nothing (guessing), or ``None`` if unknown: a run whose
        quality stays there while its loss falls is flagged (:func:`scaletrain.train.summary.quality_warning`)."""
        return None

    @property
    def lower_is_better(self) -> bool:
        """Whether a smaller :attr:`metric` is better (a loss, a perplexity, or as the workload says)."""
        if self.higher_is_better is not None:
            return not self.higher_is_better
        return "perplexity" in self.metric or "loss" in self.metric

    def describe(self) -> dict[str, Any]:
        """Name, dataset, metric and parameter count, for ``scaletrain workloads``."""
        return {
            "name": self.name,
            "dataset": self.dataset,
            "metric": self.metric,
            "parameters": count_parameters(self.build_model()),
        }
