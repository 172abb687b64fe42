"""Many worker processes on a few cores, cheaply: each rank is forked from a server that has imported
torch and scaletrain once.

Started with ``python -m``, every process of a run imports torch and scaletrain itself (about 2.5 s of
CPU each), so 16 processes on a 2-core machine spend most of a minute importing before they train.
Here a ``forkserver`` with those modules preloaded forks each rank; the rank then joins the others
through the torchrun variables (as under torchrun: the rendezvous, process groups and training are
the real ones, on loopback) and trains :func:`tiny_workload`, a network of four tensors, so that 16
owners of a sharded server are more owners than tensors.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

import scaletrain
from scaletrain import ClassificationWorkload

CONTEXT = multiprocessing.get_context("forkserver")
# torch._dynamo: the first optimizer imports it (1.5 s of CPU), once per process unless preloaded
CONTEXT.set_forkserver_preload(["torch._dynamo", "scaletrain", "scaletrain.parallel.worker", "tests.jobs.many_workers"])

#: Samples of the tiny data set, inputs per sample, classes.
SAMPLES, INPUTS, CLASSES = 256, 8, 3
HIDDEN = 6
#: The tiny network's tensors: two weights and two biases.
TENSORS = 4


def tiny_network() -> nn.Module:
    return nn.Sequential(nn.Linear(INPUTS, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, CLASSES))


def tiny_workload() -> ClassificationWorkload:
    """A learnable three-class problem (the class is the largest of the first three inputs)."""
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(SAMPLES, INPUTS, generator=generator)
    labels = inputs[:, :CLASSES].argmax(dim=1)
    return ClassificationWorkload.from_tensors(
        "tiny", tiny_network, train=(inputs, labels), test=(inputs[:64], labels[:64]), lr=0.1, momentum=0.9
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _rank_main(rank: int, world_size: int, port: int, settings: dict[str, Any]) -> None:
    """One process of the run: its output to ``OUT/logs/rank-K.log``, then the run as torchrun's rank K."""
    out = Path(settings["out"])
    (out / "logs").mkdir(parents=True, exist_ok=True)
    log = os.open(out / "logs" / f"rank-{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    code = 0
    try:
        scaletrain.train(tiny_workload(), **settings)
    except scaletrain.ScaletrainError as exc:
        print(f"scaletrain: error: rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        code = 1
    scaletrain.exit_now(code)  # no c10d teardown at exit (see exit_now)


@dataclass
class Run:
    """The processes of one run, by rank."""

    out: Path
    processes: list[multiprocessing.process.BaseProcess]

    def pid(self, rank: int) -> int:
        return self.processes[rank].pid

    def wait(self, deadline: float) -> dict[int, int]:
        """Every rank's exit code; a rank still running after ``deadline`` seconds fails the test, naming it."""
        end = time.monotonic() + deadline
        for process in self.processes:
            process.join(max(0.0, end - time.monotonic()))
        hanging = [rank for rank, process in enumerate(self.processes) if process.is_alive()]
        if hanging:
            self.stop()
            raise AssertionError(f"ranks {hanging} still ran after {deadline:.0f} s\n{self.logs()}")
        return {rank: process.exitcode for rank, process in enumerate(self.processes)}

    def stop(self) -> None:
        for process in self.processes:
            if process.is_alive():
                process.kill()
        for process in self.processes:
            process.join(10)

    def logs(self) -> str:
        return "\n".join(
            f"--- rank {rank}\n{path.read_text(errors='replace')[-2000:]}"
            for rank, path in sorted((int(p.stem.split("-")[1]), p) for p in (self.out / "logs").glob("rank-*.log"))
        )


@contextlib.contextmanager
def started(world_size: int, **settings: Any) -> Iterator[Run]:
    """Start ``world_size`` processes of a run of :func:`tiny_workload` with ``settings`` (``out`` among them);
    none is left running afterwards."""
    port = free_port()
    processes = [
        CONTEXT.Process(target=_rank_main, args=(rank, world_size, port, settings)) for rank in range(world_size)
    ]
    for process in processes:
        process.start()
    run = Run(Path(settings["out"]), processes)
    try:
        yield run
    finally:
        run.stop()


def train(world_size: int, deadline: float = 150, **settings: Any) -> dict[int, int]:
    """Run to the end; every rank's exit code."""
    with started(world_size, **settings) as run:
        return run.wait(deadline)
