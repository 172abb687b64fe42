"""Faults with real processes: a worker or server killed, Ctrl-C, a dead launcher, a taken port,
a peer that never arrives. Nothing may hang and no process may be left behind."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import REPO, make_fashion_mnist, run_cli

pytestmark = pytest.mark.multiprocess

#: --timeout of the runs that freeze a process: each of those tests waits it out once. Long enough
#: for two or three processes on a busy 2-core machine to start and meet; each test's own bound on
#: how long the run may take after the freeze is this plus time to notice and stop everyone.
STOP_TIMEOUT = 10


def start_cli(*args: str) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "scaletrain", *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_training(out: Path, rank: int, deadline: float = 180) -> int:
    """The pid of ``rank`` once the run has trained a few steps (rank 0 logs them)."""
    end = time.monotonic() + deadline
    record = out / "processes" / f"rank-{rank}.json"
    while time.monotonic() < end:
        if record.exists() and (out / "metrics.jsonl").exists() and (out / "metrics.jsonl").stat().st_size:
            return json.loads(record.read_text())["pid"]
        time.sleep(0.05)
    raise AssertionError(f"the run in {out} did not start training within {deadline} s")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "zombie" not in status.read_text()


def all_pids(out: Path) -> list[int]:
    return [json.loads(path.read_text())["pid"] for path in (out / "processes").glob("rank-*.json")]


def assert_no_survivors(out: Path) -> None:
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in all_pids(out)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in all_pids(out) if alive(pid)]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    return make_fashion_mnist(tmp_path / "data", train=2048, test=64)


def train_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "lenet",
        "--data-dir",
        str(data),
        "--out",
        str(out),
        "--batch-size",
        "8",
        "--epochs",
        "12",
        "--threads",
        "1",
        "--no-tensorboard",
        "--log-every",
        "5",
        "--progress",
        "plain",
        *extra,
    ]


def test_async_run_survives_a_killed_worker(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Downpour's whole batches (split's lost-worker accounting: test_many_workers.py)
    run = start_cli(
        *train_args(data, out, "--workers", "3", "--strategy", "ps", "--sync", "async", "--async-batches", "share")
    )
    victim = wait_for_training(out, rank=2)
    os.kill(victim, signal.SIGKILL)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert [lost["rank"] for lost in summary["lost_workers"]] == [2]
    assert summary["lost_workers"][0]["batches_not_done"] > 0
    planned = 12 * (2048 // 8)
    assert summary["server_updates"] == planned - summary["lost_workers"][0]["batches_not_done"]
    assert "test_accuracy" in summary
    assert_no_survivors(out)


@pytest.mark.parametrize(
    ("strategy", "victim_rank", "role"),
    [
        (["--strategy", "allreduce"], 1, "worker"),
        (["--strategy", "allreduce", "--overlap", "--bucket-mb", "0.1"], 1, "worker"),
        (["--strategy", "ps", "--sync", "join"], 1, "worker"),
        (["--strategy", "ps", "--sync", "async"], 0, "server"),
        (["--strategy", "ps", "--server", "sharded", "--sync", "split"], 1, "worker"),
    ],
)
def test_sync_failure_stops_every_process_with_one_message(
    strategy: list[str], victim_rank: int, role: str, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    run = start_cli(*train_args(data, out, "--workers", "2", *strategy))
    victim = wait_for_training(out, rank=victim_rank)
    killed_at = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    _, stderr = run.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60
    assert run.returncode != 0
    assert f"{role} rank {victim_rank} (pid {victim}) was killed by signal 9" in stderr
    if (out / "checkpoint.pt").exists():  # the advice must be true to what is on disk
        assert f"continue with --resume --out {out}" in stderr
    else:
        assert "no checkpoint was written yet" in stderr and "--resume" not in stderr
    assert "Traceback" not in stderr
    assert_no_survivors(out)


def wait_for_file(path: Path, deadline: float = 120) -> None:
    end = time.monotonic() + deadline
    while not path.exists():
        assert time.monotonic() < end, f"{path} did not appear within {deadline} s"
        time.sleep(0.05)


def test_ctrl_c_stops_every_process_and_keeps_the_checkpoint(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Many epochs, so the run cannot finish on its own before Ctrl-C arrives.
    run = start_cli(*train_args(data, out, "--workers", "2", "--checkpoint-every", "5", "--epochs", "300"))
    wait_for_file(out / "checkpoint.pt")  # what this test needs: a checkpoint to keep
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130 and f"continue with --resume --out {out}" in stderr
    assert "Traceback" not in stderr
    assert_no_survivors(out)
    assert (out / "checkpoint.pt").exists()


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_before_the_first_checkpoint_promises_nothing(workers: str, tmp_path: Path) -> None:
    data = make_fashion_mnist(tmp_path / "data", train=16384, test=64)  # 2048 steps before an epoch ends
    out = tmp_path / "run"
    run = start_cli(*train_args(data, out, "--workers", workers, "--checkpoint-every", "100000"))
    wait_for_training(out, rank=0) if workers == "2" else wait_for_file(out / "metrics.jsonl")
    run.send_signal(signal.SIGINT)
    _, stderr = run.communicate(timeout=60)
    assert run.returncode == 130, stderr
    assert not (out / "checkpoint.pt").exists()
    assert "no checkpoint was written yet" in stderr and "--resume" not in stderr
    assert "Traceback" not in stderr


def test_async_run_survives_a_stopped_worker(data: Path, tmp_path: Path) -> None:
    """SIGSTOP, not death: the server counts the worker lost within --timeout and finishes with the other."""
    out = tmp_path / "run"
    extra = ["--workers", "2", "--strategy", "ps", "--sync", "async", "--async-batches", "share"]
    extra += ["--timeout", str(STOP_TIMEOUT)]
    run = start_cli(*train_args(data, out, *extra))
    victim = wait_for_training(out, rank=2)
    os.kill(victim, signal.SIGSTOP)
    try:
        _, stderr = run.communicate(timeout=240)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert run.returncode == 0, stderr
    summary = json.loads((out / "summary.json").read_text())
    [lost] = summary["lost_workers"]
    assert lost["rank"] == 2 and "stopped answering" in lost["reason"], lost
    assert lost["batches_not_done"] > 0
    assert f"lost worker rank 2 (no answer from worker rank 2 within {STOP_TIMEOUT} s" in stderr
    assert f"{lost['batches_not_done']} of its batches not done" in stderr
    assert summary["server_updates"] == 12 * (2048 // 8) - lost["batches_not_done"]
    assert_no_survivors(out)


@pytest.mark.parametrize(
    ("strategy", "victim_rank", "role"),
    [
        (["--strategy", "allreduce"], 1, "worker"),
        (["--strategy", "allreduce"], 0, "worker"),
        (["--strategy", "allreduce", "--overlap", "--bucket-mb", "0.1"], 1, "worker"),
        (["--strategy", "ps", "--sync", "async"], 0, "server"),
    ],
)
def test_a_stopped_process_is_named_in_one_line(
    strategy: list[str], victim_rank: int, role: str, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    run = start_cli(*train_args(data, out, "--workers", "2", "--timeout", str(STOP_TIMEOUT), *strategy))
    victim = wait_for_training(out, rank=victim_rank)
    os.kill(victim, signal.SIGSTOP)
    stopped_at = time.monotonic()
    try:
        _, stderr = run.communicate(timeout=180)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    assert time.monotonic() - stopped_at < STOP_TIMEOUT + 40  # the timeout, and time to notice and stop everyone
    assert run.returncode == 1, stderr
    said = [line for line in stderr.splitlines() if line.startswith("scaletrain:")]
    assert len(said) == 1, stderr
    assert f"{role} rank {victim_rank} (pid {victim}) stopped answering" in said[0]
    assert "Traceback" not in stderr and "gloo" not in stderr
    assert (out / "logs").is_dir()
    assert_no_survivors(out)


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_diverging_loss_stops_the_run(workers: str, data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = run_cli(*train_args(data, out, "--workers", workers, "--lr", "1e38"), timeout=180)
    assert result.returncode == 2, result.stderr
    said = [line for line in result.stderr.splitlines() if line.startswith("scaletrain:")]
    assert len(said) == 1 and "training diverged: the loss became" in said[0], result.stderr
    assert "lower --lr" in said[0] and "Traceback" not in result.stderr
    assert not (out / "summary.json").exists()


def test_workers_die_with_a_killed_launcher(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    run = start_cli(*train_args(data, out, "--workers", "2", "--strategy", "ps"))
    wait_for_training(out, rank=2)
    run.kill()
    run.communicate(timeout=30)
    assert_no_survivors(out)


def run_rank_zero_alone(data: Path, tmp_path: Path, port: int) -> subprocess.CompletedProcess:
    """Rank 0 of a two-process node-file job whose rendezvous is 127.0.0.1:``port``; rank 1 never comes."""
    nodefile = tmp_path / "nodes"
    nodefile.write_text(f"127.0.0.1:{port}\n127.0.0.1:{port}\n")
    extra = ["--workers", "2", "--nodefile", str(nodefile), "--index", "0", "--timeout", "4"]
    return run_cli(*train_args(data, tmp_path / "run", *extra), timeout=120)


def test_a_taken_port_is_a_clear_error(data: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_rank_zero_alone(data, tmp_path, port)
    assert result.returncode == 2, result.stderr
    assert f"127.0.0.1:{port}" in result.stderr and "port is free" in result.stderr


def test_a_peer_that_never_arrives_times_out(data: Path, tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    result = run_rank_zero_alone(data, tmp_path, port)
    assert result.returncode == 2, result.stderr
    assert time.monotonic() - started < 60
    assert "could not join the other 1 processes" in result.stderr


def test_without_our_launcher_the_survivor_names_the_stopped_process(data: Path, tmp_path: Path) -> None:
    """Two processes of a node-file job (as on two machines): rank 0 names rank 1 from the heartbeats."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    nodefile = tmp_path / "nodes"
    nodefile.write_text(f"127.0.0.1:{port}\n127.0.0.1:{port}\n")
    out = tmp_path / "run"
    common = train_args(data, out, "--workers", "2", "--nodefile", str(nodefile), "--timeout", str(STOP_TIMEOUT))
    ranks = [start_cli(*common, "--index", str(index)) for index in (0, 1)]
    try:
        victim = wait_for_training(out, rank=1)
        assert victim == ranks[1].pid
        os.kill(victim, signal.SIGSTOP)
        _, stderr = ranks[0].communicate(timeout=120)
    finally:
        for process in ranks:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
                os.kill(process.pid, signal.SIGCONT)
            process.communicate(timeout=30)
    assert ranks[0].returncode == 1, stderr
    assert f"worker rank 0: no answer from worker rank 1 within {STOP_TIMEOUT} s: it stopped answering" in stderr
    assert "Traceback" not in stderr and (out / "logs" / "rank-0.traceback").exists()
