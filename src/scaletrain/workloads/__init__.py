"""The registry of workloads: name → class. Adding a workload = one module + one line here."""

from __future__ import annotations

from typing import Any

from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.workloads.base import Workload
from scaletrain.workloads.googlenet import GoogLeNetWorkload
from scaletrain.workloads.lenet import LeNetWorkload
from scaletrain.workloads.ptb_lstm import PTBLSTMWorkload
from scaletrain.workloads.resnet import ResNet20Workload, ResNet32Workload, ResNet56Workload, ResNetWorkload
from scaletrain.workloads.resnet34 import ResNet34Workload
from scaletrain.workloads.squeezenet import SqueezeNetWorkload
from scaletrain.workloads.vgg16e import VGG16EWorkload

__all__ = ["WORKLOADS", "Part", "Workload", "create_workload"]

WORKLOADS: dict[str, type[Workload]] = {
    LeNetWorkload.name: LeNetWorkload,
    PTBLSTMWorkload.name: PTBLSTMWorkload,
    VGG16EWorkload.name: VGG16EWorkload,
    GoogLeNetWorkload.name: GoogLeNetWorkload,
    SqueezeNetWorkload.name: SqueezeNetWorkload,
    ResNet34Workload.name: ResNet34Workload,
    ResNetWorkload.name: ResNetWorkload,
    ResNet20Workload.name: ResNet20Workload,
    ResNet32Workload.name: ResNet32Workload,
    ResNet56Workload.name: ResNet56Workload,
}


def create_workload(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Instantiate a registered workload by name.

    >>> create_workload("lenet").metric
    'test_accuracy'
    """
    try:
        workload_class = WORKLOADS[name]
    except KeyError:
        raise ConfigError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}") from None
    return workload_class(options)
