"""Building a run: data, model, optimizer and techniques, and the checkpoint restored when resuming."""

from __future__ import annotations

import time

import torch

from scaletrain.config import TrainConfig
from scaletrain.data.loading import Loading
from scaletrain.efficient import techniques_for
from scaletrain.efficient.surgery import apply_architecture
from scaletrain.train.checkpoint import (
    CHECKPOINT_NAME,
    StrategyLabel,
    check_compatible,
    load_checkpoint,
    make_folder,
    refuse_overwrite,
)
from scaletrain.train.compiled import TrainingForward
from scaletrain.train.defaults import resolve
from scaletrain.train.runtime import ProcessSettings
from scaletrain.train.schedule import Position, Schedule
from scaletrain.train.state import Prepared, check_async_split, count_steps_per_epoch, make_optimizer
from scaletrain.workloads import Workload, create_workload
from scaletrain.workloads.base import count_parameters

__all__ = ["prepare"]


def prepare(
    config: TrainConfig,
    workload: Workload | None = None,
    *,
    process: ProcessSettings,
    global_batch_factor: int = 1,
    async_split: int = 1,
    coordinator: bool = True,
    device: torch.device | None = None,
    workers_device: torch.device | None = None,
    label_of: StrategyLabel,
) -> Prepared:
    """Load data, build model and optimizer, and restore ``checkpoint.pt`` when resuming.

    ``process``: the threads and allocator the caller set up (:func:`scaletrain.train.runtime.configure_process`);
    ``device``: where the model lives (default: the CPU); ``workers_device``: where the run's workers
    compute, when this process is a server that does not (its precision settings are theirs);
    ``label_of``: how the strategy names a run (for checkpoints); ``async_split``: asynchronous workers that
    divide ``--batch-size`` (:mod:`scaletrain.parallel.strategies.ps.async_batches`): each update, and the
    schedule's steps, a batch of ``batch_size // async_split``.
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

    # how this process reads: a Dataset workload's loader workers, page-locked batches for a GPU's copies
    workload.set_loading(Loading(config.loader_workers, pin_memory=device.type == "cuda", timeout=config.timeout))
    data = workload.load_data(config.data_dir, download=config.download)
    check_async_split(config.batch_size, async_split)
    update = config.batch_size * config.accumulate // async_split  # an update's samples on one worker
    steps_per_epoch = count_steps_per_epoch(workload, data, update * global_batch_factor)
    schedule = Schedule.starting(
        steps_per_epoch=steps_per_epoch, batch_size=config.batch_size, epochs=config.epochs, step_limit=config.steps
    )

    torch.manual_seed(config.seed)
    model = workload.build_model()
    # the --technique choice and what the run's own settings turn on, once, as their classes declare; those
    # that keep no state (the activations' layout, ghost batches) apart from the checkpointed stack
    technique, layout = techniques_for(vars(config), workers_device.type)
    for stack in (technique, layout):
        if stack is not None:
            stack.prepare_model(model)  # ghost batch norm: before the architecture of a resume, the optimizer
    model.train()
    initial_parameters = count_parameters(model)
    position, state, resumed_from, architecture, decided, first_losses = Position(), None, None, {}, 0, []
    checkpoint = None
    if config.resume:
        checkpoint = load_checkpoint(out / CHECKPOINT_NAME)
        check_compatible(checkpoint, config, workload, label_of, async_split)
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
        first_losses = [float(loss) for loss in checkpoint.get("first_losses") or []]
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
        layout,
        label_of(config.strategy, config.server, config.sync, config.workers),
        first_losses,
        async_split,
        TrainingForward(
            model, compiled=config.compile, memory_format=config.memory_format, device_type=workers_device.type
        ),
    )
