"""The flags that the registries' plug-ins declare for themselves, on ``train``, ``bench`` and ``deploy``: each
strategy's options (``-S``, and a flag where an option names one) and each technique's settings (``--technique``,
``-T`` and the techniques' own flags), read back into the settings :func:`scaletrain.train` takes."""

from __future__ import annotations

import argparse
from typing import Any

from scaletrain.efficient import TECHNIQUES, Setting, all_settings, with_flagged_options
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies import STRATEGIES, strategy_flags

__all__ = [
    "add_strategy_flags",
    "add_technique_flags",
    "given_strategy_options",
    "parse_options",
    "strategy_settings",
    "technique_settings",
]


def add_strategy_flags(group: argparse._ArgumentGroup, *, skip: tuple[str, ...] = ()) -> None:
    """``-S KEY=VALUE`` and the flags of every registered strategy's options that name one, from the strategies'
    own declarations (:class:`~scaletrain.parallel.strategies.StrategyOption`); ``skip``: keywords of flags the
    command has its own way of taking."""
    offered = [f"{name}: {', '.join(o.name for o in s.options)}" for name, s in STRATEGIES.items() if s.options]
    group.add_argument(
        "-S",
        "--strategy-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the --strategy chosen" + (f" ({'; '.join(offered)})" if offered else ""),
    )
    for keyword, (owner, option) in strategy_flags().items():
        if keyword in skip:
            continue
        described = {
            "type": None if option.type is bool else option.type,
            "choices": option.choices,
            "metavar": option.metavar,
        }
        default = "" if option.default is None else f"; default: {option.default}"
        group.add_argument(
            option.flag_name,
            dest=keyword,
            help=f"--strategy {owner}: {option.help} (-S {option.name}{default})",
            **{key: value for key, value in described.items() if value is not None},
        )


def strategy_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``strategy_options`` from ``-S`` and the strategies' own flags by their keywords (make_config moves them in)."""
    options = parse_options(args.strategy_option, what="strategy option", example="-S chunks=2")
    flagged = {keyword: getattr(args, keyword) for keyword in strategy_flags() if hasattr(args, keyword)}
    return {"strategy_options": options or None, **flagged}


def given_strategy_options(args: argparse.Namespace) -> dict[str, Any]:
    """The strategy options given by ``-S`` and by the strategies' own flags, by the options' names."""
    options = parse_options(args.strategy_option, what="strategy option", example="-S sync_every=16")
    for keyword, (_, option) in strategy_flags().items():
        if getattr(args, keyword, None) is not None:
            options[option.name] = getattr(args, keyword)
    return options


def add_technique_flags(parser: argparse.ArgumentParser) -> None:
    """``--technique NAME``, ``-T KEY=VALUE`` and every technique's own flags, as its class declares them
    (:func:`scaletrain.efficient.all_settings`): the standing techniques' (``--precision``,
    ``--memory-format``, ``--ghost-batch``, ``--batch-budget`` …), then each ``--technique`` choice's."""
    group = parser.add_argument_group("techniques (scaletrain.efficient)")
    group.add_argument("--technique", choices=sorted(TECHNIQUES), help="a technique to apply while training")
    declared = [setting for _, setting in all_settings().values()]
    for setting in declared:
        if setting.option is None:
            _add_flag(group, setting)
    group.add_argument(
        "-T",
        "--technique-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="technique option, e.g. -T layer=classifier.1 -T fraction=0.5 for narrow",
    )
    for setting in declared:
        if setting.option is not None:
            _add_flag(group, setting)


def _add_flag(group: argparse._ArgumentGroup, setting: Setting) -> None:
    if setting.type is bool:  # a switch (None when absent: a config file may set it)
        group.add_argument(setting.flag, dest=setting.name, help=setting.help, action="store_true", default=None)
        return
    described = {"type": setting.type, "choices": setting.choices, "metavar": setting.metavar}
    group.add_argument(
        setting.flag,
        dest=setting.name,
        help=setting.help,
        **{key: value for key, value in described.items() if value is not None},
    )


def technique_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``technique``, ``technique_options`` and every technique's own settings from the flags, a ``--technique``
    choice's flags moved into its options."""
    options = parse_options(args.technique_option, what="technique option", example="-T fraction=0.5")
    given = {name: getattr(args, name) for name in all_settings()}
    return with_flagged_options({"technique": args.technique, "technique_options": options or None, **given})


def parse_options(
    pairs: list[str], *, what: str = "workload option", example: str = "-o num_steps=35"
) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {pair!r} must look like KEY=VALUE, e.g. {example}")
        options[key.strip()] = value.strip()
    return options
