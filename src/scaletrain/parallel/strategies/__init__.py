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

from collections.abc import Mapping
from typing import Any

from scaletrain.config import TrainConfig, default_strategy
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.allreduce import AllReduce
from scaletrain.parallel.strategies.base import (
    ALIASES,
    SERVER,
    STRATEGIES,
    WORKER,
    Layout,
    Strategy,
    StrategyOption,
    get_strategy,
    run_label,
)
from scaletrain.parallel.strategies.diloco import DiLoCo
from scaletrain.parallel.strategies.local import Local
from scaletrain.parallel.strategies.ps.strategy import ParameterServer
from scaletrain.tensors.codec import CODECS

__all__ = [
    "ALIASES",
    "SERVER",
    "STRATEGIES",
    "WORKER",
    "Layout",
    "Strategy",
    "StrategyOption",
    "all_specs",
    "check_strategy_settings",
    "expand_spec",
    "get_strategy",
    "parse_spec",
    "run_label",
    "strategy_flags",
    "with_strategy_flags",
]

STRATEGIES.update(
    (strategy.name, strategy)
    for strategy in (
        Local(),
        AllReduce(),
        ParameterServer(),
        DiLoCo(),
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


def strategy_flags() -> dict[str, tuple[str, StrategyOption]]:
    """Each registered strategy's flagged options: ``{keyword: (strategy, option)}``."""
    return {option.flag: (name, option) for name, s in STRATEGIES.items() for option in s.options if option.flag}


def with_strategy_flags(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with each strategy option given by its keyword (a flag's) moved into ``strategy_options``; the
    keyword of another strategy's option than the run's is refused naming that strategy, unless it is given at
    that option's default (it asks for nothing).

    >>> with_strategy_flags({"strategy": "ps", "async_batches": "share"})
    {'strategy': 'ps', 'strategy_options': {'async_batches': 'share'}}
    >>> with_strategy_flags({"workers": 2, "ps_admission": "none"})
    {'workers': 2}
    """
    flags = strategy_flags()
    rest = {key: value for key, value in settings.items() if key not in flags}
    given = {key: value for key, value in settings.items() if key in flags and value is not None}
    if not given:
        return rest
    named = rest.get("strategy")
    spec = isinstance(named, str) and "-" in named  # a whole spec, as the bench and a deployment keep it
    chosen = parse_spec(named)[0] if spec else named or default_strategy(rest.get("workers", 1))
    options = dict(rest.get("strategy_options") or {})
    for key, value in given.items():
        owner, option = flags[key]
        if chosen != owner and value == option.default:
            continue
        if chosen != owner:
            raise ConfigError(f"{option.flag_name} is an option of --strategy {owner}; add --strategy {owner}")
        options[option.name] = value
    return {**rest, "strategy_options": options} if options or "strategy_options" in rest else rest


def check_strategy_settings(config: TrainConfig) -> dict[str, Any]:
    """Refuse what ``config``'s strategy cannot run, asking its capabilities and its own check: a wire it does not
    carry, ``--overlap`` where it does not reduce during backward, options it lacks or refuses. Returns its
    option values (defaults filled in)."""
    strategy = get_strategy(config.strategy)
    if strategy.wires is not None and config.wire not in strategy.wires:
        raise ConfigError(
            f"--strategy {strategy.name} sends its gradients as {' or '.join(strategy.wires)} only, not "
            f"--wire {config.wire}; drop --wire"
        )
    if not strategy.carries(config.wire, CODECS[config.wire].all_reduce_only):
        raise ConfigError(
            f"--wire {config.wire} needs all-reduce (its factors add up only there), not --strategy {strategy.name}; "
            "use --strategy allreduce, or --wire topk with a parameter server"
        )
    if config.overlap and not strategy.overlaps:
        raise ConfigError(
            f"--overlap reduces gradients during backward under all-reduce, not --strategy {strategy.name}; "
            + (strategy.overlap_instead or "use --strategy allreduce, or drop --overlap")
        )
    values = strategy.option_values(config.strategy_options)
    strategy.check_options(values, Layout(config.strategy, config.workers, config.server, config.sync), config)
    return values
