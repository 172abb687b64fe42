"""The strategies, one module each, and the registry everything else derives their names from.

Adding a strategy = one module with a :class:`~scaletrain.parallel.strategies.base.Strategy`
subclass + one line in :data:`STRATEGIES`. From the registry come: ``scaletrain train --strategy``'s
choices, the bench's strategy specs (``allreduce-join``, ``ps-central-async`` …), the layout checks,
the labels in summaries and results, and the estimator's list of configurations.
"""

from __future__ import annotations

from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.allreduce import AllReduce
from scaletrain.parallel.strategies.base import Strategy
from scaletrain.parallel.strategies.local import Local
from scaletrain.parallel.strategies.ps import ParameterServer

__all__ = ["ALIASES", "STRATEGIES", "Strategy", "all_specs", "get_strategy", "parse_spec"]

STRATEGIES: dict[str, Strategy] = {
    strategy.name: strategy
    for strategy in (
        Local(),
        AllReduce(),
        ParameterServer(),
    )
}

#: The thesis's words for the same things (Šlampa 2017): ``distributed`` server, ``none`` sync.
ALIASES = {"distributed": "sharded", "none": "async"}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None


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
