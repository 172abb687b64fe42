"""The parameter server's own options, declared once: each is ``-S name=value``, its flag on ``train`` and
``bench`` (``--ps-admission``, ``--async-compensation``, ``--async-batches``, ``--max-staleness``), a config
file's key by that flag's name and a keyword of :func:`scaletrain.train`; and what it refuses of them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.base import Layout, StrategyOption, read_options
from scaletrain.parallel.strategies.ps.staleness import COMPENSATIONS

__all__ = ["ASYNC_BATCHES", "OPTIONS", "check_options", "ps_options"]

#: The values of ``--async-batches``.
ASYNC_BATCHES = ("split", "share")

OPTIONS = (
    StrategyOption(
        "admission",
        "exclusive: one transfer at a time per direction (Šlampa 2017 §7.2); none: all at once",
        "none",
        choices=("none", "exclusive"),
        flag="ps_admission",
    ),
    StrategyOption(
        "compensation",
        "async only. momentum: lower the explicit momentum by the measured staleness so that with asynchrony's "
        "own momentum it stays --momentum; lr: lr / staleness per gradient; delay: DC-ASGD's correction "
        "g + λ g⊙g⊙(w_now − w_stale); none",
        "momentum",
        choices=COMPENSATIONS,
        flag="async_compensation",
    ),
    StrategyOption(
        "async_batches",
        "async only. split: each update a batch of --batch-size / N at the rate times its share, so N workers' "
        "updates move the weights as one step of --batch-size (N times the exchanges per sample); share: each "
        "update a whole --batch-size at the full rate (Downpour)",
        "split",
        choices=ASYNC_BATCHES,
        flag="async_batches",
    ),
    StrategyOption(
        "max_staleness",
        "async only: a worker waits before its next step while it is more than S pushes ahead of the slowest "
        "worker still training (stale synchronous parallel; 0: all wait for all each step; unset: unbounded); "
        "the wait is in summary.json (staleness_wait)",
        None,
        type=int,
        flag="max_staleness",
        metavar="S",
    ),
)

#: What each asynchronous option does, for the line that refuses it on synchronous updates.
_ASYNC_ONLY = {
    "compensation": "compensates asynchronous updates' staleness",
    "async_batches": "says how asynchronous workers divide --batch-size",
    "max_staleness": "bounds how far an asynchronous worker runs ahead of the slowest",
}


def ps_options(config: TrainConfig) -> dict[str, Any]:
    """The parameter server's option values of ``config`` (defaults for those not given).

    >>> ps_options(TrainConfig("x", workers=2, strategy="ps", strategy_options={"max_staleness": 2}))["max_staleness"]
    2
    """
    return read_options("ps", OPTIONS, config.strategy_options)


def check_options(values: Mapping[str, Any], layout: Layout, config: TrainConfig) -> None:
    """Refuse the options a run of ``layout`` would not read (an asynchronous option on synchronous updates; one
    given at its default asks for nothing) and the combinations not built yet."""
    declared = {option.name: option for option in OPTIONS}
    for name, what in _ASYNC_ONLY.items():
        if layout.sync != "async" and values[name] != declared[name].default:
            raise ConfigError(
                f"{declared[name].flag_name} {values[name]} {what}, and this run's updates are synchronous "
                f"(--sync {layout.sync}); add --sync async, or drop it"
            )
    bound = values["max_staleness"]
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int) or bound < 0):
        raise ConfigError(
            f"--max-staleness must be a whole number ≥ 0 (0: every worker waits for all the others each step), "
            f"got {bound!r}"
        )
    if bound is not None and (config.technique is not None or config.batch_budget is not None):
        # uneven shares of an epoch leave the clocks apart by up to one push per epoch at its end, where a
        # reconfiguration gathers every worker: a held worker could wait for one that waits for it
        raise ConfigError(
            "--max-staleness does not work with --technique or --batch-budget yet (their reconfigurations "
            "gather every worker at an epoch's end, where the bound could hold one of them); drop one of them"
        )
    if config.min_workers is not None and layout.server == "sharded" and values["admission"] == "exclusive":
        raise ConfigError(
            "--min-workers does not work with --ps-admission exclusive with --server sharded yet; drop one of them"
        )
