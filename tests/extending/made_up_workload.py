"""A made-up workload in one module, registered with one line (tests/extending/test_new_workload.py):
a small MLP classifying the two spirals of :mod:`tests.extending.made_up_points`; metric: test accuracy."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from scaletrain.workloads import WORKLOADS
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import ClassificationData, ClassificationWorkload
from tests.extending.made_up_points import find_points, read_points


class SpiralsWorkload(ClassificationWorkload):
    """A 2-64-64-2 MLP on two interleaved spirals; metric: test accuracy."""

    name = "spirals"
    dataset = "two spirals (train.csv / test.csv of x,y,label)"
    defaults = WorkloadDefaults(epochs=20, batch_size=32, lr=0.05, momentum=0.9)

    def build_model(self) -> nn.Module:
        return nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ClassificationData:
        folder = find_points(data_dir)
        return ClassificationData(*read_points(folder / "train.csv"), *read_points(folder / "test.csv"))


WORKLOADS[SpiralsWorkload.name] = SpiralsWorkload
