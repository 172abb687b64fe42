"""Everything a plug-in needs, in one import: a strategy, a technique, a wire codec or a workload of one's own.

A plug-in is one module with one class and one registry line (``STRATEGIES[name] = ...``, ``TECHNIQUES``,
``CODECS``, ``WORKLOADS``), named in ``SCALETRAIN_PLUGINS`` so that every process of a run imports it
(``docs/extending.md`` walks through each kind). The names here are the supported surface: code behind them
may move between scaletrain's modules, these imports stay.

>>> from scaletrain.extend import STRATEGIES, Strategy, StrategyOption, worker_role
>>> sorted(STRATEGIES)[:3]
['allreduce', 'diloco', 'local']
"""

from __future__ import annotations

from scaletrain.config import TrainConfig
from scaletrain.efficient import TECHNIQUES, EpochEnd, Reconfiguration, Setting, Technique, option
from scaletrain.errors import ConfigError, DataError
from scaletrain.parallel.strategies import STRATEGIES, Layout, Strategy, StrategyOption
from scaletrain.parallel.strategies.allreduce import AllReduceExchange
from scaletrain.parallel.strategies.base import collect_stats, layout_fields, train_worker
from scaletrain.parallel.strategies.roles import worker_role
from scaletrain.parallel.strategies.terms import EstimatorTerms, StepInputs, transfer_seconds, weight_bytes
from scaletrain.tensors.codec import CODECS, Collectives, TensorLayout, WireCodec
from scaletrain.tensors.flat import flatten, unflatten_into
from scaletrain.train.exchange import ExchangeTimes, GradientExchange, clip_and_step
from scaletrain.train.meter import now
from scaletrain.train.state import Prepared, Role
from scaletrain.train.summary import write_summary
from scaletrain.workloads import WORKLOADS
from scaletrain.workloads.base import Workload, WorkloadDefaults
from scaletrain.workloads.classification import ClassificationData, ClassificationWorkload
from scaletrain.workloads.functions import FunctionsWorkload, from_functions

__all__ = [
    "CODECS",
    "STRATEGIES",
    "TECHNIQUES",
    "WORKLOADS",
    "AllReduceExchange",
    "ClassificationData",
    "ClassificationWorkload",
    "Collectives",
    "ConfigError",
    "DataError",
    "EpochEnd",
    "EstimatorTerms",
    "ExchangeTimes",
    "FunctionsWorkload",
    "GradientExchange",
    "Layout",
    "Prepared",
    "Reconfiguration",
    "Role",
    "Setting",
    "StepInputs",
    "Strategy",
    "StrategyOption",
    "Technique",
    "TensorLayout",
    "TrainConfig",
    "WireCodec",
    "Workload",
    "WorkloadDefaults",
    "clip_and_step",
    "collect_stats",
    "flatten",
    "from_functions",
    "layout_fields",
    "now",
    "option",
    "train_worker",
    "transfer_seconds",
    "unflatten_into",
    "weight_bytes",
    "worker_role",
    "write_summary",
]
