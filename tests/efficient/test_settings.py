"""How a run asks for a technique comes from the technique's class: the standing techniques' settings are
TrainConfig fields and flags, the config checks every technique's settings without building one, and the
techniques are built and stacked in one order and report themselves in summary.json."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, fields

import pytest

from scaletrain.cli import build_parser
from scaletrain.config import TrainConfig
from scaletrain.efficient import STANDING, TECHNIQUES, all_settings, summary_fields, techniques_for
from scaletrain.errors import ConfigError


def test_each_standing_setting_is_a_config_field_and_every_setting_a_flag_of_train_and_bench() -> None:
    config = {f.name for f in fields(TrainConfig) if f.default is not MISSING}
    standing = [setting.name for kind in STANDING.values() for setting in kind.settings]
    assert set(standing) <= config
    expected = {"precision", "loss_scale", "memory_format", "ghost_batch", "sync_batchnorm", "batch_budget"}
    assert expected <= set(standing)
    commands = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    for command in ("train", "bench"):
        flags = {action.dest: action.option_strings for action in commands.choices[command]._actions}
        for name, (_, setting) in all_settings().items():
            assert flags[name] == [setting.flag], (command, name)


def test_the_config_checks_every_technique_without_building_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def built(self: object) -> None:
        raise AssertionError(f"{type(self).__name__} was built")

    for kind in (*STANDING.values(), *TECHNIQUES.values()):
        monkeypatch.setattr(kind, "__post_init__", built)
    asked = {"precision": "bf16", "loss_scale": "dynamic", "memory_format": "channels_last", "ghost_batch": 4}
    TrainConfig("lenet", technique="prunetrain", technique_options={"ratio": "0.3"}, batch_budget="600MB", **asked)
    for options, message in (
        ({"ratio": "2"}, "prunetrain: the lasso penalty ratio must be between 0 and 1, got 2.0"),
        ({"ratio": "a lot"}, "technique prunetrain: option ratio must be a float, got 'a lot'"),
        ({"size": "2"}, "technique prunetrain has no option 'size'; its options: ratio, threshold, every, step"),
    ):
        with pytest.raises(ConfigError, match=message):
            TrainConfig("lenet", technique="prunetrain", technique_options=options)


def test_they_are_stacked_in_one_order_and_report_themselves() -> None:
    settings = vars(
        TrainConfig(
            "lenet", technique="prunetrain", precision="bf16", memory_format="auto", ghost_batch=4, batch_budget="600MB"
        )
    )
    stack, layout = techniques_for(settings, "cpu")
    # precision last (its loss scale covers every objective); what keeps no state apart, entered first
    assert [member.name for member in stack.members] == ["prunetrain", "adapt-batch", "precision"]
    assert [member.name for member in layout.members] == ["channels_last", "ghost_batch"]
    assert summary_fields(settings, "cpu", stack, layout) == {
        "memory_format": "channels_last",
        "ghost_batch": 4,
        "sync_batchnorm": False,
        "batch_budget": "600MB",
        "batch_searches": [],
        "precision": "bf16",
    }
    plain = vars(TrainConfig("lenet"))
    assert techniques_for(plain, "cuda") == (None, None)
    assert summary_fields(plain, "cuda") == {
        "memory_format": "contiguous",
        "ghost_batch": None,
        "sync_batchnorm": False,
        "batch_budget": None,
        "batch_searches": None,
        "precision": "fp32",
    }
