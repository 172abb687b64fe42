"""``--version`` and every subcommand's ``--help``: defaults shown once, plain words, metavars that fit."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, fields

import pytest
from tests.helpers import REPO, run_cli

from scaletrain.cli import build_parser, package_version
from scaletrain.config import TrainConfig

SUBPARSERS = next(
    action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
).choices
#: Markup and references that mean something only inside this repository's documents.
NOT_FOR_USERS = {
    "reST literal": re.compile(r"``"),
    "reST role": re.compile(r":(class|func|mod|meth|attr):"),
    "section of an internal document": re.compile(r"\b\d{3} §"),
    "the SPEC": re.compile(r"\bSPEC\b"),
}


def test_version_names_the_package_version():
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"scaletrain {package_version()}"
    version = re.search(r'^version = "(.+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
    assert package_version().split()[0] == version


@pytest.mark.parametrize("name", sorted(SUBPARSERS))
def test_help_is_plain_words(name):
    text = SUBPARSERS[name].format_help()
    for what, pattern in NOT_FOR_USERS.items():
        assert not pattern.search(text), f"{name} --help shows {what}: {pattern.search(text).group(0)!r}"


@pytest.mark.parametrize("name", sorted(SUBPARSERS))
def test_every_flag_has_help_and_a_metavar_that_fits(name):
    for action in SUBPARSERS[name]._actions:
        if not action.option_strings:
            continue
        flag = action.option_strings[-1]
        assert action.help, f"{name} {flag} has no help"
        if action.nargs != 0 and action.metavar is None and action.choices is None:
            # argparse derives the metavar from the destination; it must read as the flag's own name.
            assert action.dest == flag.lstrip("-").replace("-", "_"), f"{name} {flag} shows {action.dest.upper()}"


@pytest.mark.parametrize("name", sorted(SUBPARSERS))
def test_defaults_are_shown_once(name):
    parser = SUBPARSERS[name]
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        shown = formatter._expand_help(action) if hasattr(formatter, "_expand_help") else action.help
        assert shown.lower().count("default") <= 1, f"{name} {action.option_strings[-1]}: {shown}"
        worth_saying = action.default not in (None, False, True, [], argparse.SUPPRESS)
        if worth_saying:
            assert "default" in shown.lower(), f"{name} {action.option_strings[-1]} hides its default"


def test_train_help_names_the_config_defaults():
    """train's flags default to None (a config file may set them), so the defaults come from TrainConfig."""
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default not in (MISSING, None)}
    checked = 0
    for action in SUBPARSERS["train"]._actions:
        value = defaults.get(action.dest)
        if not action.option_strings or value is None or isinstance(value, bool):
            continue
        shown = f"{value:g}" if isinstance(value, float) else str(value)
        assert "default" in action.help and shown in action.help, f"{action.option_strings[-1]}: {action.help}"
        checked += 1
    assert checked >= 10
    lr = next(action for action in SUBPARSERS["train"]._actions if action.dest == "lr")
    assert lr.help == "learning rate (default: the workload's)"
