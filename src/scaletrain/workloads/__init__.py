"""The registry of workloads: name → class. Adding a workload = one module + one line here.

Besides the registered names, :func:`create_workload` makes the workloads installed packages declare
(entry-point group ``scaletrain.workloads``, :func:`scaletrain.plugins.installed_workloads`) and any
``module:attribute`` reference (:mod:`scaletrain.workloads.reference`): every process that is handed
one of these strings makes the same workload from it.
"""

from __future__ import annotations

from typing import Any

from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.plugins import installed_workloads
from scaletrain.workloads.base import Origin, Workload
from scaletrain.workloads.googlenet import GoogLeNetWorkload
from scaletrain.workloads.gpt import GPTWorkload
from scaletrain.workloads.lenet import LeNetWorkload
from scaletrain.workloads.ptb_lstm import PTBLSTMWorkload
from scaletrain.workloads.reference import EXAMPLE, is_reference, make_from_reference, workload_label
from scaletrain.workloads.resnet import ResNet20Workload, ResNet32Workload, ResNet56Workload, ResNetWorkload
from scaletrain.workloads.resnet34 import ResNet34Workload
from scaletrain.workloads.squeezenet import SqueezeNetWorkload
from scaletrain.workloads.vgg16e import VGG16EWorkload

__all__ = [
    "WORKLOADS",
    "Origin",
    "Part",
    "Workload",
    "check_workload_name",
    "create_workload",
    "is_reference",
    "workload_label",
    "workload_names",
]

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
    GPTWorkload.name: GPTWorkload,
}


def workload_names() -> list[str]:
    """The names a workload may be asked for by: the registered ones, then those installed packages declare.

    >>> workload_names()[:3]
    ['lenet', 'ptb-lstm', 'vgg16e']
    """
    return [*WORKLOADS, *(name for name in installed_workloads() if name not in WORKLOADS)]


def check_workload_name(name: str) -> str:
    """``name`` if it names a workload (a known name, or a reference of the form ``module:attribute``,
    whose import is checked when the workload is made); otherwise an error listing the choices.

    >>> check_workload_name("lenet"), check_workload_name("my_pkg.tasks:make_workload")
    ('lenet', 'my_pkg.tasks:make_workload')
    """
    if is_reference(name) or name in WORKLOADS or name in installed_workloads():
        return name
    raise ConfigError(
        f"unknown workload {name!r}; choose one of: {', '.join(workload_names())}, or name your own as "
        f"module:attribute (e.g. {EXAMPLE})"
    )


def create_workload(name: str, options: dict[str, Any] | None = None) -> Workload:
    """Make a workload: a registered name, an installed package's, or a ``module:attribute`` reference.

    The workload remembers what made it (:attr:`Workload.origin`), so that another process, or
    :func:`scaletrain.load_model` later, makes the same one.

    >>> create_workload("lenet").metric
    'test_accuracy'
    >>> create_workload("scaletrain.workloads.lenet:LeNetWorkload").origin.reference
    'scaletrain.workloads.lenet:LeNetWorkload'
    """
    options = dict(options or {})
    check_workload_name(name)
    if name in WORKLOADS:
        workload = WORKLOADS[name](options)
    elif is_reference(name):
        workload = make_from_reference(name, options)
    else:
        entry = installed_workloads()[name]
        package = f" of package {entry.dist.name}" if entry.dist is not None else ""
        known_as = f"workload {name} (entry point {entry.value}{package})"
        workload = make_from_reference(entry.value, options, known_as=known_as)
    workload.origin = Origin(name, options)
    return workload
