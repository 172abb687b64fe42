"""A run whose evaluated model is no better than guessing although its training loss fell says so
(issue 29: the next defect like the central server's lost batch-norm statistics is seen by whoever runs it)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

import scaletrain
from scaletrain.measure.bench import _outcome
from scaletrain.measure.report import write_report


def shifted_labels_workload(shift: int = 1) -> scaletrain.ClassificationWorkload:
    """Four learnable classes whose test labels are shifted by ``shift``: the trained model is wrong on
    nearly every test sample — what a saved model that is not the trained one looks like."""
    generator = torch.Generator().manual_seed(0)
    centres = 3 * torch.randn(4, 8, generator=generator)

    def split(count: int, shift: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, 4, (count,), generator=generator)
        return centres[labels] + 0.3 * torch.randn(count, 8, generator=generator), (labels + shift) % 4

    return scaletrain.ClassificationWorkload.from_tensors(
        "shifted", lambda: nn.Linear(8, 4), train=split(256, 0), test=split(128, shift), batch_size=16, lr=0.1
    )


def test_a_model_at_chance_whose_loss_fell_is_flagged_in_the_summary_bench_line_and_report(tmp_path: Path) -> None:
    summary = scaletrain.train(
        shifted_labels_workload(), out=tmp_path / "run", epochs=2, threads=1, tensorboard=False, progress="off"
    )
    warning = summary["quality_warning"]
    assert warning is not None and warning.startswith(f"test_accuracy {summary['test_accuracy']:.4f} is at chance")
    first, last = summary["per_worker"][0]["first_step_loss"], summary["per_worker"][0]["last_step_loss"]
    assert last <= 0.8 * first and f"fell from {first:.3f} to {last:.3f}" in warning
    row = {"status": "ok", "batches_per_second": 5.0, "workers": 1, "quality_warning": warning}
    assert _outcome(row).endswith(f"warning: {warning}")
    row.update(strategy="local", batch_size=16, metric="test_accuracy", quality=summary["test_accuracy"])
    (tmp_path / "bench").mkdir()
    report = write_report([row], [], tmp_path / "bench", title="t", pictures=[]).read_text()
    assert "## Runs whose quality is at chance level" in report and warning in report


def test_a_trained_model_is_not_flagged(tmp_path: Path) -> None:
    summary = scaletrain.train(
        shifted_labels_workload(shift=0), out=tmp_path / "run", epochs=2, threads=1, tensorboard=False, progress="off"
    )
    assert summary["test_accuracy"] > 0.9 and summary["quality_warning"] is None
