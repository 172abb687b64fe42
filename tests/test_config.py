import re
import subprocess
import sys
from pathlib import Path

import pytest

from scaletrain.api import make_config
from scaletrain.api import train as scaletrain_train
from scaletrain.config import TrainConfig, load_toml, merge
from scaletrain.errors import ConfigError
from scaletrain.train.defaults import resolve
from scaletrain.workloads.base import WorkloadDefaults


def test_precedence_defaults_then_file_then_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text("batch-size = 64\nlr = 0.5\nepochs = 3\n[options]\nnum_steps = 35\ndropout = 0.1\n")
    config = make_config("ptb-lstm", config_file=config_file, lr=0.1, options={"dropout": "0.2"})
    assert config.batch_size == 64  # from the file
    assert config.lr == 0.1  # flag beats file
    assert config.options == {"num_steps": 35, "dropout": "0.2"}  # option tables merge key by key
    resolved = resolve(config, WorkloadDefaults(epochs=9, batch_size=1, lr=9.0, momentum=0.5, clip_norm=5.0))
    assert (resolved.epochs, resolved.momentum, resolved.clip_norm) == (3, 0.5, 5.0)  # defaults fill gaps


def test_unset_flags_do_not_override_the_file(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text("seed = 7\n")
    assert make_config("lenet", config_file=config_file, seed=None).seed == 7


def test_unknown_key_names_the_known_ones(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text("batchsize = 64\n")
    with pytest.raises(ConfigError, match="unknown key 'batchsize'.*batch_size"):
        load_toml(config_file)


def test_broken_toml_and_missing_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.toml"
    broken.write_text("lr = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_toml(broken)
    with pytest.raises(ConfigError, match="does not exist"):
        load_toml(tmp_path / "absent.toml")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch_size", 0, "batch_size must be a whole number"),
        ("epochs", -1, "epochs must be"),
        ("lr", 0.0, "lr must be > 0"),
        ("momentum", 1.0, "momentum must be in"),
        ("clip_norm", -1.0, "clip_norm must be"),
        ("progress", "fancy", "progress must be one of"),
    ],
)
def test_invalid_values_are_rejected(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TrainConfig(workload="lenet", **{field: value})


def test_merge_later_layers_win() -> None:
    assert merge({"a": 1, "options": {"x": 1}}, {"a": 2, "options": {"y": 2}}) == {
        "a": 2,
        "options": {"x": 1, "y": 2},
    }


def test_out_defaults_to_a_fresh_folder_per_run() -> None:
    resolved = resolve(TrainConfig(workload="lenet"), WorkloadDefaults(epochs=1, batch_size=8, lr=0.1))
    assert resolved.out.parent == Path("runs") and resolved.out.name.startswith("lenet-")


@pytest.mark.parametrize(
    ("given", "expected"),
    [(None, 1e4), ("off", "off"), ("Off", "off"), ("1e3", 1000.0), (50, 50.0), (2.5, 2.5)],
)
def test_divergence_is_a_factor_or_off(given: object, expected: object) -> None:
    config = make_config("lenet", divergence=given)  # None: not given
    assert config.divergence == expected and type(config.divergence) is type(expected)


@pytest.mark.parametrize("value", [1, 0.5, -3, "never", "nan", "inf", True])
def test_divergence_refuses_what_is_no_factor_above_one(value: object) -> None:
    with pytest.raises(ConfigError, match=r"divergence must be a factor > 1 \(e.g. 1e4: .*\) or off, got"):
        make_config("lenet", divergence=value)


def test_divergence_in_a_config_file(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text('divergence = "off"\n')
    assert make_config("lenet", config_file=config_file).divergence == "off"
    assert make_config("lenet", config_file=config_file, divergence="100").divergence == 100.0


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"technique_options": {"fraction": "0.5"}}, r"technique options \(-T fraction=0.5\) need the technique"),
        ({"technique": "prunetrain", "technique_options": {"fraction": "0.5"}}, "prunetrain has no option 'fraction'"),
        ({"workers": 2, "server": "sharded"}, "--server sharded is a parameter server's setting, and allreduce has"),
        ({"server": "sharded"}, "--server sharded is a parameter server's setting, and local has no servers"),
        (
            {"workers": 2, "strategy": "allreduce-split", "ps_admission": "exclusive"},
            "--ps-admission is an option of --strategy ps",
        ),
        ({"workers": 2, "strategy": "ps", "async_compensation": "lr"}, r"synchronous \(--sync join\); add"),
        ({"workers": 2, "strategy": "ps-central-split", "async_compensation": "none"}, r"\(--sync split\)"),
        ({"workers": 2, "strategy": "ps-sharded-join", "async_compensation": "delay"}, r"delay compensates .*join"),
        ({"lr_decay_start": 3}, "add --lr-decay FACTOR"),
    ],
)
def test_a_setting_the_run_would_not_read_is_refused(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config("lenet", **settings)


@pytest.mark.parametrize(
    "settings",
    [
        {"workers": 2, "strategy": "ps", "server": "sharded", "ps_admission": "exclusive"},
        {"workers": 2, "strategy": "ps-central-async", "async_compensation": "lr"},
        {"workers": 2, "strategy": "ps-sharded-async", "async_compensation": "delay"},
        {"workers": 2, "strategy": "ps", "sync": "none", "async_compensation": "none"},  # none: async's alias
        {"lr_decay": 0.5, "lr_decay_start": 3},
        {"workers": 2, "strategy": "allreduce", "server": "central", "ps_admission": "none"},  # defaults: no ask
        {"workers": 2, "sync": "split", "async_compensation": "momentum"},
    ],
)
def test_the_same_settings_where_the_run_reads_them(settings: dict) -> None:
    make_config("lenet", **settings)


def test_a_sweep_gives_each_run_only_what_it_reads() -> None:
    from scaletrain.measure.sweep import SweepConfig, plan_runs, run_settings

    settings = {"async_compensation": "lr", "ps_admission": "exclusive", "lr": 0.02}
    sweep = SweepConfig(
        "lenet", Path("out"), strategies=("allreduce-join", "ps-central-join", "ps-central-async"), workers=(2,),
        batch_sizes=(64,), settings=settings,
    )  # fmt: skip
    runs = {run.label: run_settings(sweep, run) for run in plan_runs(sweep)[0]}
    for given in runs.values():
        make_config("lenet", **given)  # none is refused
    join, asynchronous = runs["ps-central-join"], runs["ps-central-async"]
    assert "ps_admission" not in runs["allreduce-join"] and join["ps_admission"] == "exclusive"
    assert "async_compensation" not in join and asynchronous["async_compensation"] == "lr"


def test_the_config_files_workload_is_taken_when_none_is_named_and_a_named_one_wins(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text('workload = "lenet"\nbatch-size = 64\n')
    assert make_config(None, config_file=config_file).workload == "lenet"
    assert make_config("resnet", config_file=config_file).workload == "resnet", "the command line wins over the file"
    empty = tmp_path / "empty.toml"
    empty.write_text("epochs = 1\n")
    with pytest.raises(ConfigError, match="no workload to train: name one .* or give a 'workload' key in"):
        make_config(None, config_file=empty)
    with pytest.raises(ConfigError, match="no workload to train"):
        make_config(None)


PS_ASYNC = {"workers": 2, "strategy": "ps-central-async"}
PS_OPTIONS = {"admission": "exclusive", "compensation": "lr", "async_batches": "share", "max_staleness": 2}


def test_the_parameter_servers_options_are_its_own_by_every_spelling(tmp_path: Path) -> None:
    """Keywords (the API's, the flags'), ``-S`` pairs, a config file's keys and its [strategy_options] table all end
    in the strategy's ``strategy_options``; TrainConfig has no field of them."""
    from scaletrain.cli import build_parser
    from scaletrain.cli.registry_flags import strategy_settings

    assert not {"ps_admission", "async_batches", "max_staleness"} & {f for f in TrainConfig.__dataclass_fields__}
    keywords = {"ps_admission": "exclusive", "async_compensation": "lr", "async_batches": "share", "max_staleness": 2}
    by_keyword = make_config("lenet", **PS_ASYNC, **keywords)
    by_option = make_config("lenet", **PS_ASYNC, strategy_options=PS_OPTIONS)
    config_file = tmp_path / "run.toml"
    keys = ('ps-admission = "exclusive"', 'async_compensation = "lr"', 'async-batches = "share"', "max-staleness = 2")
    config_file.write_text("\n".join(keys))
    by_file = make_config("lenet", config_file=config_file, **PS_ASYNC)
    table = tmp_path / "table.toml"
    table.write_text("[strategy_options]\n" + "\n".join(f"{key} = {value!r}" for key, value in PS_OPTIONS.items()))
    by_table = make_config("lenet", config_file=table, **PS_ASYNC)
    flags = ["train", "lenet", "--ps-admission", "exclusive", "--async-compensation", "lr", "-S", "async_batches=share"]
    args = build_parser().parse_args([*flags, "--max-staleness", "2"])
    by_flags = make_config("lenet", **PS_ASYNC, **strategy_settings(args))
    for config in (by_keyword, by_option, by_file, by_table, by_flags):
        assert config.strategy_options == PS_OPTIONS


def test_train_help_offers_the_parameter_servers_options_from_its_declaration(capsys: pytest.CaptureFixture) -> None:
    from scaletrain.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for flag in ("--ps-admission {none,exclusive}", "--async-batches {split,share}", "--max-staleness S"):
        assert flag in shown
    assert "--strategy ps: async only: a worker waits" in shown and "(-S max_staleness)" in shown


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({**PS_ASYNC, "max_staleness": -1}, "--max-staleness must be a whole number ≥ 0"),
        ({**PS_ASYNC, "strategy_options": {"max_staleness": "two"}}, "option max_staleness must be a whole number"),
        ({**PS_ASYNC, "max_staleness": 1, "technique": "prunetrain"}, "--max-staleness does not work with --technique"),
        ({"workers": 2, "strategy": "ps-central-join", "max_staleness": 1}, r"synchronous \(--sync join\)"),
        ({"workers": 2, "strategy": "ps", "strategy_options": {"admision": "none"}}, "ps has no option admision"),
        ({"workers": 2, "max_staleness": 1}, "--max-staleness is an option of --strategy ps; add --strategy ps"),
    ],
)
def test_the_parameter_server_judges_its_own_options(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_config("lenet", **settings)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--optimizer", "lion"], "unknown optimizer 'lion'; give a torch.optim class"),
        (["--optimizer", "adamw", "--momentum", "0.9"], "--momentum is not a setting of AdamW; its first-moment rate"),
        (["--optimizer", "adamw", "-O", "lr=0.1"], "-O lr=… is --lr; give it as --lr"),
        (["--optimizer", "adamw", "-O", "betas=1.5,0.9"], "--optimizer adamw refuses its settings .*beta"),
        (["--optimizer", "adamw", "-O", "weight_decay=0.1", "--weight-decay", "0.2"], "say the same; give one"),
        (["--optimizer", "no_such_module:Thing"], "--optimizer no_such_module:Thing: cannot import it"),
        (["--lr-schedule", "cosine", "--lr-decay", "0.5"], "--lr-decay decays the rate per epoch"),
        (["--lr-warmup", "-1"], "lr_warmup must be a whole number of updates"),
        (["--accumulate", "0"], "accumulate must be a whole number ≥ 1"),
        (["--accumulate", "2", "--overlap", "--workers", "2"], "--overlap reduces gradients during each backward"),
    ],
)
def test_optimizer_and_schedule_refusals_are_one_line_exit_2_and_write_nothing(
    flags: list[str], message: str, tmp_path: Path
) -> None:
    from tests.helpers import run_cli

    done = run_cli("train", "lenet", "--out", str(tmp_path / "run"), "--steps", "1", *flags, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), lines
    assert not (tmp_path / "run").exists()


def test_the_launcher_checks_an_optimizer_without_loading_the_compiler_and_leaves_torch_as_it_was() -> None:
    """Building the check's stand-in loaded torch._dynamo (1.0-1.3 s of every ``scaletrain train``'s launcher)."""
    program = """
import sys
import torch
from scaletrain.tensors.optimizers import build_optimizer, check_optimizer
from scaletrain.errors import ConfigError
check_optimizer("adamw", {"betas": "0.9,0.95"}, momentum=None, weight_decay=0.01, lr=1e-3)
try:
    check_optimizer("adamw", {"betas": "1.5,0.9"}, momentum=None, weight_decay=0.0, lr=1e-3)
except ConfigError as refused:
    print("refused:", refused)
loaded = "torch._dynamo" in sys.modules
plain = torch.optim.Optimizer.add_param_group.__wrapped__
left = hasattr(plain, "__dynamo_disable")
build_optimizer("adamw", {}, [torch.zeros(2, requires_grad=True)], lr=1e-3, momentum=None, weight_decay=0.0)
print(loaded, left, "torch._dynamo" in sys.modules, getattr(plain, "__dynamo_disable") is not plain)
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    refused, flags = done.stdout.strip().splitlines()
    assert refused.startswith("refused: --optimizer adamw refuses its settings") and "beta" in refused
    # not loaded by the checks, nothing left behind; a real optimizer loads it and gets torch's own wrapper
    assert flags == "False False True True"


def test_accumulating_a_stateful_workload_is_refused_before_any_process(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="ptb-lstm carries a state from batch to batch"):
        scaletrain_train("ptb-lstm", accumulate=2, out=tmp_path / "run", data_dir=tmp_path)
    assert not (tmp_path / "run").exists()
