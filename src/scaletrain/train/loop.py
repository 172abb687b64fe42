"""The training loop shared by every workload: SGD steps, timing, logs, checkpoints, evaluation.

Outputs in ``config.out``: ``summary.json``, ``metrics.jsonl``, ``model.pt`` (a plain state_dict),
``checkpoint.pt`` (for ``--resume``) and TensorBoard events under ``tb/``.
"""

from __future__ import annotations

import datetime
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from scaletrain.config import TrainConfig, resolve
from scaletrain.errors import ConfigError
from scaletrain.train.checkpoint import CHECKPOINT_NAME, atomic_save, load_checkpoint
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog, write_json
from scaletrain.train.meter import ThroughputMeter, now
from scaletrain.workloads import Workload, create_workload
from scaletrain.workloads.base import count_parameters

__all__ = ["MODEL_NAME", "SUMMARY_NAME", "run_training"]

SUMMARY_NAME = "summary.json"
MODEL_NAME = "model.pt"
CHECKPOINT_FORMAT = 1


@dataclass
class Position:
    """Where a run stands: the next batch to train is batch ``batch`` of epoch ``epoch``."""

    epoch: int = 0
    batch: int = 0
    step: int = 0


def learning_rate(config: TrainConfig, epoch: int) -> float:
    """Step decay as in Zaremba et al.: full rate for ``lr_decay_start`` epochs, then × ``lr_decay`` each."""
    return config.lr * config.lr_decay ** max(epoch + 1 - config.lr_decay_start, 0)


def run_training(config: TrainConfig, workload: Workload | None = None) -> dict[str, Any]:
    """Train ``config.workload`` (or the given ``workload``) and return the summary it writes.

    >>> from scaletrain.config import TrainConfig
    >>> summary = run_training(TrainConfig("lenet", steps=20, out="/tmp/st-doc"))  # doctest: +SKIP
    >>> summary["test_accuracy"] > 0.1  # doctest: +SKIP
    True
    """
    started = time.time()
    workload = workload or create_workload(config.workload, config.options)
    config = resolve(config, workload.defaults)
    out = config.out
    if config.resume and not (out / CHECKPOINT_NAME).exists():
        load_checkpoint(out / CHECKPOINT_NAME)  # raises the clear "nothing to resume" error
    if not config.resume and (out / CHECKPOINT_NAME).exists():
        raise ConfigError(
            f"{out} already holds a run (checkpoint.pt); pass --resume to continue it, "
            "or choose another --out"
        )
    out.mkdir(parents=True, exist_ok=True)
    if config.threads:
        torch.set_num_threads(config.threads)

    data = workload.load_data(config.data_dir, download=config.download)
    steps_per_epoch = workload.batches_per_epoch(data, config.batch_size)
    if steps_per_epoch < 1:
        raise ConfigError(
            f"batch size {config.batch_size} leaves no full batch in one epoch of {workload.name}; "
            "use a smaller --batch-size"
        )
    total_steps = config.epochs * steps_per_epoch
    if config.steps is not None:
        total_steps = min(total_steps, config.steps)

    torch.manual_seed(config.seed)
    model = workload.build_model()
    model.train()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=config.lr, momentum=config.momentum, weight_decay=config.weight_decay
    )
    position, state, resumed_from = Position(), None, None
    if config.resume:
        checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
        _check_compatible(checkpoint, config, workload)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng"])
        position = Position(**checkpoint["position"])
        state = checkpoint["workload_state"]
        resumed_from = position.step

    trainer = _Trainer(config, workload, model, optimizer, data, steps_per_epoch, total_steps, resumed_from)
    try:
        trainer.train(position, state)
        quality = trainer.final_quality()
    finally:
        trainer.close()

    torch.save(model.state_dict(), out / MODEL_NAME)
    summary = {
        "workload": workload.name,
        "dataset": workload.dataset,
        "metric": workload.metric,
        "out": str(out),
        "strategy": "local",
        "workers": 1,
        "steps": trainer.position.step,
        "steps_per_epoch": steps_per_epoch,
        "epochs": trainer.position.step / steps_per_epoch,
        "batch_size": config.batch_size,
        "lr": config.lr,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "clip_norm": config.clip_norm,
        "seed": config.seed,
        "threads": torch.get_num_threads(),
        "options": asdict(workload.options),
        "parameters": count_parameters(model),
        **quality,
        "final_train_loss": trainer.last_loss,
        "wall_seconds": time.time() - started,
        "train_seconds": trainer.meter.measured_seconds,
        "batches_per_second": trainer.meter.batches_per_second(),
        "samples_per_second": _times(trainer.meter.batches_per_second(), config.batch_size),
        "warmup_steps_excluded": min(config.warmup_steps, trainer.meter.steps_seen),
        "throughput_note": (
            "batches_per_second = measured steps / their wall time (SPEC eq. 4.1 with one worker); "
            "excludes the first warm-up steps of this process, evaluation and checkpoint writing"
        ),
        "resumed_from_step": resumed_from,
        "torch_version": torch.__version__,
        "host": platform.node(),
        "started_at": _iso(started),
        "finished_at": _iso(time.time()),
    }
    write_json(out / SUMMARY_NAME, summary)
    return summary


class _Trainer:
    """The mutable parts of one run, so the loop body reads as a sequence of named steps."""

    def __init__(
        self,
        config: TrainConfig,
        workload: Workload,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Any,
        steps_per_epoch: int,
        total_steps: int,
        resumed_from: int | None,
    ) -> None:
        self.config, self.workload, self.model, self.optimizer, self.data = (
            config,
            workload,
            model,
            optimizer,
            data,
        )
        self.steps_per_epoch, self.total_steps = steps_per_epoch, total_steps
        self.meter = ThroughputMeter(config.warmup_steps)
        self.metrics = MetricsLog(config.out, resume_step=resumed_from)
        self.tensorboard = TensorBoardLog(config.out, enabled=config.tensorboard, purge_step=resumed_from)
        self.progress = Progress(total_steps, mode=config.progress)
        self.position = Position()
        self.last_loss: float | None = None
        self.last_quality: tuple[int, dict[str, float]] | None = None
        self._loss_sum = torch.zeros(())
        self._loss_count = 0

    def train(self, position: Position, state: Any) -> None:
        self.position = position
        while self.position.step < self.total_steps:
            state = self._train_epoch(state)
            if self.position.batch == self.steps_per_epoch:
                self._end_epoch()
                state = None

    def _train_epoch(self, state: Any) -> Any:
        config, position = self.config, self.position
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(config, position.epoch)
        batches = self.workload.train_batches(
            self.data,
            epoch=position.epoch,
            batch_size=config.batch_size,
            seed=config.seed,
            numbers=range(position.batch, self.steps_per_epoch),
        )
        if state is None:
            state = self.workload.initial_state(self.model, config.batch_size)
        while position.batch < self.steps_per_epoch and position.step < self.total_steps:
            begin = now()
            batch = next(batches)
            objective, loss, state = self.workload.training_loss(self.model, batch, state)
            self.optimizer.zero_grad(set_to_none=True)
            objective.backward()
            if config.clip_norm:
                nn.utils.clip_grad_norm_(self.model.parameters(), config.clip_norm)
            self.optimizer.step()
            self.meter.add(now() - begin)
            self._loss_sum += loss
            self._loss_count += 1
            position.batch += 1
            position.step += 1
            self._after_step(loss, state)
        return state

    def _after_step(self, loss: torch.Tensor, state: Any) -> None:
        config, step = self.config, self.position.step
        periodic = step % config.log_every == 0 or step == self.total_steps
        if periodic:
            # .item() waits for the device; only pay for it when logging.
            self.last_loss = loss.item()
            rate = self.meter.take_window()
            record = {
                "kind": "step",
                "step": step,
                "epoch": self.position.epoch,
                "loss": self.last_loss,
                "lr": self.optimizer.param_groups[0]["lr"],
                "batches_per_second": rate,
                "samples_per_second": _times(rate, config.batch_size),
                "time": time.time(),
            }
            self.metrics.write(record)
            self.tensorboard.scalars(
                {
                    "train/loss": self.last_loss,
                    "throughput/batches_per_second": rate,
                    "throughput/samples_per_second": record["samples_per_second"],
                },
                step,
            )
        self.progress.update(
            step, self.position.epoch, self.last_loss, self.meter.batches_per_second(), periodic=periodic
        )
        if step % config.checkpoint_every == 0 or step == self.total_steps:
            self.save_checkpoint(state)

    def _end_epoch(self) -> None:
        epoch = self.position.epoch
        quality = self.workload.evaluate(self.model, self.data)
        self.last_quality = (self.position.step, quality)
        train_loss = (self._loss_sum / max(self._loss_count, 1)).item()
        self.metrics.write(
            {"kind": "epoch", "step": self.position.step, "epoch": epoch, "train_loss": train_loss, **quality}
        )
        self.tensorboard.scalars(
            {f"quality/{key}": value for key, value in quality.items()}, self.position.step
        )
        self.progress.message(
            f"epoch {epoch + 1}: train loss {train_loss:.4f}, "
            + ", ".join(f"{key} {value:.4f}" for key, value in quality.items())
        )
        self._loss_sum, self._loss_count = torch.zeros(()), 0
        self.position.epoch += 1
        self.position.batch = 0
        self.save_checkpoint(None)

    def final_quality(self) -> dict[str, float]:
        """Quality of the final weights, reusing the last epoch's evaluation when nothing changed since."""
        if self.last_quality is not None and self.last_quality[0] == self.position.step:
            return self.last_quality[1]
        return self.workload.evaluate(self.model, self.data)

    def save_checkpoint(self, state: Any) -> None:
        atomic_save(
            {
                "format": CHECKPOINT_FORMAT,
                "workload": self.workload.name,
                "batch_size": self.config.batch_size,
                "seed": self.config.seed,
                "model": self.model.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "rng": torch.get_rng_state(),
                "position": asdict(self.position),
                "workload_state": state,
            },
            self.config.out / CHECKPOINT_NAME,
        )

    def close(self) -> None:
        self.progress.close()
        self.metrics.close()
        self.tensorboard.close()


def _check_compatible(checkpoint: dict[str, Any], config: TrainConfig, workload: Workload) -> None:
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError("the checkpoint was written by an incompatible scaletrain version; start afresh")
    for key, expected in (
        ("workload", workload.name),
        ("batch_size", config.batch_size),
        ("seed", config.seed),
    ):
        if checkpoint[key] != expected:
            raise ConfigError(
                f"cannot resume: the checkpoint has {key}={checkpoint[key]!r} but this run asks for "
                f"{expected!r}; use the same settings or another --out"
            )


def _times(rate: float | None, factor: int) -> float | None:
    return None if rate is None else rate * factor


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).isoformat(timespec="seconds")
