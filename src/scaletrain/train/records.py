"""What the coordinating process writes while it trains: ``metrics.jsonl``, TensorBoard events and the
progress line, one record per logged step, per epoch and per reconfiguration."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from torch import nn

from scaletrain.efficient import Reconfiguration
from scaletrain.efficient.cost import network_figures
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog
from scaletrain.train.meter import EpochSteps
from scaletrain.train.state import Prepared
from scaletrain.workloads.base import count_parameters

__all__ = ["RunRecords"]


class RunRecords:
    """The run's records; a process that does not write them (``writes`` False) keeps only a silent
    progress line."""

    def __init__(self, prepared: Prepared, *, writes: bool) -> None:
        config = prepared.config
        self.metrics = MetricsLog(config.out, resume_step=prepared.resumed_from) if writes else None
        self.tensorboard = TensorBoardLog(
            config.out, enabled=config.tensorboard and writes, purge_step=prepared.resumed_from
        )
        self.progress = Progress(prepared.schedule.total_steps, mode=config.progress if writes else "off")
        self._predicted: dict[str, float] | None = None  # by the last reconfiguration, for the next epoch

    def step(self, step: int, epoch: int, loss: float, lr: float, rate: float | None, samples: float | None) -> None:
        """A logged step's record."""
        assert self.metrics is not None
        self.metrics.write(
            {
                "kind": "step",
                "step": step,
                "epoch": epoch,
                "loss": loss,
                "lr": lr,
                "batches_per_second": rate,
                "samples_per_second": samples,
                "time": time.time(),
            }
        )
        self.tensorboard.scalars(
            {
                "train/loss": loss,
                "throughput/batches_per_second": rate,
                "throughput/samples_per_second": samples,
            },
            step,
        )

    def epoch(
        self,
        *,
        epoch: int,
        step: int,
        train_loss: float,
        seconds: float,
        model: nn.Module,
        steps: EpochSteps,
        evaluate: Callable[[], dict[str, float]] | None,
    ) -> dict[str, float] | None:
        """An epoch's record (``seconds``: training only, before this evaluation), with the quality
        ``evaluate`` measures, if given; returns that quality."""
        if self.metrics is None:
            return None
        record = {
            "kind": "epoch",
            "step": step,
            "epoch": epoch,
            "train_loss": train_loss,
            "seconds": seconds,
            "parameters": count_parameters(model),
            **steps.figures(),
        }
        if self._predicted is not None:  # what the last reconfiguration predicted for this epoch, beside it
            record.update({f"predicted_{key}": value for key, value in self._predicted.items()})
            self._predicted = None
        message = f"epoch {epoch + 1}: train loss {train_loss:.4f}"
        quality = None
        if evaluate is not None:
            quality = evaluate()
            record.update(quality)
            self.tensorboard.scalars({f"quality/{key}": value for key, value in quality.items()}, step)
            message += "".join(f", {key} {value:.4f}" for key, value in quality.items())
        self.metrics.write(record)
        self.progress.message(message)
        return quality

    @staticmethod
    def network(model: nn.Module, example_inputs: Any, evaluate: Callable[[], dict[str, float]]) -> dict[str, Any]:
        """Parameters, FLOPs per sample, channels per layer and quality of the network now."""
        figures = network_figures(model, example_inputs)
        return {**figures, "quality": evaluate()}

    def reconfiguration(
        self,
        *,
        epoch: int,
        step: int,
        decision: Reconfiguration,
        before: dict[str, Any],
        after: dict[str, Any],
        steps: EpochSteps,
    ) -> None:
        """A reconfiguration's record: the network before and after, and what it predicts for the next epoch."""
        self._predicted = steps.scaled(
            compute=after["flops_per_sample"] / max(before["flops_per_sample"], 1.0),
            communication=after["parameters"] / max(before["parameters"], 1),
        )
        record = {
            "kind": "reconfiguration",
            "step": step,
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
            **{f"{key}_before": value for key, value in steps.figures().items()},
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
            step,
        )

    def close(self) -> None:
        self.progress.close()
        if self.metrics is not None:
            self.metrics.close()
        self.tensorboard.close()
