"""The divergence bound on several processes (scaletrain.train.divergence): a finite loss past it stops every
process with the advice line and exit code 2, under all-reduce and the asynchronous parameter server, and
leaves no summary. (That a central server keeps the workers' reference in its checkpoint is checked on the
real asynchronous run, tests/parallel/test_real_lenet.py.)"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from tests.helpers import make_fashion_mnist

from scaletrain.cli import main

pytestmark = pytest.mark.multiprocess


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_fashion_mnist(tmp_path / "data", train=256, test=16)


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "lenet", "--data-dir", str(data), "--out", str(out), "--batch-size", "8", "--threads", "1",
        "--no-tensorboard", "--progress", "off", *extra,
    ]  # fmt: skip


def running(pid: int) -> bool:
    status = Path(f"/proc/{pid}/status")
    try:
        return "zombie" not in status.read_text()
    except OSError:
        return False


def assert_no_survivors(out: Path) -> None:
    """Every process the run recorded (OUT/processes) has ended."""
    pids = [json.loads(path.read_text())["pid"] for path in (out / "processes").glob("rank-*.json")]
    assert len(pids) >= 2
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in pids if running(pid)]


@pytest.mark.parametrize("strategy", [["--strategy", "allreduce"], ["--strategy", "ps", "--sync", "async"]])
def test_a_finite_loss_past_the_bound_stops_every_process(
    strategy: list[str], data: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    # the command line in this process (its start is a second of every CLI test); the workers are real processes
    assert main(train_args(data, out, "--workers", "2", "--epochs", "4", "--lr", "1e30", *strategy)) == 2
    stderr = capsys.readouterr().err
    said = [line for line in stderr.splitlines() if line.startswith("scaletrain:")]
    assert len(said) == 1 and "training diverged: the loss became " in said[0], stderr
    assert "(--divergence 10000 × its first steps' loss " in said[0] and "lower --lr (e.g. 1e+29)" in said[0]
    assert "Traceback" not in stderr
    assert not (out / "summary.json").exists()
    assert_no_survivors(out)
