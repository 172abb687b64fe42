"""``--num-classes`` and ``--image-size``: shared by train and bench, checked against the workload's options."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.helpers import run_cli

from scaletrain.cli import build_parser, main
from scaletrain.cli.train import workload_options
from scaletrain.errors import ConfigError


def test_flags_become_workload_options_and_win_over_dash_o() -> None:
    for command in ("train", "bench"):
        args = build_parser().parse_args(
            [command, "resnet34", "--image-size", "64", "-o", "image_size=96", "-o", "data=synthetic"]
        )
        assert workload_options(args) == {"image_size": "64", "data": "synthetic"}
    args = build_parser().parse_args(["train", "lenet", "-o", "x=1"])
    assert workload_options(args) == {"x": "1"}  # no flag given: nothing added, nothing checked


def test_a_flag_the_workload_has_no_option_for_is_an_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = build_parser().parse_args(["train", "ptb-lstm", "--num-classes", "10"])
    with pytest.raises(ConfigError, match="--num-classes: workload ptb-lstm has no option num_classes; it applies "):
        workload_options(args)
    assert main(["train", "lenet", "--image-size", "32", "--out", str(tmp_path / "run")]) == 2
    error = capsys.readouterr().err
    assert "--image-size: workload lenet has no option image_size" in error
    assert "vgg16e, googlenet, squeezenet, resnet34" in error


def test_too_small_an_image_exits_2_naming_the_fix(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["train", "squeezenet", "--image-size", "16", "--out", str(tmp_path / "run")]) == 2
    assert "--image-size 32 or more" in capsys.readouterr().err


def test_missing_caltech256_exits_2_with_where_to_get_it(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["train", "resnet34", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "run")])
    assert code == 2
    error = capsys.readouterr().err
    assert "https://data.caltech.edu/records/nyy15-4j048" in error and "-o data=synthetic" in error


def test_train_a_cnn_on_synthetic_images_from_the_command_line(tmp_path: Path) -> None:
    result = run_cli(
        *("train", "squeezenet", "--num-classes", "5", "--image-size", "32", "-o", "data=synthetic"),
        *("-o", "synthetic_train=8", "-o", "synthetic_test=4", "--batch-size", "4", "--steps", "2"),
        *("--threads", "1", "--no-tensorboard", "--out", str(tmp_path / "run")),
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert (summary["options"]["num_classes"], summary["options"]["image_size"], summary["steps"]) == (5, 32, 2)
    assert "accuracy is meaningless" in summary["dataset"]
    assert "squeezenet: test_accuracy" in result.stdout
