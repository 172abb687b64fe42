"""The training loop shared by every workload and every strategy: steps, timing, logs, checkpoints.

Outputs in ``config.out`` (written by the coordinating process): ``summary.json``,
``metrics.jsonl``, ``model.pt`` (a plain state_dict), ``checkpoint.pt`` (for ``--resume``) and
TensorBoard events under ``tb/``. A worker of a distributed run runs the same loop with its
:class:`~scaletrain.train.plan.WorkerPlan` and a gradient exchange; see :mod:`scaletrain.parallel`.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from scaletrain.config import TrainConfig, resolve
from scaletrain.errors import ConfigError, Interrupted, ScaletrainError
from scaletrain.train.checkpoint import (
    CHECKPOINT_NAME,
    atomic_save,
    load_checkpoint,
    make_folder,
    refuse_overwrite,
    resume_advice,
)
from scaletrain.train.exchange import GradientExchange, LocalExchange
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog
from scaletrain.train.meter import ThroughputMeter, now
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.summary import WorkerStats, write_summary
from scaletrain.workloads import Workload, create_workload

__all__ = ["CHECKPOINT_FORMAT", "Diverged", "Position", "Prepared", "Role", "learning_rate", "prepare", "run_training"]

CHECKPOINT_FORMAT = 1


@dataclass
class Position:
    """Where a run stands: next comes batch ``batch`` of epoch ``epoch``; ``step`` updates so far."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


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


@dataclass
class Prepared:
    """Everything loaded and built before the first step, for a worker or a server alike."""

    config: TrainConfig
    workload: Workload
    data: Any
    steps_per_epoch: int
    total_steps: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    position: Position
    state: Any
    resumed_from: int | None
    started: float


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Step decay as in Zaremba et al.: full rate for ``lr_decay_start`` epochs, then × ``lr_decay`` each."""
    return config.lr * config.lr_decay ** max(epoch + 1 - config.lr_decay_start, 0)


def prepare(
    config: TrainConfig,
    workload: Workload | None = None,
    *,
    global_batch_factor: int = 1,
    coordinator: bool = True,
) -> Prepared:
    """Load data, build model and optimizer, and restore ``checkpoint.pt`` when resuming."""
    started = time.time()
    workload = workload or create_workload(config.workload, config.options)
    config = resolve(config, workload.defaults)
    out = config.out
    if coordinator:
        refuse_overwrite(out, resume=config.resume)
    make_folder(out)
    if config.threads:
        torch.set_num_threads(config.threads)

    data = workload.load_data(config.data_dir, download=config.download)
    global_batch = config.batch_size * global_batch_factor
    steps_per_epoch = workload.batches_per_epoch(data, global_batch)
    if steps_per_epoch < 1:
        raise ConfigError(
            f"a global batch of {global_batch} leaves no full batch in one epoch of {workload.name}; "
            "use a smaller --batch-size (or fewer workers with --sync join)"
        )
    total_steps = config.epochs * steps_per_epoch
    if config.steps is not None:
        total_steps = min(total_steps, config.steps)

    torch.manual_seed(config.seed)
    model = workload.build_model()
    model.train()
    optimizer = make_optimizer(config, list(model.parameters()))
    position, state, resumed_from = Position(), None, None
    if config.resume:
        checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
        check_compatible(checkpoint, config, workload)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"])
        position = Position(**checkpoint["position"])
        state = checkpoint["workload_state"]
        resumed_from = position.step
    return Prepared(
        config,
        workload,
        data,
        steps_per_epoch,
        total_steps,
        model,
        optimizer,
        position,
        state,
        resumed_from,
        started,
    )


def make_optimizer(config: TrainConfig, parameters: list[torch.Tensor]) -> torch.optim.Optimizer:
    """SGD with the run's rate, momentum and weight decay."""
    return torch.optim.SGD(parameters, lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay)


def run_training(config: TrainConfig, workload: Workload | None = None) -> dict[str, Any]:
    """Train in this process alone and return the summary it writes.

    >>> from scaletrain.config import TrainConfig
    >>> summary = run_training(TrainConfig("lenet", steps=20, out="/tmp/st-doc"))  # doctest: +SKIP
    >>> summary["test_accuracy"] > 0.1  # doctest: +SKIP
    True
    """
    prepared = prepare(config, workload)
    trainer = Trainer(prepared, Role())
    try:
        trainer.train()
        quality = trainer.final_quality()
    except KeyboardInterrupt:
        raise Interrupted(f"interrupted; {resume_advice(prepared.config.out)}") from None
    finally:
        trainer.close()
    return write_summary(prepared, quality, [trainer.stats()], layout_fields={"strategy": "local", "workers": 1})


def check_compatible(checkpoint: dict[str, Any], config: TrainConfig, workload: Workload) -> None:
    """Refuse to resume a checkpoint written with other settings."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError("the checkpoint was written by an incompatible scaletrain version; start afresh")
    expected_strategy = _strategy_label(config)
    for key, expected, saved in (
        ("workload", workload.name, checkpoint.get("workload")),
        ("batch size", config.batch_size, checkpoint.get("batch_size")),
        ("seed", config.seed, checkpoint.get("seed")),
        ("strategy", expected_strategy, _saved_strategy(checkpoint, expected_strategy)),
    ):
        if saved != expected:
            raise ConfigError(
                f"cannot resume: the checkpoint was written with {key} {saved} but this run asks for "
                f"{expected}; use the same settings or another --out"
            )


def _strategy_label(config: TrainConfig) -> str:
    """``allreduce-join, 2 workers`` — the strategy as the bench and the summary name it."""
    from scaletrain.parallel.plan import Layout  # the loop knows layouts only by their names

    label = Layout(config.strategy, config.workers, config.server, config.sync).label
    return f"{label}, {config.workers} worker{'s' if config.workers != 1 else ''}"


def _saved_strategy(checkpoint: dict[str, Any], expected: str) -> str:
    """The checkpoint's strategy label; files of 0.1.0 wrote ``strategy/server/sync/workers``."""
    saved = checkpoint.get("strategy", expected)
    parts = saved.split("/") if isinstance(saved, str) else []
    if len(parts) == 4 and parts[3].isdigit():
        strategy, server, sync, workers = parts
        return _strategy_label(TrainConfig("-", strategy=strategy, server=server, sync=sync, workers=int(workers)))
    return saved


def checkpoint_payload(
    prepared: Prepared, model: nn.Module, optimizer: torch.optim.Optimizer, position: Position, state: Any
) -> dict[str, Any]:
    """What ``checkpoint.pt`` holds; every strategy's coordinator writes this shape."""
    config = prepared.config
    return {
        "format": CHECKPOINT_FORMAT,
        "workload": prepared.workload.name,
        "batch_size": config.batch_size,
        "seed": config.seed,
        "strategy": _strategy_label(config),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "position": asdict(position),
        "workload_state": state,
    }


class Diverged(ScaletrainError):
    """The training loss became nan or infinite: the settings make the run diverge."""


class Trainer:
    """One process's training loop; the mutable parts live here so the loop reads as named steps."""

    def __init__(self, prepared: Prepared, role: Role) -> None:
        self.prepared, self.role = prepared, role
        config = prepared.config
        self.config, self.workload, self.model = config, prepared.workload, prepared.model
        self.optimizer, self.data = prepared.optimizer, prepared.data
        self.steps_per_epoch, self.total_steps = prepared.steps_per_epoch, prepared.total_steps
        self.position = Position(**asdict(prepared.position))
        self.state = prepared.state
        self.meter = ThroughputMeter(config.warmup_steps)
        self.communication = self.wait = 0.0
        writes = role.coordinator
        self.metrics = MetricsLog(config.out, resume_step=prepared.resumed_from) if writes else None
        self.tensorboard = TensorBoardLog(
            config.out, enabled=config.tensorboard and writes, purge_step=prepared.resumed_from
        )
        self.progress = Progress(self.total_steps, mode=config.progress if writes else "off")
        self.last_loss: float | None = None
        self.last_quality: tuple[int, dict[str, float]] | None = None
        self._loss_sum = torch.zeros(())
        self._loss_count = 0

    def train(self) -> None:
        self.role.exchange.start(self.model, self.optimizer)
        epochs = math.ceil(self.total_steps / self.steps_per_epoch)
        while self.position.epoch < epochs:
            epoch = self.position.epoch
            stop = min(self.steps_per_epoch, self.total_steps - epoch * self.steps_per_epoch)
            self._train_epoch(self.role.plan.numbers(self.position.batch, stop))
            if stop < self.steps_per_epoch:
                break  # --steps ended the run inside this epoch
            self._end_epoch()

    def _train_epoch(self, numbers: range) -> None:
        config, position, plan = self.config, self.position, self.role.plan
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, position.epoch)
        batches = self.workload.train_batches(
            self.data,
            epoch=position.epoch,
            batch_size=config.batch_size * plan.global_batch_factor,
            seed=config.seed,
            part=plan.part,
            numbers=numbers,
        )
        if self.state is None:
            rows = config.batch_size * plan.global_batch_factor // plan.part.count
            self.state = self.workload.initial_state(self.model, rows)
        for number, batch in zip(numbers, batches, strict=True):
            begin = now()
            objective, loss, self.state = self.workload.training_loss(self.model, batch, self.state)
            self._check_finite(loss)
            self.optimizer.zero_grad(set_to_none=True)
            objective.backward()
            times = self.role.exchange.step(self.model, self.optimizer, config.clip_norm)
            self.meter.add(now() - begin)
            if self.meter.measured_steps:  # after the warm-up, like the throughput
                self.communication += times.communication
                self.wait += times.wait
            self._loss_sum += loss
            self._loss_count += 1
            position.batch = number + 1
            position.step += 1
            self._after_step(loss)

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
        periodic = step % config.log_every == 0 or step == self.total_steps
        if periodic and self.metrics is not None:
            # .item() waits for the device; only pay for it when logging.
            self.last_loss = loss.item()
            rate = self.meter.take_window()
            samples = None if rate is None else rate * config.batch_size * self.role.plan.batch_fraction
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
        if self.role.checkpoints and (step % config.checkpoint_every == 0 or step == self.total_steps):
            self.save_checkpoint()

    def _end_epoch(self) -> None:
        epoch = self.position.epoch
        train_loss = (self._loss_sum / max(self._loss_count, 1)).item()
        self._loss_sum, self._loss_count = torch.zeros(()), 0
        self.position.epoch += 1
        self.position.batch = 0
        self.state = None
        if self.metrics is None:
            return
        record = {"kind": "epoch", "step": self.position.step, "epoch": epoch, "train_loss": train_loss}
        message = f"epoch {epoch + 1}: train loss {train_loss:.4f}"
        if self.role.evaluate_each_epoch:
            quality = self.workload.evaluate(self.model, self.data)
            self.last_quality = (self.position.step, quality)
            record.update(quality)
            self.tensorboard.scalars({f"quality/{key}": value for key, value in quality.items()}, self.position.step)
            message += "".join(f", {key} {value:.4f}" for key, value in quality.items())
        self.metrics.write(record)
        self.progress.message(message)
        if self.role.checkpoints:
            self.save_checkpoint()

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
        )

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        self.tensorboard.close()
