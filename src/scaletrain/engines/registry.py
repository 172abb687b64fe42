"""The foreign engines scaletrain can run: one line each."""

from __future__ import annotations

from collections.abc import Iterable

from scaletrain.engines.base import Engine
from scaletrain.engines.mxnet import MXNetEngine
from scaletrain.engines.tensorflow import TensorFlowEngine

__all__ = ["ENGINES", "FRAMEWORKS", "departures"]

ENGINES: dict[str, Engine] = {engine.name: engine for engine in (TensorFlowEngine(), MXNetEngine())}
#: every framework ``bench --framework`` takes: scaletrain itself, then the foreign engines
FRAMEWORKS = ("scaletrain", *ENGINES)


def departures(workload: str, frameworks: Iterable[str]) -> list[str]:
    """A line for each foreign engine among ``frameworks`` that trains ``workload`` otherwise than scaletrain.

    >>> departures("lenet", ["scaletrain", "mxnet"]), departures("gpt", ["mxnet"])[0][:40]
    ([], 'mxnet gpt: MXNet 1.9 has no AdamW optimi')
    """
    found = [(name, ENGINES[name].departure(workload)) for name in sorted(set(frameworks) & set(ENGINES))]
    return [f"{name} {workload}: {line}" for name, line in found if line]
