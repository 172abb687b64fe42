"""The foreign engines scaletrain can run: one line each."""

from __future__ import annotations

from scaletrain.engines.base import Engine
from scaletrain.engines.mxnet import MXNetEngine
from scaletrain.engines.tensorflow import TensorFlowEngine

__all__ = ["ENGINES", "FRAMEWORKS"]

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (TensorFlowEngine(), MXNetEngine())}
#: every framework ``bench --framework`` takes: scaletrain itself, then the foreign engines
FRAMEWORKS = ("scaletrain", *ENGINES)
