"""What one process's run is made of: the contracts between the loop and a strategy (:class:`Agreement`,
:class:`Role`), the run built before the first step (:class:`Prepared`), and the rules every process
applies alike (learning rate, when a checkpoint is due, the optimizer).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.efficient import Context, Reconfiguration, Technique
from scaletrain.efficient.surgery import Architecture
from scaletrain.errors import ConfigError
from scaletrain.tensors.device import to_device
from scaletrain.tensors.optimizers import build_optimizer
from scaletrain.train.compiled import TrainingForward
from scaletrain.train.exchange import GradientExchange, LocalExchange
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.runtime import ProcessSettings
from scaletrain.train.schedule import Position, Schedule
from scaletrain.workloads import Workload

__all__ = [
    "Agreement",
    "Membership",
    "Prepared",
    "Regrouped",
    "Role",
    "checkpoint_due",
    "count_steps_per_epoch",
    "learning_rate",
    "learning_rate_at_step",
    "make_optimizer",
]


class Agreement:
    """How the processes of a run agree on a reconfiguration: here, the one process decides alone.

    :class:`scaletrain.parallel.agreement.StoreAgreement` has one process decide and the others read.
    """

    def agree(self, epoch: int, decide: Callable[[], Reconfiguration | None]) -> Reconfiguration | None:
        return decide()

    def mean(self, name: str, value: float, weight: float) -> float:
        """The ``weight``-weighted mean of ``value`` over the workers: here, the value itself."""
        return value

    def share(self, state: dict[str, Any]) -> None:
        """Hand what only workers compute — the technique's state — from the deciding worker to processes
        that train nothing (a central parameter server, which writes the checkpoints and the final model):
        here, nobody else needs it."""

    def shared(self) -> dict[str, Any] | None:
        """What the deciding worker shared last (``technique``), if anything."""
        return None

    def buffers_due(self, step: int, model: nn.Module) -> None:
        """A worker's module buffers (batch-norm running statistics, a user's running average or mask) at
        ``step``, after whose update a checkpoint is due: synchronous workers all take the mean over the
        workers; asynchronous ones publish theirs for whoever writes the model. Here: one worker, its own."""

    def buffers_final(self, model: nn.Module) -> None:
        """A worker's buffers when it has no step left (asynchronous workers publish them): here, nothing."""

    def worker_buffers(self, step: int | None) -> dict[str, torch.Tensor] | None:
        """For a process that writes the model without training it: the mean over the workers of their
        buffers at ``step`` (synchronous), or of what each published last (``None``). Here: nobody's."""
        return None


class Membership:
    """Which workers take part in each step of an elastic run (``--min-workers``), how the survivors of a lost
    worker go on, and how workers started later join:
    :class:`scaletrain.parallel.strategies.elastic.StoreMembership`. Here, the base contract."""

    #: Set by the exchange when every member has learnt, in the same step, that a worker waits to join: the
    #: loop admits it at that step's end (:meth:`admit`).
    join_due: bool = False

    def join_requested(self) -> bool:
        """Whether a worker waits to join (the deciding member asks; the others answer no)."""
        return False

    def admit(self, live_state: Callable[[], dict[str, Any]]) -> tuple[Regrouped, dict[str, Any]]:
        """At the step boundary where ``join_due``: admit the waiting workers, rebuild the group with them and
        return the new plan with the live state every member (and joiner) continues from. Raises
        :class:`~scaletrain.train.exchange.PeerLost` (no step in flight) when one of them never comes."""
        raise NotImplementedError

    def regroup(
        self, step: int, why: str | None, live_state: Callable[[], dict[str, Any]], *, in_flight: bool = True
    ) -> tuple[Regrouped, dict[str, Any] | None]:
        """After a lost peer at ``step`` (this worker's position, the step in flight not applied; no step in
        flight when ``in_flight`` is False): agree on the survivors, rebuild the group over them, and return
        their plan with the live state (``live_state()`` of the survivor furthest ahead) every survivor
        continues from, or None when this worker already holds it (a central server's weights came with its
        reply). Raises :class:`~scaletrain.train.exchange.PeerLost` when another member is lost while
        the group is rebuilt."""
        raise NotImplementedError


@dataclass(frozen=True)
class Regrouped:
    """What a worker is after a regroup: its plan, how it agrees with the others, and the change's record
    (``step``, ``left``, ``workers``, ``steps_redone``: fields of ``membership`` in ``summary.json``)."""

    plan: WorkerPlan
    workers: int
    agreement: Agreement
    record: dict[str, Any]


@dataclass
class Role:
    """What this process does in the loop: its data, how its gradients become weights, what it writes.

    The default is a single local process that does everything.
    """

    rank: int = 0
    plan: WorkerPlan = field(default_factory=WorkerPlan)
    exchange: GradientExchange = field(default_factory=LocalExchange)
    coordinator: bool = True  # writes logs and evaluates
    checkpoints: bool = True  # writes checkpoint.pt from its own model and optimizer
    evaluate_each_epoch: bool = True
    agreement: Agreement = field(default_factory=Agreement)
    #: the workers that compute parts of each global batch, for synchronised batch norm (``None``: nobody else)
    batch_group: dist.ProcessGroup | None = None
    #: an elastic run's membership (``--min-workers``): the survivors of a lost worker go on (``None``: they stop)
    membership: Membership | None = None


@dataclass
class Prepared:
    """Everything loaded and built before the first step, for a worker or a server alike."""

    config: TrainConfig
    workload: Workload
    data: Any
    schedule: Schedule  # steps per epoch, which a batch-size change alters
    model: nn.Module
    optimizer: torch.optim.Optimizer
    position: Position
    state: Any
    resumed_from: int | None
    started: float
    process: ProcessSettings  # threads and allocator, as configure_process set them
    technique: Technique | None = None
    #: How the network differs from the workload's own (resized modules), and through which epoch's
    #: end the technique has decided: both kept in checkpoints.
    architecture: Architecture = field(default_factory=dict)
    decided_epochs: int = 0
    global_batch_factor: int = 1
    initial_parameters: int = 0  # of the workload's own network, before any reconfiguration
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    #: The techniques that keep no state (``--memory-format``, ``--ghost-batch``; ``Technique.checkpointed``
    #: False): entered around each forward pass before the technique's context (autocast). Kept out of the
    #: technique stack, whose checkpointed state must not depend on the layout a run resumes with.
    layout: Technique | None = None
    #: ``allreduce-join, 2 workers``: the strategy as checkpoints and the bench name it.
    strategy_label: str = ""
    #: The first training losses the divergence bound measures from (:mod:`scaletrain.train.divergence`),
    #: filled by the loop and kept in checkpoints.
    first_losses: list[float] = field(default_factory=list)
    #: Asynchronous workers that divide each ``--batch-size`` (``--async-batches split``): an update is a batch of
    #: ``batch_size // async_split`` (:mod:`scaletrain.parallel.strategies.ps.async_batches`); 1 otherwise.
    async_split: int = 1
    #: What the training forward pass calls: the model, or its compiled wrapper (``--compile``), remade after a
    #: reconfiguration (:mod:`scaletrain.train.compiled`).
    forward: TrainingForward | None = None

    def __post_init__(self) -> None:
        if self.forward is None:
            self.forward = TrainingForward(self.model, compiled=False)

    @property
    def update_batch(self) -> int:
        """The samples of one update's batch, before a join's factor: ``--batch-size`` (times ``--accumulate``), or
        its part under split."""
        return self.batch_size * self.config.accumulate // self.async_split

    @property
    def steps_per_epoch(self) -> int:
        """Steps of the current epoch (of the first one, for a run that never changed its batch)."""
        return self.schedule.current.steps_per_epoch

    @property
    def total_steps(self) -> int:
        return self.schedule.total_steps

    @property
    def batch_size(self) -> int:
        """``--batch-size`` now (a reconfiguration may have changed it)."""
        return self.schedule.current.batch_size

    def technique_context(
        self,
        *,
        mean: Callable[[str, float, float], float],
        epoch: Callable[[], int],
        computes_loss: bool = True,
        step_peak: Callable[[nn.Module, int], int | None] | None = None,
        batch_share: float = 1.0,
        batch_group: dist.ProcessGroup | None = None,
    ) -> Context:
        """What this process offers its technique at :meth:`~scaletrain.efficient.Technique.start`, the same for
        a worker and a parameter server (which computes no loss and measures no step)."""
        measured = {} if step_peak is None else {"step_peak": step_peak}
        return Context(
            example_inputs=lambda: to_device(self.workload.example_inputs(self.data), self.device),
            mean=mean,
            computes_loss=computes_loss,
            momentum=self.config.momentum,
            batch_share=batch_share,
            epoch=epoch,
            batch_group=batch_group,
            **measured,
        )


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Step decay as in Zaremba et al.: full rate for ``lr_decay_start`` epochs, then × ``lr_decay`` each."""
    return config.lr * config.lr_decay ** max(epoch + 1 - config.lr_decay_start, 0)


def learning_rate_at_step(prepared: Prepared, step: int) -> float:
    """The rate for update number ``step`` (0-based), as the loop and a parameter server count updates: the
    ``--lr-schedule`` (per epoch, or per update over the fraction of the run done after the warm-up), times the
    ``--lr-warmup`` ramp, times the factor of a batch change (:meth:`Schedule.lr_scale_at`)."""
    config, schedule = prepared.config, prepared.schedule
    if config.lr_schedule == "step":
        rate = learning_rate(config, schedule.position(step).epoch)
    else:
        begun = run_fraction(schedule, config.lr_warmup)
        done = min(max((run_fraction(schedule, step) - begun) / max(1.0 - begun, 1e-12), 0.0), 1.0)
        rate = (
            config.lr
            * {"constant": 1.0, "cosine": 0.5 * (1 + math.cos(math.pi * done)), "linear": 1 - done}[config.lr_schedule]
        )
    ramp = min(1.0, (step + 1) / config.lr_warmup) if config.lr_warmup else 1.0
    return rate * ramp * schedule.lr_scale_at(step)


def run_fraction(schedule: Schedule, step: int) -> float:
    """How much of the run ``step`` updates are: of ``--steps`` where it ends the run, else of the epochs (so
    that a batch change, which changes the steps of later epochs, moves no rate).

    >>> run_fraction(Schedule.starting(steps_per_epoch=10, batch_size=8, epochs=4), 15)
    0.375
    """
    if schedule.step_limit is not None and schedule.step_limit == schedule.total_steps:
        return step / schedule.step_limit
    return schedule.epochs_done(step) / schedule.epochs


def checkpoint_due(prepared: Prepared, step: int) -> bool:
    """After update ``step``: every ``checkpoint_every`` updates, at each epoch's end, and at the end —
    one rule for the loop and the parameter servers."""
    every, last = prepared.config.checkpoint_every, prepared.total_steps
    return step % every == 0 or prepared.schedule.epoch_ends_at(step) or step == last


def count_steps_per_epoch(workload: Workload, data: Any, global_batch: int) -> int:
    """Whole global batches of ``global_batch`` in one epoch; none is an error that names the fix."""
    steps = workload.batches_per_epoch(data, global_batch)
    if steps < 1:
        raise ConfigError(
            f"a global batch of {global_batch} leaves no full batch in one epoch of {workload.name}; "
            "use a smaller --batch-size (or fewer workers with --sync join)"
        )
    return steps


def check_async_split(batch_size: int, workers: int) -> None:
    """Refuse a batch too small to give each of ``workers`` asynchronous workers a sample (``--async-batches
    split``: every update is a batch of ``batch_size // workers``), naming the fix."""
    if batch_size < workers:
        raise ConfigError(
            f"--async-batches split gives each of {workers} asynchronous workers a part of each batch of "
            f"{batch_size}, which leaves some with none; use --batch-size {workers} or more, fewer workers, "
            "or --async-batches share (each update a whole --batch-size)"
        )


def make_optimizer(config: TrainConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """The run's optimizer (:mod:`scaletrain.tensors.optimizers`) with its rate, momentum and weight decay, made
    the same way everywhere, so that a server's step and a local one stay equal bit for bit."""
    return build_optimizer(
        config.optimizer,
        config.optimizer_options,
        parameters,
        lr=config.lr,
        momentum=config.momentum,
        weight_decay=config.weight_decay,
    )
