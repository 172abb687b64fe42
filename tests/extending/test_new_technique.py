"""A technique of one's own, in one module with one registry line (tests/extending/made_up_technique.py): an
L2 penalty (strength/2)·Σw² in the objective, whose gradient strength·w is what SGD's ``weight_decay``
adds. Its flag comes from its class and shows in ``scaletrain train --help``; one process and two
all-reduce worker processes (which load it through ``SCALETRAIN_PLUGINS``) train with it, stacked
before a standing technique (bf16 with dynamic loss scaling, whose scale must cover the penalty too),
and end where weight decay ends and away from plain training."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import scaletrain
from scaletrain.efficient import TECHNIQUES
from tests.helpers import model_weights, run_cli

REPO = Path(__file__).resolve().parents[2]
PLUGIN = {"SCALETRAIN_PLUGINS": "tests.extending.made_up_technique", "PYTHONPATH": f"{REPO / 'src'}:{REPO}"}
STRENGTH = 0.05
RUN = {"steps": 8, "batch_size": 16, "lr": 0.05, "momentum": 0.9, "seed": 1, "progress": "off", "tensorboard": False}


@pytest.fixture(autouse=True)
def registered() -> Iterator[None]:
    """This process imports the module too (its last line registers the technique), here rather than at
    collection, and the other tests see the registry without it."""
    module = importlib.import_module("tests.extending.made_up_technique")
    TECHNIQUES["l2"] = module.L2Penalty  # again after an earlier test took it out (the module is imported once)
    yield
    del TECHNIQUES["l2"]


def _distances(first: Path, second: Path) -> dict[str, float]:
    one, two = model_weights(first), model_weights(second)
    return {name: (one[name] - two[name]).abs().max().item() for name in one}


def test_its_flag_comes_from_its_class_and_the_command_checks_it(tmp_path: Path) -> None:
    shown = run_cli("train", "--help", env={**PLUGIN, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "--l2-strength L2_STRENGTH" in shown.stdout
    assert "--technique l2: the objective gains strength/2 times every weight squared (-T strength; default: 0.0)" in (
        shown.stdout
    )
    assert "--l2-strength" not in run_cli("train", "--help").stdout
    for flags, message in (
        (["--technique", "l2", "--l2-strength", "-1"], "l2: strength must be > 0, got -1.0"),
        (["--l2-strength", "0.1"], "--l2-strength is an option of --technique l2; add --technique l2"),
    ):
        refused = run_cli("train", "lenet", *flags, "--steps", "1", "--out", str(tmp_path / "r"), env=PLUGIN)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.strip().splitlines() == [f"scaletrain: error: {message}"]


def test_one_process_trains_as_weight_decay_does(tiny_fmnist: Path, tmp_path: Path) -> None:
    settings = {"data_dir": tiny_fmnist, "threads": 1, **RUN}
    penalised = scaletrain.train("lenet", out=tmp_path / "l2", technique="l2", l2_strength=STRENGTH, **settings)
    scaletrain.train("lenet", out=tmp_path / "decayed", weight_decay=STRENGTH, **settings)
    scaletrain.train("lenet", out=tmp_path / "plain", **settings)
    assert penalised["steps"] == 8
    # the same gradient up to float rounding (measured: at most 1.5e-8), while the decay moved every tensor
    # by 2.5e-3 or more (measured) from plain training
    assert max(_distances(tmp_path / "l2", tmp_path / "decayed").values()) < 1e-6
    assert min(_distances(tmp_path / "decayed", tmp_path / "plain").values()) > 1e-3


@pytest.mark.multiprocess
def test_two_workers_load_it_and_stack_it_under_bf16_loss_scaling(
    tiny_fmnist: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in PLUGIN.items():
        monkeypatch.setenv(name, value)
    settings = {"data_dir": tiny_fmnist, "workers": 2, "precision": "bf16", "loss_scale": "dynamic", **RUN}
    settings["timeout"] = 60
    penalised = scaletrain.train("lenet", out=tmp_path / "l2", technique="l2", l2_strength=STRENGTH, **settings)
    scaletrain.train("lenet", out=tmp_path / "decayed", weight_decay=STRENGTH, **settings)
    scaletrain.train("lenet", out=tmp_path / "plain", **settings)
    assert (penalised["strategy"], penalised["workers"], penalised["precision"]) == ("allreduce", 2, "bf16")
    assert [worker["loss_scale"] for worker in penalised["per_worker"]] == [2.0**16, 2.0**16]
    assert len({worker["weights_digest"] for worker in penalised["per_worker"]}) == 1
    # Precision is stacked last, so its scale multiplies the penalty too and its unscaling divides it back:
    # stacked the other way, the penalty's gradient would come out 65536 times too small, as if absent.
    # Measured in one process with bf16: at most 8.3e-6 apart (bf16 rounding), against 2.5e-3 from plain.
    assert max(_distances(tmp_path / "l2", tmp_path / "decayed").values()) < 1e-4
    assert min(_distances(tmp_path / "decayed", tmp_path / "plain").values()) > 1e-3
    saved = torch.load(tmp_path / "l2" / "checkpoint.pt", weights_only=False)
    assert list(saved["technique"]) == ["l2", "precision"]
    assert json.loads((tmp_path / "l2" / "summary.json").read_text())["memory_format"] == "channels_last"
