"""Registers ``lazy-fashion`` (tests/parallel/lazy_fashion.py) in every process of a run whose
``SCALETRAIN_PLUGINS`` names this module; no test module imports it, so the registry stays as it is."""

from __future__ import annotations

from tests.parallel.lazy_fashion import LazyFashion

from scaletrain.workloads import WORKLOADS

WORKLOADS[LazyFashion.name] = LazyFashion
