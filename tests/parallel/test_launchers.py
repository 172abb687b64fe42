"""Across machines: separate processes that find each other only through a node file or the
torchrun variables, started by the test itself, reach the same weights as one process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, free_ports, make_fashion_mnist

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.parallel.rendezvous import Rendezvous

pytestmark = pytest.mark.multiprocess


def free_port() -> int:
    return free_ports(1)[0]


def run_all(commands: list[tuple[list[str], dict[str, str]]]) -> list[subprocess.CompletedProcess]:
    base = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        base.pop(name, None)
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "scaletrain", *args],
            env={**base, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for args, env in commands
    ]
    results = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=300)
        results.append(subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr))
    return results


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor], list[str]]:
    root = tmp_path_factory.mktemp("launchers")
    data = make_fashion_mnist(root / "data", train=192, test=32)
    common = [
        "--data-dir",
        str(data),
        "--batch-size",
        "12",
        "--epochs",
        "1",
        "--threads",
        "1",
        "--seed",
        "3",
        "--momentum",
        "0.9",
        "--no-tensorboard",
        "--progress",
        "off",
    ]
    scaletrain.train(
        "lenet",
        data_dir=data,
        out=root / "local",
        batch_size=12,
        epochs=1,
        threads=1,
        seed=3,
        momentum=0.9,
        tensorboard=False,
        progress="off",
    )
    return root, torch.load(root / "local/model.pt", weights_only=True), common


def assert_same(out: Path, reference: dict[str, torch.Tensor]) -> None:
    result = torch.load(out / "model.pt", weights_only=True)
    for name in reference:
        torch.testing.assert_close(result[name], reference[name], rtol=1e-4, atol=1e-5)


def test_node_file_processes_find_each_other(setup, tmp_path: Path) -> None:
    _, reference, common = setup
    nodefile = tmp_path / "nodes.txt"
    port = free_port()
    nodefile.write_text(f"# rank 0 listens here\n127.0.0.1:{port}\n127.0.0.1:{port + 1}\n")
    out = tmp_path / "run"
    results = run_all(
        [
            (
                [
                    "train",
                    "lenet",
                    *common,
                    "--workers",
                    "2",
                    "--sync",
                    "split",
                    "--out",
                    str(out),
                    "--nodefile",
                    str(nodefile),
                    "--index",
                    str(index),
                ],
                {},
            )
            for index in (1, 0)
        ]
    )
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert "rank 1 finished" in results[0].stdout and "test_accuracy" in results[1].stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategy"] == "allreduce" and summary["workers"] == 2
    assert_same(out, reference)


def test_torchrun_variables_are_honoured(setup, tmp_path: Path) -> None:
    _, reference, common = setup
    port = str(free_port())
    out = tmp_path / "run"
    results = run_all(
        [
            (
                [
                    "train",
                    "lenet",
                    *common,
                    "--workers",
                    "2",
                    "--strategy",
                    "ps",
                    "--sync",
                    "split",
                    "--out",
                    str(out),
                ],
                {
                    "RANK": str(rank),
                    "WORLD_SIZE": "3",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": port,
                    "LOCAL_RANK": str(rank),
                },
            )
            for rank in (2, 1, 0)
        ]
    )
    assert [r.returncode for r in results] == [0, 0, 0], [r.stderr for r in results]
    roles = {json.loads(p.read_text())["role"] for p in (out / "processes").glob("rank-*.json")}
    assert roles == {"server", "worker"}
    assert_same(out, reference)


def test_under_the_real_torchrun(setup, tmp_path: Path) -> None:
    """torchrun's agent serves the store itself: the processes use it, with nothing failing to bind."""
    _, reference, common = setup
    out = tmp_path / "run"
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        environment.pop(name, None)
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", "--master-port", str(free_port())]
    command += ["-m", "scaletrain", "train", "lenet", *common, "--workers", "2", "--sync", "split", "--out", str(out)]
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=300)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "failed to bind" not in output and "Traceback" not in output, output
    assert json.loads((out / "summary.json").read_text())["workers"] == 2
    assert_same(out, reference)


def test_wrong_process_count_is_named(setup, tmp_path: Path) -> None:
    _, _, common = setup
    nodefile = tmp_path / "nodes.txt"
    nodefile.write_text(f"127.0.0.1:{free_port()}\n127.0.0.1:1\n")
    results = run_all(
        [
            (
                [
                    "train",
                    "lenet",
                    *common,
                    "--workers",
                    "2",
                    "--strategy",
                    "ps",
                    "--out",
                    str(tmp_path / "r"),
                    "--nodefile",
                    str(nodefile),
                    "--index",
                    "0",
                ],
                {},
            )
        ]
    )
    assert results[0].returncode == 2
    assert "needs 3 processes, but the launcher started 2" in results[0].stderr


def test_node_file_parsing() -> None:
    rendezvous = Rendezvous.from_nodefile(_write("a:1\nb:2\nb:3\n"), 2)
    assert (rendezvous.rank, rendezvous.world_size, rendezvous.master_addr, rendezvous.master_port) == (
        2,
        3,
        "a",
        1,
    )
    assert (rendezvous.local_rank, rendezvous.local_world_size) == (1, 2)
    with pytest.raises(ConfigError, match="outside node file"):
        Rendezvous.from_nodefile(_write("a:1\n"), 1)
    with pytest.raises(ConfigError, match="host:port"):
        Rendezvous.from_nodefile(_write("just-a-host\n"), 0)
    with pytest.raises(ConfigError, match="RANK"):
        Rendezvous.from_env({})


def _write(text: str) -> Path:
    import tempfile

    path = Path(tempfile.mkdtemp()) / "nodes"
    path.write_text(text)
    return path


def test_a_background_thread_s_traceback_goes_to_the_log_not_the_terminal_under_our_launcher():
    # as multiprocessing's file-descriptor thread fails when a Ctrl-C kills the loader workers mid-handshake
    program = (
        "import threading\n"
        "from scaletrain.parallel.worker import thread_tracebacks_to_log\n"
        "thread_tracebacks_to_log()\n"
        "def serve():\n"
        "    raise ConnectionResetError(104, 'Connection reset by peer')\n"
        "thread = threading.Thread(target=serve, name='sharer')\n"
        "thread.start(); thread.join()\n"
        # multiprocessing.resource_sharer catches the error itself and reports it through sys.excepthook
        "import sys\n"
        "def serve_and_report():\n"
        "    try:\n"
        "        raise ConnectionAbortedError(103, 'Software caused connection abort')\n"
        "    except Exception:\n"
        "        sys.excepthook(*sys.exc_info())\n"
        "reporter = threading.Thread(target=serve_and_report, name='reporter')\n"
        "reporter.start(); reporter.join()\n"
    )
    environment = {**os.environ, "SCALETRAIN_LAUNCHER": "1"}
    launched = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                              timeout=120, check=True)  # fmt: skip
    assert launched.stderr == ""  # what the launcher shows on the terminal
    assert "exception in sharer:" in launched.stdout and "ConnectionResetError" in launched.stdout  # the log
    assert "exception in reporter:" in launched.stdout and "ConnectionAbortedError" in launched.stdout
    # without our launcher (a worker started by torchrun or a pod), Python's own report on stderr stays
    del environment["SCALETRAIN_LAUNCHER"]
    alone = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                           timeout=120, check=True)  # fmt: skip
    assert "ConnectionResetError" in alone.stderr and "ConnectionAbortedError" in alone.stderr and alone.stdout == ""
