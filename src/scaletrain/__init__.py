"""scaletrain: data-parallel training on many workers, scaling measurements and speedup prediction.

>>> import scaletrain
>>> sorted(scaletrain.WORKLOADS)  # doctest: +NORMALIZE_WHITESPACE
['googlenet', 'gpt', 'lenet', 'ptb-lstm', 'resnet', 'resnet20', 'resnet32', 'resnet34', 'resnet56', 'squeezenet',
 'vgg16e']
"""

# ``train`` the function, not the ``scaletrain.train`` subpackage: importing the API first loads the
# subpackage, and this import then binds the name to the function.
from scaletrain.api import (
    bench,
    compare,
    deploy_kubernetes,
    deploy_kubernetes_bench,
    estimate,
    estimate_range,
    exit_now,
    list_workloads,
    load_model,
    make_config,
    profile,
    recommend,
    strategy_spec,
    train,
    validate,
)
from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, DataError, ScaletrainError
from scaletrain.workloads import WORKLOADS, Workload, create_workload
from scaletrain.workloads.classification import ClassificationWorkload
from scaletrain.workloads.functions import FunctionsWorkload, from_functions

__all__ = [
    "WORKLOADS",
    "ClassificationWorkload",
    "ConfigError",
    "DataError",
    "FunctionsWorkload",
    "ScaletrainError",
    "TrainConfig",
    "Workload",
    "bench",
    "compare",
    "create_workload",
    "deploy_kubernetes",
    "deploy_kubernetes_bench",
    "estimate",
    "estimate_range",
    "exit_now",
    "from_functions",
    "list_workloads",
    "load_model",
    "make_config",
    "profile",
    "recommend",
    "strategy_spec",
    "train",
    "validate",
]
__version__ = "0.1.0"
