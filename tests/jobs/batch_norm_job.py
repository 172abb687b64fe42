"""One process of the synchronised batch norm's training tests (tests/parallel/test_batch_norm.py), started
with the torchrun variables so that it can train a workload object of its own: a user's small residual
network with 2-D and 1-D batch norm, on images far from mean 0 and variance 1.

``python batch_norm_job.py OUT PORT[,PORT...] NAME[,NAME...]`` runs the trainings named (keys of
:data:`TRAININGS`) one after another, each into ``OUT/NAME`` with the next port of the list, and prints
``=== NAME`` before each, so that the test can tell which training printed what.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import nn

import scaletrain

BATCH = 16  # the global batch: split over the workers, or one process's
STEPS_PER_EPOCH = 20
CLASSES = 4
SETTINGS: dict[str, Any] = dict(
    epochs=2, lr=0.05, momentum=0.9, threads=1, seed=7, tensorboard=False, progress="off", timeout=60.0
)
PRUNE: dict[str, Any] = dict(technique="prunetrain", technique_options={"ratio": 0.5, "threshold": 0.12, "every": 1})
SPLIT = dict(workers=2, sync="split", sync_batchnorm=True)
#: Each training's settings besides :data:`SETTINGS`; those of one process are the references.
TRAININGS: dict[str, dict[str, Any]] = {
    "local": {},
    "local-prunetrain": PRUNE,
    "allreduce-split": dict(SPLIT, strategy="allreduce"),
    "allreduce-split-plain": dict(SPLIT, strategy="allreduce", sync_batchnorm=False),
    "allreduce-split-prunetrain": dict(SPLIT, strategy="allreduce", **PRUNE),
    # join: each worker a batch of BATCH/2, the update one of BATCH, as one process's
    "allreduce-join": dict(SPLIT, strategy="allreduce", sync="join", batch_size=BATCH // 2),
    "ps-sharded-split": dict(SPLIT, strategy="ps", server="sharded"),
    "ps-sharded-split-prunetrain": dict(SPLIT, strategy="ps", server="sharded", **PRUNE),
    "ps-central-split": dict(SPLIT, strategy="ps", server="central"),
}


class Block(nn.Module):
    """A residual block as the surgery knows one: ``residual``, ``shortcut`` and ``relu`` children."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.residual = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )
        self.shortcut = nn.Identity()
        self.relu = nn.ReLU()

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.relu(self.residual(inputs) + self.shortcut(inputs))


def network() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1, bias=False),
        nn.BatchNorm2d(6),
        nn.ReLU(),
        Block(6),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(24, 12),
        nn.BatchNorm1d(12),
        nn.ReLU(),
        nn.Linear(12, CLASSES),
    )


def workload() -> scaletrain.ClassificationWorkload:
    """Four classes of 8×8 images: a class pattern scaled and shifted far from batch norm's starting
    statistics, plus noise."""
    generator = torch.Generator().manual_seed(11)
    patterns = torch.randn(CLASSES, 1, 8, 8, generator=generator)

    def split(count: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.randint(0, CLASSES, (count,), generator=generator)
        return 4.0 * (patterns[labels] + 0.8 * torch.randn(count, 1, 8, 8, generator=generator)) + 3.0, labels

    return scaletrain.ClassificationWorkload.from_tensors(
        "residual-bn", network, train=split(BATCH * STEPS_PER_EPOCH), test=split(64), batch_size=BATCH
    )


def train(name: str, out: Path) -> dict[str, Any]:
    return scaletrain.train(workload(), out=out / name, **{**SETTINGS, **TRAININGS[name]})


def main(out: Path, ports: list[int], names: list[str]) -> None:
    for name, port in zip(names, ports, strict=False):
        os.environ["MASTER_PORT"] = str(port)
        print(f"=== {name}", file=sys.stderr, flush=True)
        train(name, out)


if __name__ == "__main__":
    main(Path(sys.argv[1]), [int(p) for p in sys.argv[2].split(",")], sys.argv[3].split(","))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # leave without gloo's teardown at interpreter exit (see scaletrain.exit_now)
