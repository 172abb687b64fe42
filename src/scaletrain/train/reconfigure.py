"""Applying a technique's decision at an agreed step boundary: the new network, batch and schedule."""

from __future__ import annotations

from scaletrain.efficient import Reconfiguration
from scaletrain.efficient.surgery import reconfigure, resized_architecture
from scaletrain.train.state import Prepared, count_steps_per_epoch, make_optimizer

__all__ = ["apply_decision", "change_batch", "describe_decision"]


def apply_decision(prepared: Prepared, decision: Reconfiguration, epoch: int) -> None:
    """The network (weights and momentum carried over) and the batch of every epoch after ``epoch``, as
    ``decision`` says: what every process — worker or server — does at the agreed step boundary."""
    if decision.changes_network:
        config = prepared.config
        prepared.optimizer = reconfigure(
            prepared.model, prepared.optimizer, decision, lambda parameters: make_optimizer(config, parameters)
        )
        prepared.architecture = resized_architecture(prepared.architecture, decision)
        prepared.forward.reconfigured(prepared.model)  # a compiled forward compiles the new network
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


def change_batch(prepared: Prepared, decision: Reconfiguration, epoch: int) -> None:
    """From epoch ``epoch + 1`` on: the decision's batch size (and learning-rate factor), with the steps
    per epoch that follow from it — on every process, the same way."""
    if decision.batch_size is None and decision.lr_scale == 1.0:
        return
    batch = decision.batch_size or prepared.batch_size
    update = batch // prepared.async_split  # an asynchronous split update's part of it
    steps = count_steps_per_epoch(prepared.workload, prepared.data, update * prepared.global_batch_factor)
    prepared.schedule.change(
        epoch=epoch + 1,
        steps_per_epoch=steps,
        batch_size=batch,
        lr_scale=decision.lr_scale,
        warmup_steps=decision.lr_warmup_steps,
    )
