"""The training loop shared by every workload and every strategy: steps, timing, logs, checkpoints.

Outputs in ``config.out`` (written by the coordinating process): ``summary.json``,
``metrics.jsonl``, ``model.pt`` (a plain state_dict), ``checkpoint.pt`` (for ``--resume``) and
TensorBoard events under ``tb/``. A worker of a distributed run runs the same loop with its
:class:`~scaletrain.train.plan.WorkerPlan` and a gradient exchange; see :mod:`scaletrain.parallel`.
"""

from __future__ import annotations

import contextlib
import copy
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from scaletrain.config import TrainConfig, resolve
from scaletrain.efficient import Context, EpochEnd, Reconfiguration, Technique, create_technique, stacked
from scaletrain.efficient.adaptive_batch import adapt_batch_technique, cuda_peak, forked_peak_rss, trial_step
from scaletrain.efficient.channels_last import memory_format_technique
from scaletrain.efficient.cost import network_figures
from scaletrain.efficient.ghost import ghost_batch_norm
from scaletrain.efficient.precision import precision_technique
from scaletrain.efficient.surgery import Architecture, apply_architecture, reconfigure, resized_architecture
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.train.checkpoint import (
    CHECKPOINT_NAME,
    Position,
    atomic_save,
    check_compatible,
    checkpoint_payload,
    load_checkpoint,
    make_folder,
    refuse_overwrite,
)
from scaletrain.train.device import synchronize, to_device
from scaletrain.train.exchange import GradientExchange, LocalExchange
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog
from scaletrain.train.meter import EpochSteps, ThroughputMeter, now
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.runtime import ProcessSettings
from scaletrain.train.schedule import Schedule
from scaletrain.train.summary import WorkerStats, weights_digest
from scaletrain.workloads import Workload, create_workload
from scaletrain.workloads.base import count_parameters

__all__ = [
    "Agreement",
    "Diverged",
    "Prepared",
    "Role",
    "Trainer",
    "apply_decision",
    "change_batch",
    "checkpoint_due",
    "describe_decision",
    "learning_rate",
    "learning_rate_at_step",
    "make_optimizer",
    "prepare",
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
    #: ``--memory-format``: entered around each forward pass with the technique's context. Kept out of
    #: the technique stack, whose checkpointed state must not depend on the layout a run resumes with.
    layout: Technique | None = None

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


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Step decay as in Zaremba et al.: full rate for ``lr_decay_start`` epochs, then × ``lr_decay`` each."""
    return config.lr * config.lr_decay ** max(epoch + 1 - config.lr_decay_start, 0)


def learning_rate_at_step(prepared: Prepared, step: int) -> float:
    """The rate for update number ``step`` (0-based): the schedule of :func:`learning_rate` in updates,
    as a parameter server counts them."""
    schedule = prepared.schedule
    return learning_rate(prepared.config, schedule.position(step).epoch) * schedule.lr_scale_at(step)


def checkpoint_due(prepared: Prepared, step: int) -> bool:
    """After update ``step``: every ``checkpoint_every`` updates, at each epoch's end, and at the end —
    one rule for the loop and the parameter servers."""
    every, last = prepared.config.checkpoint_every, prepared.total_steps
    return step % every == 0 or prepared.schedule.epoch_ends_at(step) or step == last


def prepare(
    config: TrainConfig,
    workload: Workload | None = None,
    *,
    process: ProcessSettings,
    global_batch_factor: int = 1,
    coordinator: bool = True,
    device: torch.device | None = None,
    workers_device: torch.device | None = None,
) -> Prepared:
    """Load data, build model and optimizer, and restore ``checkpoint.pt`` when resuming.

    ``process``: the threads and allocator the caller set up (:func:`scaletrain.train.runtime.configure_process`);
    ``device``: where the model lives (default: the CPU); ``workers_device``: where the run's workers
    compute, when this process is a server that does not (its precision settings are theirs).
    """
    device = device or torch.device("cpu")
    workers_device = workers_device or device
    started = time.time()
    workload = workload or create_workload(config.workload, config.options)
    config = resolve(config, workload.defaults)
    out = config.out
    if coordinator:
        refuse_overwrite(out, resume=config.resume)
    make_folder(out)

    data = workload.load_data(config.data_dir, download=config.download)
    steps_per_epoch = _steps_per_epoch(workload, data, config.batch_size * global_batch_factor)
    schedule = Schedule.starting(
        steps_per_epoch=steps_per_epoch, batch_size=config.batch_size, epochs=config.epochs, step_limit=config.steps
    )

    torch.manual_seed(config.seed)
    model = workload.build_model()
    if config.ghost_batch is not None:
        ghost_batch_norm(model, config.ghost_batch)
    model.train()
    initial_parameters = count_parameters(model)
    chosen = create_technique(config.technique, config.technique_options) if config.technique else None
    adapt = adapt_batch_technique(config)
    technique = stacked(chosen, adapt, precision_technique(config, workers_device.type))  # last: its scale covers all
    position, state, resumed_from, architecture, decided = Position(), None, None, {}, 0
    checkpoint = None
    if config.resume:
        checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
        check_compatible(checkpoint, config, workload)
        architecture = checkpoint.get("architecture") or {}
        apply_architecture(model, architecture)  # the reconfigured network, before its weights go in
    model.to(device)
    optimizer = make_optimizer(config, list(model.parameters()))
    if checkpoint is not None:
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"])
        position = Position(**checkpoint["position"])
        state = checkpoint["workload_state"]
        resumed_from = position.step
        decided = checkpoint.get("decided_epochs", position.epoch)
        schedule.restore(checkpoint.get("schedule"))
        if technique is not None and checkpoint.get("technique") is not None:
            technique.load_state_dict(checkpoint["technique"])
    return Prepared(
        config,
        workload,
        data,
        schedule,
        model,
        optimizer,
        position,
        state,
        resumed_from,
        started,
        process,
        technique,
        architecture,
        decided,
        global_batch_factor,
        initial_parameters,
        device,
        memory_format_technique(config.memory_format, device.type),
    )


def apply_decision(prepared: Prepared, decision: Reconfiguration, epoch: int) -> None:
    """The network (weights and momentum carried over) and the batch of every epoch after ``epoch``, as
    ``decision`` says: what every process — worker or server — does at the agreed step boundary."""
    if decision.changes_network:
        config = prepared.config
        prepared.optimizer = reconfigure(
            prepared.model, prepared.optimizer, decision, lambda parameters: make_optimizer(config, parameters)
        )
        prepared.architecture = resized_architecture(prepared.architecture, decision)
    change_batch(prepared, decision, epoch)


def describe_decision(prepared: Prepared, decision: Reconfiguration) -> str:
    parts = []
    if decision.changes_network:
        sizes = ", ".join(f"{path} {dict(sizes)}" for path, sizes in prepared.architecture.items())
        parts.append(f"reconfigured the network ({sizes})")
    if decision.batch_size is not None or decision.lr_scale != 1.0:
        segment = prepared.schedule.current
        parts.append(
            f"batch size {segment.batch_size}, {segment.steps_per_epoch} steps per epoch, "
            f"learning rate ×{segment.lr_scale:g}"
        )
    return "; ".join(parts)


def _steps_per_epoch(workload: Workload, data: Any, global_batch: int) -> int:
    steps = workload.batches_per_epoch(data, global_batch)
    if steps < 1:
        raise ConfigError(
            f"a global batch of {global_batch} leaves no full batch in one epoch of {workload.name}; "
            "use a smaller --batch-size (or fewer workers with --sync join)"
        )
    return steps


def change_batch(prepared: Prepared, decision: Reconfiguration, epoch: int) -> None:
    """From epoch ``epoch + 1`` on: the decision's batch size (and learning-rate factor), with the steps
    per epoch that follow from it — on every process, the same way."""
    if decision.batch_size is None and decision.lr_scale == 1.0:
        return
    batch = decision.batch_size or prepared.batch_size
    steps = _steps_per_epoch(prepared.workload, prepared.data, batch * prepared.global_batch_factor)
    prepared.schedule.change(
        epoch=epoch + 1,
        steps_per_epoch=steps,
        batch_size=batch,
        lr_scale=decision.lr_scale,
        warmup_steps=decision.lr_warmup_steps,
    )


def make_optimizer(config: TrainConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """SGD with the run's rate, momentum and weight decay; fused (one pass over each tensor for the weight
    decay, momentum and update: 3x faster than the per-op step on large tensors here), everywhere alike, so
    that a server's step and a local one stay equal bit for bit."""
    return torch.optim.SGD(
        parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay, fused=True
    )


class Diverged(ScaletrainError):
    """The training loss became nan or infinite: the settings make the run diverge."""


class Trainer:
    """One process's training loop; the mutable parts live here so the loop reads as named steps."""

    def __init__(self, prepared: Prepared, role: Role) -> None:
        self.prepared, self.role = prepared, role
        config = prepared.config
        self.config, self.workload, self.model = config, prepared.workload, prepared.model
        self.optimizer, self.data = prepared.optimizer, prepared.data
        self.schedule = prepared.schedule
        self.position = Position(**asdict(prepared.position))
        self.state = prepared.state
        self.technique = prepared.technique
        # entered around each training forward pass: the activations' layout, then the technique's (autocast)
        self._forward = stacked(prepared.layout, self.technique)
        self.meter = ThroughputMeter(config.warmup_steps)
        self.communication = self.wait = 0.0
        self.skipped_steps = 0
        self.host_copy = 0.0
        writes = role.coordinator
        self.metrics = MetricsLog(config.out, resume_step=prepared.resumed_from) if writes else None
        self.tensorboard = TensorBoardLog(
            config.out, enabled=config.tensorboard and writes, purge_step=prepared.resumed_from
        )
        self.progress = Progress(self.schedule.total_steps, mode=config.progress if writes else "off")
        self.last_loss: float | None = None
        self.first_loss: float | None = None  # this process's first and last training loss: did it fall?
        self._step_loss: torch.Tensor | None = None
        self._buffer_seconds = 0.0  # averaging the workers' buffers within this step
        self.last_quality: tuple[int, dict[str, float]] | None = None
        self._loss_sum = torch.zeros((), device=prepared.device)  # the losses' device: no copy per step
        self._loss_count = 0
        self._epoch_started = time.time()
        self._epoch_steps = EpochSteps()
        self._predicted: dict[str, float] | None = None  # by the last reconfiguration, for the next epoch
        self._named_parameters = dict(self.model.named_parameters())  # made again when the network changes
        role.exchange.skip_nonfinite = self.technique is not None and self.technique.skips_nonfinite

    def train(self) -> None:
        self.role.exchange.start(self.model, self.optimizer)
        if self.technique is not None:
            plan = self.role.plan
            context = Context(
                example_inputs=self._example_inputs,
                mean=self.role.agreement.mean,
                momentum=self.config.momentum,
                step_peak=self._step_peak,
                batch_share=plan.global_batch_factor / plan.part.count,
                epoch=lambda: self.position.epoch,
            )
            self.technique.start(self.model, context)
            if self.position.batch == 0 and self.prepared.decided_epochs < self.position.epoch:
                # resumed from a checkpoint written at an epoch's end before that epoch's decision
                self._decide(self.position.epoch - 1)
        schedule = self.schedule
        while schedule.first_step(self.position.epoch) < schedule.total_steps:
            epoch = self.position.epoch
            steps = schedule.steps_in(epoch)
            stop = min(steps, schedule.total_steps - schedule.first_step(epoch))
            self._train_epoch(self.role.plan.numbers(self.position.batch, stop))
            if stop < steps:
                break  # --steps ended the run inside this epoch
            self._end_epoch()
        self.role.agreement.buffers_final(self.model)

    def _train_epoch(self, numbers: range) -> None:
        config, position, plan = self.config, self.position, self.role.plan
        self._epoch_started = time.time()
        self._epoch_steps = EpochSteps()
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate_at_step(self.prepared, self.schedule.first_step(position.epoch))
        batches = self.workload.train_batches(
            self.data,
            epoch=position.epoch,
            batch_size=self.prepared.batch_size * plan.global_batch_factor,
            seed=config.seed,
            part=plan.part,
            numbers=numbers,
        )
        if self.state is None:
            rows = self.prepared.batch_size * plan.global_batch_factor // plan.part.count
            self.state = self.workload.initial_state(self.model, rows)
        device = self.prepared.device
        for number, batch in zip(numbers, batches, strict=True):
            begin = now()
            if self.schedule.warming_up(position.step):  # the rate moves every update of a warm-up
                for group in self.optimizer.param_groups:
                    group["lr"] = learning_rate_at_step(self.prepared, position.step)
            batch = to_device(batch, device)
            with self._forward_context():
                objective, loss, self.state = self.workload.training_loss(self.model, batch, self.state)
            self._check_finite(loss)
            if self.technique is not None:
                objective = self.technique.objective(objective, self.model)
            self.optimizer.zero_grad(set_to_none=True)
            objective.backward()
            if self.technique is not None:
                self.technique.after_backward(self.model)
            if checkpoint_due(self.prepared, position.step + 1):  # the model may leave a process after it
                shared = now()
                self.role.agreement.buffers_due(position.step + 1, self.model)
                self._buffer_seconds = now() - shared
            times = self.role.exchange.step(self.model, self.optimizer, config.clip_norm)
            if self.technique is not None:
                if self.role.exchange.updates_here and not times.skipped:
                    self.technique.after_update(self._named_parameters, self.optimizer.param_groups[0]["lr"])
                self.technique.after_exchange(times.skipped)
            self.skipped_steps += times.skipped
            synchronize(device)  # the step's queued device work is done before the clock is read
            seconds = now() - begin
            self.meter.add(seconds)
            self._epoch_steps.add(seconds, times.communication)
            if self.meter.measured_steps:  # after the warm-up, like the throughput
                self.communication += times.communication + self._buffer_seconds
                self.wait += times.wait
                self.host_copy += times.host_copy
            self._buffer_seconds = 0.0
            if self.first_loss is None:
                self.first_loss = float(loss)
            self._step_loss = loss
            self._loss_sum += loss
            self._loss_count += 1
            position.batch = number + 1
            position.step += 1
            self._after_step(loss)

    def _step_peak(self, model: nn.Module, rows: int) -> int | None:
        """Peak memory of one step of ``model`` on ``rows`` samples here: a forked copy's peak RSS on the
        CPU, a network copy's peak allocation on a GPU (see :mod:`scaletrain.efficient.adaptive_batch`)."""
        plan, device = self.role.plan, self.prepared.device
        global_batch = rows * plan.part.count  # the --batch-size × factor that gives each process these rows
        if self.workload.batches_per_epoch(self.data, global_batch) < 1:
            return None  # the epoch has no batch that large
        batch = next(iter(self.workload.train_batches(self.data, epoch=0, batch_size=rows, seed=self.config.seed)))
        batch = to_device(batch, device)
        context = self._forward_context
        momentum = self.config.momentum or 0.0
        if device.type == "cpu":
            return forked_peak_rss(trial_step(model, self.workload, batch, rows, context, momentum))
        copy_on_device = copy.deepcopy(model)
        return cuda_peak(trial_step(copy_on_device, self.workload, batch, rows, context, momentum), device)

    def _forward_context(self) -> contextlib.AbstractContextManager:
        return self._forward.forward_context() if self._forward is not None else contextlib.nullcontext()

    def _example_inputs(self) -> Any:
        return to_device(self.workload.example_inputs(self.data), self.prepared.device)

    def _check_finite(self, loss: torch.Tensor) -> None:
        """Stop before a nan or infinite loss turns into gradients that reach the other processes.

        One read of a scalar per step: free on the CPU; on a GPU it waits for the step's forward pass.
        """
        value = float(loss)
        if math.isfinite(value):
            return
        lr = self.optimizer.param_groups[0]["lr"]
        raise Diverged(
            f"training diverged: the loss became {value} at step {self.position.step + 1} "
            f"(epoch {self.position.epoch + 1}) with learning rate {lr:g}; start again with a lower --lr "
            f"(e.g. {lr / 10:g}) or with --clip-norm"
        )

    def _after_step(self, loss: torch.Tensor) -> None:
        config, step = self.config, self.position.step
        periodic = step % config.log_every == 0 or step == self.schedule.total_steps
        if periodic and self.metrics is not None:
            # .item() waits for the device; only pay for it when logging.
            self.last_loss = loss.item()
            rate = self.meter.take_window()
            samples = None if rate is None else rate * self.prepared.batch_size * self.role.plan.batch_fraction
            self.metrics.write(
                {
                    "kind": "step",
                    "step": step,
                    "epoch": self.position.epoch,
                    "loss": self.last_loss,
                    "lr": self.optimizer.param_groups[0]["lr"],
                    "batches_per_second": rate,
                    "samples_per_second": samples,
                    "time": time.time(),
                }
            )
            self.tensorboard.scalars(
                {
                    "train/loss": self.last_loss,
                    "throughput/batches_per_second": rate,
                    "throughput/samples_per_second": samples,
                },
                step,
            )
        self.progress.update(
            step, self.position.epoch, self.last_loss, self.meter.batches_per_second(), periodic=periodic
        )
        # an epoch's last step is saved by _end_epoch, after the technique's decision
        if self.role.checkpoints and checkpoint_due(self.prepared, step) and not self.schedule.epoch_ends_at(step):
            self.save_checkpoint()

    def _end_epoch(self) -> None:
        epoch = self.position.epoch
        train_loss = (self._loss_sum / max(self._loss_count, 1)).item()
        self._loss_sum, self._loss_count = torch.zeros((), device=self.prepared.device), 0
        self.position.epoch += 1
        self.position.batch = 0
        self.state = None
        self._log_epoch(epoch, train_loss)
        if self.technique is not None:
            self._decide(epoch)
        technique = self.technique.state_dict() if self.technique is not None else None
        self.role.agreement.share({"technique": technique})
        if self.role.checkpoints:  # after the decision: a resumed run rebuilds the network it made
            self.save_checkpoint()

    def _log_epoch(self, epoch: int, train_loss: float) -> None:
        if self.metrics is None:
            return
        record = {
            "kind": "epoch",
            "step": self.position.step,
            "epoch": epoch,
            "train_loss": train_loss,
            "seconds": time.time() - self._epoch_started,  # training only, before this evaluation
            "parameters": count_parameters(self.model),
            **self._epoch_steps.figures(),
        }
        if self._predicted is not None:  # what the last reconfiguration predicted for this epoch, beside it
            record.update({f"predicted_{key}": value for key, value in self._predicted.items()})
            self._predicted = None
        message = f"epoch {epoch + 1}: train loss {train_loss:.4f}"
        if self.role.evaluate_each_epoch:
            quality = self.workload.evaluate(self.model, self.data)
            self.last_quality = (self.position.step, quality)
            record.update(quality)
            self.tensorboard.scalars({f"quality/{key}": value for key, value in quality.items()}, self.position.step)
            message += "".join(f", {key} {value:.4f}" for key, value in quality.items())
        self.metrics.write(record)
        self.progress.message(message)

    def _decide(self, epoch: int) -> None:
        """The technique's decision after ``epoch``, agreed by every process, applied at this step boundary."""
        end = EpochEnd(epoch=epoch, batch_size=self.prepared.batch_size, step=self.schedule.first_step(epoch + 1))
        decision = self.role.agreement.agree(
            epoch, lambda: self.technique.amend(self.technique.epoch_end(end, self.model), end, self.model)
        )
        self.prepared.decided_epochs = epoch + 1  # before any checkpoint of the new network is written
        if decision is not None:
            self._reconfigure(decision, epoch)

    def _reconfigure(self, decision: Reconfiguration, epoch: int) -> None:
        """Rebuild the network as ``decision`` says, carry weights and momentum over, and let the exchange
        re-make what it sized for the old network."""
        exchange, prepared = self.role.exchange, self.prepared
        recording = self.metrics is not None and decision.changes_network
        before = self._network_record() if recording else None
        exchange.prepare_reconfiguration(self.model, self.optimizer, epoch)
        apply_decision(prepared, decision, epoch)
        self.model = prepared.model
        self._named_parameters = dict(self.model.named_parameters())
        self.optimizer = prepared.optimizer
        exchange.reconfigure(self.model, self.optimizer)
        if self.technique is not None:
            self.technique.reconfigured(self.model)
        self.last_quality = None  # measured on the old network
        if before is not None:
            self._log_reconfiguration(epoch, decision, before)
        self.progress.message(f"after epoch {epoch + 1}: {describe_decision(prepared, decision)}")

    def _network_record(self) -> dict[str, Any]:
        """Parameters, FLOPs per sample, channels per layer and quality of the network now."""
        figures = network_figures(self.model, self._example_inputs())
        return {**figures, "quality": self.workload.evaluate(self.model, self.data)}

    def _log_reconfiguration(self, epoch: int, decision: Reconfiguration, before: dict[str, Any]) -> None:
        after = self._network_record()
        self._predicted = self._epoch_steps.scaled(
            compute=after["flops_per_sample"] / max(before["flops_per_sample"], 1.0),
            communication=after["parameters"] / max(before["parameters"], 1),
        )
        record = {
            "kind": "reconfiguration",
            "step": self.position.step,
            "epoch": epoch,
            "parameters_before": before["parameters"],
            "parameters": after["parameters"],
            "flops_per_sample_before": before["flops_per_sample"],
            "flops_per_sample": after["flops_per_sample"],
            "blocks_removed": decision.remove,
            "modules_inserted": list(decision.insert),
            "channels": after["channels"],
            "quality_before": before["quality"],
            "quality_after": after["quality"],
            **{f"{key}_before": value for key, value in self._epoch_steps.figures().items()},
            **{f"predicted_{key}": value for key, value in (self._predicted or {}).items()},
            "time": time.time(),
        }
        assert self.metrics is not None
        self.metrics.write(record)
        self.tensorboard.scalars(
            {
                "network/parameters": after["parameters"],
                "network/flops_per_sample": after["flops_per_sample"],
                **{f"reconfiguration/{key}_after": value for key, value in after["quality"].items()},
            },
            self.position.step,
        )

    def final_quality(self) -> dict[str, float]:
        """Quality of the final weights, reusing the last epoch's evaluation when nothing changed since."""
        if self.last_quality is not None and self.last_quality[0] == self.position.step:
            return self.last_quality[1]
        return self.workload.evaluate(self.model, self.data)

    def save_checkpoint(self) -> None:
        # A worker's carried state (an LSTM's hidden state) covers only its own rows; a distributed
        # run restarts it from zeros when resumed.
        state = self.state if self.role.plan == WorkerPlan() else None
        payload = checkpoint_payload(self.prepared, self.model, self.optimizer, self.position, state)
        atomic_save(payload, self.config.out / CHECKPOINT_NAME)

    def stats(self) -> WorkerStats:
        """This worker's measurements, for the summary."""
        return WorkerStats(
            rank=self.role.rank,
            steps=self.position.step - (self.prepared.resumed_from or 0),
            measured_steps=self.meter.measured_steps,
            measured_seconds=self.meter.measured_seconds,
            communication_seconds=self.communication,
            wait_seconds=self.wait,
            batch_fraction=self.role.plan.batch_fraction,
            final_loss=self.last_loss,
            first_step_loss=self.first_loss,
            last_step_loss=float(self._step_loss) if self._step_loss is not None else None,
            minor_faults_per_step=self.meter.minor_faults_per_step(),
            skipped_steps=self.skipped_steps,
            host_copy_seconds=self.host_copy,
            loss_scale=self.technique.loss_scale if self.technique is not None else None,
            weights_digest=weights_digest(self.model),
        )

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        self.tensorboard.close()
