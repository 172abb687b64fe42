"""scaletrain: data-parallel training on many workers, scaling measurements and speedup prediction.

>>> import scaletrain
>>> sorted(scaletrain.WORKLOADS)
['lenet', 'ptb-lstm']
"""

# ``train`` the function, not the ``scaletrain.train`` subpackage: importing the API first loads the
# subpackage, and this import then binds the name to the function.
from scaletrain.api import bench, compare, list_workloads, make_config, train
from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, DataError, ScaletrainError
from scaletrain.workloads import WORKLOADS, Workload, create_workload
from scaletrain.workloads.classification import ClassificationWorkload

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
