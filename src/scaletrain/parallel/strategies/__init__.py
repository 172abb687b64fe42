"""The strategies, one module each, and the registry everything else derives their names from.

Adding a strategy = one module with a :class:`~scaletrain.parallel.strategies.base.Strategy`
subclass + one line in :data:`STRATEGIES` (here, or in a module named in ``SCALETRAIN_PLUGINS``).
From the registry come: ``scaletrain train --strategy``'s choices, the bench's strategy specs
(``allreduce-join``, ``ps-central-async`` …), the layout checks, the labels in summaries and results,
the launcher's and a deployment's handling of a lost worker, the estimator's list of configurations
and, from each strategy's :meth:`~scaletrain.parallel.strategies.base.Strategy.estimator_terms`, its
predictions.
"""

from __future__ import annotations

from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.allreduce import AllReduce
from scaletrain.parallel.strategies.base import (
    ALIASES,
    SERVER,
    STRATEGIES,
    WORKER,
    Layout,
    Strategy,
    get_strategy,
    run_label,
)
from scaletrain.parallel.strategies.local import Local
from scaletrain.parallel.strategies.ps import ParameterServer

__all__ = [
    "ALIASES",
    "SERVER",
    "STRATEGIES",
    "WORKER",
    "Layout",
    "Strategy",
    "all_specs",
    "expand_spec",
    "get_strategy",
    "parse_spec",
    "run_label",
]

STRATEGIES.update(
    (strategy.name, strategy)
    for strategy in (
        Local(),
        AllReduce(),
        ParameterServer(),
    )
)


def all_specs(*, predicted_only: bool = False) -> list[str]:
    """Every strategy spec, in registry order.

    >>> all_specs()[:3]
    ['local', 'allreduce-join', 'allreduce-split']
    """
    return [spec for s in STRATEGIES.values() if s.predicted or not predicted_only for spec in s.specs()]


def parse_spec(spec: str) -> tuple[str, str, str]:
    """``ps-central-async`` → ``("ps", "central", "async")``; ``allreduce-split`` → ``("allreduce", "", "split")``.

    Case and the thesis's aliases (``distributed``, ``none``) are accepted.

    >>> parse_spec("PS-Distributed-None")
    ('ps', 'sharded', 'async')
    """
    parts = [ALIASES.get(part, part) for part in spec.strip().lower().split("-")]
    strategy = STRATEGIES.get(parts[0])
    if strategy is not None:
        server = parts[1] if strategy.servers and len(parts) > 1 else ""
        rest = parts[1 + bool(strategy.servers) :]
        sync = rest[0] if len(strategy.syncs) > 1 and len(rest) == 1 else strategy.syncs[0]
        known = (not strategy.servers or server in strategy.servers) and sync in strategy.syncs
        if known and strategy.label(server, sync) == "-".join(parts):
            return strategy.name, server, sync
    raise ConfigError(f"unknown strategy spec {spec!r}; choose one of {', '.join(all_specs())}")


def expand_spec(settings: dict[str, Any]) -> dict[str, Any]:
    """Settings whose ``strategy`` is a whole spec as the bench writes it, with the spec split into
    ``strategy``, ``server`` and ``sync`` (one vocabulary for both); other settings come back as given.

    >>> expand_spec({"strategy": "ps-central-async", "workers": 3})
    {'strategy': 'ps', 'workers': 3, 'server': 'central', 'sync': 'async'}
    """
    spec = settings.get("strategy")
    if not isinstance(spec, str) or "-" not in spec:
        return settings
    strategy, server, sync = parse_spec(spec)
    return {**settings, "strategy": strategy, **({"server": server} if server else {}), "sync": sync}
