"""The command line in real subprocesses: listing, a run, exit code 2 on bad input, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, make_fashion_mnist, mounted_tmpfs, run_cli


def test_workloads_lists_parameter_counts() -> None:
    result = run_cli("workloads", "--json")
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["lenet"]["parameters"] == 431_080 and "Fashion-MNIST" in rows["lenet"]["dataset"]
    assert rows["ptb-lstm"]["parameters"] == 4_653_200 and "Penn Treebank" in rows["ptb-lstm"]["dataset"]
    # The image networks are listed with their defaults: 257 classes (74,461,224 at 1000 less 743 outputs).
    assert rows["vgg16e"]["parameters"] == 74_461_224 - 743 * (4096 + 1) and "Caltech256" in rows["vgg16e"]["dataset"]
    assert {"googlenet", "squeezenet", "resnet34"} <= rows.keys()


def test_train_with_a_config_file_and_overriding_flag(tiny_fmnist: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("batch-size = 32\nepochs = 1\nlr = 0.05\nthreads = 1\n")
    result = run_cli(
        "train",
        "lenet",
        "--config",
        str(config),
        "--batch-size",
        "16",
        "--data-dir",
        str(tiny_fmnist),
        "--out",
        str(tmp_path / "run"),
        "--no-tensorboard",
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert (summary["batch_size"], summary["lr"], summary["steps"]) == (16, 0.05, 256 // 16)
    assert "test_accuracy" in result.stdout
    assert "epoch 1 step" in result.stderr  # plain progress lines when not on a terminal


def corrupt(folder: Path, how: str) -> None:
    images = folder / "train-images-idx3-ubyte.gz"
    if how == "missing":
        images.unlink()
    elif how == "truncated":
        images.write_bytes(images.read_bytes()[: len(images.read_bytes()) // 2])
    elif how == "magic":
        import gzip

        raw = bytearray(gzip.decompress(images.read_bytes()))
        raw[0:4] = b"\x12\x34\x08\x03"
        images.write_bytes(gzip.compress(bytes(raw)))
    elif how == "count":
        make_fashion_mnist(folder / "other", train=100)
        os.replace(folder / "other/train-labels-idx1-ubyte.gz", folder / "train-labels-idx1-ubyte.gz")


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing", "apt-get install dataset-fashion-mnist"),
        ("truncated", "train-images-idx3-ubyte"),
        ("magic", "magic"),
        ("count", "256.*100|100.*256"),
    ],
)
def test_bad_fashion_mnist_exits_2_with_a_message(how: str, message: str, tmp_path: Path) -> None:
    folder = make_fashion_mnist(tmp_path / "data")
    corrupt(folder, how)
    result = run_cli("train", "lenet", "--data-dir", str(folder), "--out", str(tmp_path / "run"), "--steps", "1")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("scaletrain: error:")
    assert "Traceback" not in result.stderr
    import re

    assert re.search(message, result.stderr, re.IGNORECASE), result.stderr


def test_empty_ptb_text_exits_2(tiny_ptb: Path, tmp_path: Path) -> None:
    (tiny_ptb / "ptb.test.txt").write_text("\n\n")
    result = run_cli("train", "ptb-lstm", "--data-dir", str(tiny_ptb), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "ptb.test.txt" in result.stderr and "Traceback" not in result.stderr


def test_missing_ptb_train_file_says_how_to_go_on(tiny_ptb: Path, tmp_path: Path) -> None:
    (tiny_ptb / "ptb.train.txt").unlink()
    result = run_cli("train", "ptb-lstm", "--data-dir", str(tiny_ptb), "--out", str(tmp_path / "run"))
    assert result.returncode == 2 and "train_split=valid" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--batch-size", "0"], "batch_size must be"),
        (["-o", "num_steps=5"], "unknown workload option 'num_steps'"),
        (["-o", "nonsense"], "KEY=VALUE"),
        (["--config", "/nonexistent.toml"], "does not exist"),
        (["--resume"], "no checkpoint"),
        (["--lr", "inf"], "lr must be a finite number"),
        (["--lr", "nan"], "lr must be a finite number"),
        (["--lr", "1e300"], "lr must be a finite number (at most 3.4e+38)"),
        (["--timeout", "inf"], "timeout must be a finite number"),
        (["--workers", "4", "--strategy", "ps", "--sync", "split", "--batch-size", "2"], "use --batch-size 4"),
        (["--workers", "2", "--sync", "split", "--batch-size", "7"], "--batch-size 6 or 6"),
        (["--network", "10mbit"], "this run has one process"),
        (["-T", "fraction=0.5"], "technique options (-T fraction=0.5) need the technique they are for"),
    ],
)
def test_impossible_settings_exit_2(args: list[str], message: str, tiny_fmnist: Path, tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--data-dir", str(tiny_fmnist), "--out", str(tmp_path / "run"), *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.fixture
def read_only_folder(tmp_path: Path):
    """A read-only tmpfs: unwritable even for root."""
    with mounted_tmpfs(tmp_path / "ro", "ro,size=1m") as folder:
        yield folder


@pytest.mark.parametrize("where", ["proc", "under-a-file", "read-only"])
@pytest.mark.parametrize("workers", ["1", "2"])
def test_an_unwritable_out_is_one_line(where: str, workers: str, tiny_fmnist: Path, tmp_path: Path, request) -> None:
    if where == "proc":
        out = Path("/proc/scaletrain-run")
    elif where == "under-a-file":
        (tmp_path / "a-file").write_text("")
        out = tmp_path / "a-file" / "run"
    else:
        out = request.getfixturevalue("read_only_folder") / "run"
    result = run_cli("train", "lenet", "--data-dir", str(tiny_fmnist), "--out", str(out), "--workers", workers)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot write the run folder {out}" in result.stderr and "choose another --out" in result.stderr


def test_killed_run_resumes_to_the_same_weights(tmp_path: Path) -> None:
    data = make_fashion_mnist(tmp_path / "data", train=2048)
    common = [
        "--data-dir",
        str(data),
        "--batch-size",
        "8",
        "--epochs",
        "3",
        "--threads",
        "1",
        "--no-tensorboard",
    ]
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    out = tmp_path / "killed"
    victim = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scaletrain",
            "train",
            "lenet",
            *common,
            "--out",
            str(out),
            "--checkpoint-every",
            "20",
        ],
        env=environment,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline and victim.poll() is None:
        time.sleep(0.02)
    time.sleep(0.3)  # let it train past the checkpoint, so the kill loses steps
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    assert victim.returncode == -signal.SIGKILL and not (out / "summary.json").exists()

    resumed = run_cli("train", "lenet", *common, "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed_from_step"] > 0 and summary["steps"] == 3 * 256
    straight = run_cli("train", "lenet", *common, "--out", str(tmp_path / "straight"))
    assert straight.returncode == 0, straight.stderr
    first = torch.load(out / "model.pt", weights_only=True)
    second = torch.load(tmp_path / "straight/model.pt", weights_only=True)
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "lenet", "--workers", "abc"], "invalid int value: 'abc'; see 'scaletrain train --help'"),
        (["nonsense"], "invalid choice: 'nonsense'"),
        (["estimate", "--output", "pdf"], "invalid choice: 'pdf'"),
        ([], "required: COMMAND"),
    ],
)
def test_flags_argparse_refuses_are_one_line(args: list[str], message: str) -> None:
    result = run_cli(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    assert "usage:" not in result.stderr


def test_train_takes_the_workload_from_the_config_file_and_refuses_none_in_one_line(tmp_path: Path) -> None:
    config_file = tmp_path / "run.toml"
    config_file.write_text('workload = "lenet"\nsteps = 2\nprogress = "off"\ntensorboard = false\n')
    data = make_fashion_mnist(tmp_path / "fmnist", train=32, test=16)
    done = run_cli("train", "--config", str(config_file), "--data-dir", str(data), "--out", str(tmp_path / "run"))
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["workload"] == "lenet"
    refused = run_cli("train", "--steps", "1", "--out", str(tmp_path / "none"))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "no workload to train" in refused.stderr and not (tmp_path / "none").exists()


def test_a_run_refused_before_training_leaves_its_out_folder_as_it_found_it(tmp_path: Path) -> None:
    empty = tmp_path / "no-ptb"
    empty.mkdir()
    refused = run_cli("train", "ptb-lstm", "--data-dir", str(empty), "--steps", "1", "--out", str(tmp_path / "run"))
    assert refused.returncode == 2 and "ptb.valid.txt" in refused.stderr
    assert not (tmp_path / "run").exists(), "no processes/rank-0.json left behind"
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "mine.txt").write_text("the user's\n")
    refused = run_cli("train", "ptb-lstm", "--data-dir", str(empty), "--steps", "1", "--out", str(tmp_path / "kept"))
    assert refused.returncode == 2
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["mine.txt"], "a folder it did not make stays"
