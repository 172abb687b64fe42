"""One process of the module-buffer tests' jobs (tests/parallel/test_buffers.py), started with the
torchrun variables so that it can train a workload object of its own: two small networks, one with
batch norm and one without, each with a buffer of the user's own.

``python buffers_job.py SPEC OUT PORT[,PORT...]`` runs, for each network, four trainings of the same
settings under the strategy ``SPEC`` (``local`` and ``local-join``, one process over the batch of a
split or a join step, need no variables): ``uninterrupted`` (2 epochs,
checkpoints every 3 steps), ``steps`` (stopped by ``--steps`` inside epoch 1), ``resumed-steps`` (resumed
from that mid-epoch checkpoint, stopped inside epoch 2) and ``resumed-epochs`` (resumed again, to the end
of epoch 2). Each training uses the next port of the list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

import scaletrain
from tests.helpers import one_process_options

BATCH = 8  # per worker under join, the global batch under split
STEPS_PER_EPOCH = 8
CLASSES = 4
SETTINGS = dict(lr=0.02, momentum=0.9, threads=1, seed=5, tensorboard=False, progress="off", checkpoint_every=3)


class InputAverage(nn.Module):
    """A user's buffers: the running average of the input (linear in the batches, like batch norm's
    running mean) and a fixed mask; the output is the input masked."""

    def __init__(self, shape: tuple[int, ...], scale: float = 1.0) -> None:
        super().__init__()
        self.scale = scale
        self.register_buffer("average", torch.zeros(shape))
        self.register_buffer("mask", torch.ones(shape, dtype=torch.bool))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                self.average.mul_(0.8).add_(inputs.mean(dim=0), alpha=0.2)
        return inputs * self.mask * self.scale


def network(batch_norm: bool) -> nn.Module:
    # without batch norm the inputs are scaled down to keep the steps moderate
    layers: list[nn.Module] = [InputAverage((1, 6, 6), 1.0 if batch_norm else 0.04), nn.Conv2d(1, 6, 3, padding=1)]
    layers += [nn.BatchNorm2d(6)] if batch_norm else []
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(6 * 36, CLASSES)]
    return nn.Sequential(*layers)


def data(seed: int = 11) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Four classes of 6×6 images: a class pattern scaled and shifted far from zero mean and unit
    variance (so that batch norm's starting statistics are wrong for it), plus noise."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, 1, 6, 6, generator=generator)

    def split(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, CLASSES, (count,), generator=generator)
        noise = 0.6 * torch.randn(count, 1, 6, 6, generator=generator)
        return 25.0 * (patterns[labels] + noise) + 10.0, labels

    return split(2 * BATCH * STEPS_PER_EPOCH), split(256)


def workload(batch_norm: bool) -> scaletrain.ClassificationWorkload:
    train, test = data()
    name = "buffers-bn" if batch_norm else "buffers-plain"
    return scaletrain.ClassificationWorkload.from_tensors(
        name, lambda: network(batch_norm), train=train, test=test, batch_size=BATCH
    )


def legs(spec: str) -> list[tuple[str, dict]]:
    """The four trainings, each with what it adds to :data:`SETTINGS`. A join step takes a batch of
    ``BATCH`` on each worker: an epoch has half as many steps, each like one process's step over a batch
    of 2 × ``BATCH`` (``local-join``)."""
    per_epoch = STEPS_PER_EPOCH if "join" in spec else 2 * STEPS_PER_EPOCH
    inside_first, inside_second = per_epoch // 2 + 1, per_epoch + per_epoch // 2 + 1
    return [
        ("uninterrupted", dict(epochs=2)),
        ("steps", dict(epochs=2, steps=inside_first)),
        ("resumed-steps", dict(epochs=2, steps=inside_second, resume=True, folder="steps")),
        ("resumed-epochs", dict(epochs=2, resume=True, folder="steps")),
    ]


def main(spec: str, out: Path, ports: list[int]) -> None:
    port = iter(ports)
    for batch_norm in (False, True):
        own = workload(batch_norm)
        for leg, extra in legs(spec):
            folder = out / own.name / extra.pop("folder", leg)
            settings = {**SETTINGS, **extra}
            if spec == "local-join":
                settings.update(batch_size=2 * BATCH)
            elif spec != "local":
                os.environ["MASTER_PORT"] = str(next(port))
                settings.update(workers=2, strategy=spec, strategy_options=one_process_options(spec))
                if spec.endswith("-async"):  # Downpour's whole batches: the local reference's steps
                    settings.update(async_batches="share")
            summary = scaletrain.train(own, out=folder, **settings)
            if "metric" in summary:  # rank 0: keep what this leg wrote before the next leg resumes it
                (folder / f"{leg}.model.pt").write_bytes((folder / "model.pt").read_bytes())
                (folder / f"{leg}.summary.json").write_bytes((folder / "summary.json").read_bytes())


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")] if len(sys.argv) > 3 else [])
    sys.stdout.flush()
    os._exit(0)  # leave without gloo's teardown at interpreter exit (see scaletrain.exit_now)
