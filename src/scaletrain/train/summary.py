"""``summary.json``: what a run did, how fast (SPEC §3 eq. 4.1) and how well, from every worker's stats."""

from __future__ import annotations

import datetime
import hashlib
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from scaletrain.efficient import summary_fields
from scaletrain.tensors.codec import CODECS
from scaletrain.train.logs import METRICS_NAME, write_json
from scaletrain.train.pictures import PRUNING_PICTURE, plot_reconfigurations
from scaletrain.workloads.base import count_parameters

if TYPE_CHECKING:
    from scaletrain.train.state import Prepared

__all__ = ["MODEL_NAME", "SUMMARY_NAME", "WorkerStats", "throughput", "weights_digest", "write_summary"]

SUMMARY_NAME = "summary.json"
MODEL_NAME = "model.pt"
THROUGHPUT_NOTE = (
    "batches_per_second = batches of batch_size processed by all workers / wall time (SPEC eq. 4.1); "
    "the time is the slowest worker's measured training time, which leaves out each process's first "
    "warm-up steps, evaluation and checkpoint writing, and includes getting each step's batch "
    "(data_seconds_per_step); a split step counts as 1/workers of a batch"
)


@dataclass
class WorkerStats:
    """One worker's measurements after its warm-up steps."""

    rank: int
    steps: int
    measured_steps: int
    measured_seconds: float
    communication_seconds: float = 0.0
    wait_seconds: float = 0.0
    data_seconds: float = 0.0  # waiting for the next batch: reading it here, or for a loader's workers
    batch_fraction: float = 1.0
    final_loss: float | None = None
    minor_faults_per_step: float | None = None  # page faults the kernel served per step (see train/runtime.py)
    skipped_steps: int = 0  # overflowed gradients not applied (dynamic loss scaling)
    host_copy_seconds: float = 0.0  # copying between a GPU and host memory for the parameter server
    loss_scale: float | None = None  # the dynamic loss scale at the end
    weights_digest: str | None = None  # of the final weights this worker holds: equal replicas, equal digests
    first_step_loss: float | None = None  # the training loss of this worker's first and last step here
    last_step_loss: float | None = None
    gradient_bytes_sent: int = 0  # over all its steps, as its wire codec sent them (see ExchangeTimes)
    compile_seconds: float | None = None  # spent compiling (--compile; scaletrain.train.compiled), None: eager


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 (first 16 hex digits) of the parameters' bytes in order: two replicas agree exactly or not.

    >>> one, two = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    >>> two.load_state_dict(one.state_dict()) and weights_digest(one) == weights_digest(two)
    True
    """
    digest = hashlib.sha256()
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def throughput(stats: list[WorkerStats], batch_size: int, per_step: int = 1) -> dict[str, float | None]:
    """Batches of ``batch_size`` (``per_step`` in each step: ``--accumulate``) and samples per second over all
    workers, the mean per-step time split (compute,
    communication, waiting for other processes, waiting for data), and the median over workers of their
    minor page faults per step.

    >>> two = [WorkerStats(0, 10, 10, 2.0, 0.5, 0.1), WorkerStats(1, 10, 10, 2.5, 0.5, 0.2)]
    >>> throughput(two, batch_size=32)["batches_per_second"]  # 20 batches in the slower worker's 2.5 s
    8.0
    """
    measured = [s for s in stats if s.measured_steps > 0 and s.measured_seconds > 0]
    if not measured:
        return {
            key: None
            for key in (
                "batches_per_second",
                "samples_per_second",
                "compute_seconds_per_step",
                "communication_seconds_per_step",
                "wait_seconds_per_step",
                "data_seconds_per_step",
                "minor_faults_per_step",
            )
        }
    batches = sum(s.measured_steps * s.batch_fraction for s in measured) * per_step
    duration = max(s.measured_seconds for s in measured)
    per_step = {
        name: sum(value(s) / s.measured_steps for s in measured) / len(measured)
        for name, value in (
            ("communication_seconds_per_step", lambda s: s.communication_seconds),
            ("wait_seconds_per_step", lambda s: s.wait_seconds),
            ("data_seconds_per_step", lambda s: s.data_seconds),
            (
                "compute_seconds_per_step",
                lambda s: s.measured_seconds - s.communication_seconds - s.wait_seconds - s.data_seconds,
            ),
        )
    }
    faults = [s.minor_faults_per_step for s in measured if s.minor_faults_per_step is not None]
    return {
        "batches_per_second": batches / duration,
        "samples_per_second": batches * batch_size / duration,
        "train_seconds": duration,
        **per_step,
        "minor_faults_per_step": statistics.median(faults) if faults else None,
    }


def write_summary(
    prepared: Prepared,
    quality: dict[str, float],
    stats: list[WorkerStats],
    *,
    layout_fields: dict[str, Any],
    steps: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``model.pt`` and ``summary.json`` for the final weights in ``prepared.model``."""
    config, workload, model = prepared.config, prepared.workload, prepared.model
    out = config.out
    torch.save({name: value.cpu() for name, value in model.state_dict().items()}, out / MODEL_NAME)
    steps = steps if steps is not None else max(s.steps for s in stats) + (prepared.resumed_from or 0)
    losses = [s.final_loss for s in stats if s.final_loss is not None]
    origin = workload.origin
    summary = {
        "workload": workload.name,
        # what makes the workload again (scaletrain.load_model): a name or module:attribute; None for an object
        "reference": origin.reference if origin is not None else None,
        "dataset": workload.dataset,
        "metric": workload.metric,
        "out": str(out),
        **layout_fields,
        "steps": steps,
        "steps_per_epoch": prepared.steps_per_epoch,
        "epochs": prepared.schedule.epochs_done(steps),
        "batch_size": config.batch_size,
        # a reconfiguration changed the batch: each stretch of epochs (throughput counts batches of each)
        "batch_schedule": prepared.schedule.to_list() if len(prepared.schedule.segments) > 1 else None,
        "lr": config.lr,
        "optimizer": type(prepared.optimizer).__name__,
        "optimizer_options": config.optimizer_options,
        "lr_schedule": config.lr_schedule,
        "lr_warmup": config.lr_warmup,
        "accumulate": config.accumulate,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "clip_norm": config.clip_norm,
        "divergence": config.divergence,
        "device": str(prepared.device),
        "loader_workers": config.loader_workers,
        # precision, memory_format, ghost_batch, batch_budget and batch_searches: each technique's own account
        **summary_fields(vars(config), prepared.device.type, prepared.technique, prepared.layout),
        "wire": config.wire,
        "wire_options": config.wire_options,
        "error_feedback": config.error_feedback or CODECS[config.wire].feedback_by_default,
        "overlap": config.overlap,
        "bucket_mb": config.bucket_mb if config.overlap else None,
        "compile": config.compile,
        # the slowest worker's seconds in torch.compile's compilations (scaletrain.train.compiled); None: eager
        "compile_seconds": max((s.compile_seconds or 0.0 for s in stats), default=0.0) if config.compile else None,
        "skipped_steps": max((s.skipped_steps for s in stats), default=0),
        "seed": config.seed,
        "threads": prepared.process.threads,
        "allocator": prepared.process.allocator,
        # the workload's own options, or those its factory was called with
        "options": asdict(workload.options) or (dict(origin.options) if origin is not None else {}),
        "parameters_initial": prepared.initial_parameters or count_parameters(model),
        "parameters": count_parameters(model),
        "architecture": prepared.architecture or None,  # how the network differs from the workload's own
        **quality,
        "quality_warning": quality_warning(workload, prepared.data, quality, stats),
        "final_train_loss": losses[0] if losses else None,
        "wall_seconds": time.time() - prepared.started,
        **throughput(stats, config.batch_size, config.accumulate),
        "warmup_steps_excluded": config.warmup_steps,
        "throughput_note": THROUGHPUT_NOTE,
        "per_worker": [asdict(s) for s in stats],
        **(extra or {}),
        "resumed_from_step": prepared.resumed_from,
        "torch_version": torch.__version__,
        "host": platform.node(),
        "started_at": _iso(prepared.started),
        "finished_at": _iso(time.time()),
    }
    write_json(out / SUMMARY_NAME, summary)
    if prepared.architecture and (out / METRICS_NAME).exists():  # the network changed shape while training
        plot_reconfigurations(out / METRICS_NAME, out / PRUNING_PICTURE)
    return summary


def quality_warning(workload: Any, data: Any, quality: dict[str, float], stats: list[WorkerStats]) -> str | None:
    """One line when the evaluated model is no better than guessing although training lowered the loss
    to at most 0.8 of where it began: what a model that is not the trained one (its batch-norm
    statistics lost, say) looks like. ``None`` otherwise, or when the workload knows no chance level.

    >>> class Coin:
    ...     metric, lower_is_better = "test_accuracy", False
    ...     def chance_quality(self, data): return 0.5
    >>> fell = [WorkerStats(0, 9, 9, 1.0, first_step_loss=0.7, last_step_loss=0.2)]
    >>> quality_warning(Coin(), None, {"test_accuracy": 0.51}, fell)[:40]
    'test_accuracy 0.5100 is at chance level '
    >>> quality_warning(Coin(), None, {"test_accuracy": 0.9}, fell) is None
    True
    """
    chance = workload.chance_quality(data) if hasattr(workload, "chance_quality") else None
    first = [s.first_step_loss for s in stats if s.first_step_loss is not None]
    last = [s.last_step_loss for s in stats if s.last_step_loss is not None]
    value = quality.get(workload.metric)
    if chance is None or value is None or not first or not last:
        return None
    begun, ended = statistics.fmean(first), statistics.fmean(last)
    if not ended <= 0.8 * begun:
        return None
    at_chance = value >= 0.9 * chance if workload.lower_is_better else value <= chance + max(0.02, 0.1 * chance)
    if not at_chance:
        return None
    return (
        f"{workload.metric} {value:.4f} is at chance level ({chance:.4f}) although the training loss fell from "
        f"{begun:.3f} to {ended:.3f}: the evaluated model does not show what training did; please report it "
        "with this run folder"
    )


def _iso(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).isoformat(timespec="seconds")
