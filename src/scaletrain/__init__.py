"""scaletrain: data-parallel training on many workers, scaling measurements and speedup prediction.

>>> import scaletrain
>>> sorted(scaletrain.WORKLOADS)
['lenet', 'ptb-lstm']
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "WORKLOADS",
    "ClassificationWorkload",
    "ConfigError",
    "DataError",
    "ScaletrainError",
    "TrainConfig",
    "Workload",
    "bench",
    "compare",
    "create_workload",
    "list_workloads",
    "make_config",
    "train",
]
__version__ = "0.1.0"

# Names are imported on first use: every worker process imports this package, and most of them
# need neither the plotting nor the benchmarking code (matplotlib alone costs a noticeable start-up).
_HOMES = {
    "bench": "scaletrain.api",
    "compare": "scaletrain.api",
    "list_workloads": "scaletrain.api",
    "make_config": "scaletrain.api",
    "train": "scaletrain.api",
    "TrainConfig": "scaletrain.config",
    "ConfigError": "scaletrain.errors",
    "DataError": "scaletrain.errors",
    "ScaletrainError": "scaletrain.errors",
    "WORKLOADS": "scaletrain.workloads",
    "Workload": "scaletrain.workloads",
    "create_workload": "scaletrain.workloads",
    "ClassificationWorkload": "scaletrain.workloads.classification",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'scaletrain' has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name]), name)


def __dir__() -> list[str]:
    return sorted(__all__)
