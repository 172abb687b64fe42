"""LeNet whose process of a chosen rank kills or freezes itself at a chosen step, and which records the samples
each process computed: the elastic tests' workload, named ``tests.parallel.faulty_lenet:FaultyLeNet``.

``SCALETRAIN_TEST_FAULT=RANK:STEP:SIGNAL`` (e.g. ``2:8:SIGKILL``): that rank's process sends itself the signal
at the forward pass of its STEP-th step (counted from 1), before the step's all-reduce, once every other process
has started the same batch (at most 30 s): the others have then received all of the previous step, which a
killed process could otherwise take with it unread (its reset connection). ``SCALETRAIN_TEST_SAMPLES``
names a folder where each process appends, per global batch it starts, the sample indices of its part
(``samples-PID.jsonl``: rank, epoch, number, part count, indices), and where ``fault-time`` says when the
fault happened. ``SCALETRAIN_TEST_WAIT=RANK:STEP:PATH[,…]``: that rank waits at the forward pass of its STEP-th step
until PATH exists, or for ``store:KEY`` until the run's store holds KEY (at most a minute), so that a worker
started mid-run (``--join``) has asked to join at a known step. ``SCALETRAIN_TEST_SLOW=RANK:SECONDS``: that rank
sleeps SECONDS at every forward pass (a slower worker, for bounded staleness)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist

from scaletrain.data.sampler import EpochBatches, Part
from scaletrain.workloads.lenet import LeNetWorkload

ENV_FAULT = "SCALETRAIN_TEST_FAULT"
ENV_SAMPLES = "SCALETRAIN_TEST_SAMPLES"
ENV_WAIT = "SCALETRAIN_TEST_WAIT"
ENV_SLOW = "SCALETRAIN_TEST_SLOW"


class FaultyLeNet(LeNetWorkload):
    _forward_passes = 0
    _waits = 0
    _store: Any = None
    _current: tuple[int, int] = (-1, -1)  # (epoch, number) of the batch this process works on

    def train_batches(
        self,
        data: Any,
        *,
        epoch: int,
        batch_size: int,
        seed: int,
        part: Part = Part(),
        numbers: range | None = None,
    ) -> Iterator[Any]:
        # the parent's batches, and beside each the indices of its samples, drawn as the parent draws them
        batches = EpochBatches(
            self.train_size(data), batch_size=batch_size, seed=seed, epoch=epoch, part=part, numbers=numbers
        )
        produced = super().train_batches(
            data, epoch=epoch, batch_size=batch_size, seed=seed, part=part, numbers=numbers
        )
        folder = os.environ.get(ENV_SAMPLES)
        for number, batch in zip(batches.numbers, produced, strict=True):
            FaultyLeNet._current = (epoch, number)
            if folder:
                record = {
                    "rank": int(os.environ.get("RANK", "0")),
                    "epoch": epoch,
                    "number": number,
                    "count": part.count,
                    "indices": batches.indices(number).tolist(),
                }
                with (Path(folder) / f"samples-{os.getpid()}.jsonl").open("a") as file:
                    file.write(json.dumps(record) + "\n")
            yield batch

    def training_loss(self, model: Any, batch: Any, state: Any) -> Any:
        mine = int(os.environ.get("RANK", "-1"))  # a worker that joined has none
        slow = os.environ.get(ENV_SLOW)
        if slow and int(slow.split(":")[0]) == mine:
            time.sleep(float(slow.split(":")[1]))
        waits = [(int(step), what) for rank, step, what in _specs(os.environ.get(ENV_WAIT)) if int(rank) == mine]
        if waits:
            FaultyLeNet._waits += 1
            deadline = time.monotonic() + 60
            for step, what in waits:
                while FaultyLeNet._waits == step and not _exists(what) and time.monotonic() < deadline:
                    time.sleep(0.02)
        fault = os.environ.get(ENV_FAULT)
        if fault:
            rank, step, name = fault.split(":")
            if int(os.environ.get("RANK", "0")) == int(rank):
                FaultyLeNet._forward_passes += 1
                if FaultyLeNet._forward_passes == int(step):
                    folder = os.environ.get(ENV_SAMPLES)
                    if folder:  # when the fault happened, to time the survivors' recovery from
                        _wait_for_the_others(Path(folder))
                        (Path(folder) / "fault-time").write_text(repr(time.time()))
                    os.kill(os.getpid(), getattr(signal, name))
        return super().training_loss(model, batch, state)


def _wait_for_the_others(folder: Path) -> None:
    """Until every other process's last recorded batch is this one's (or later), at most 30 s."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        others = [path for path in folder.glob("samples-*.jsonl") if path.name != f"samples-{os.getpid()}.jsonl"]
        try:
            lasts = [json.loads(path.read_text().splitlines()[-1]) for path in others]
        except (IndexError, ValueError):  # a file just made, or a line half written: look again
            lasts = None
        if lasts is not None and all((last["epoch"], last["number"]) >= FaultyLeNet._current for last in lasts):
            return
        time.sleep(0.02)


def _specs(text: str | None) -> list[list[str]]:
    return [spec.split(":", 2) for spec in (text or "").split(",") if spec]


def _exists(what: str) -> bool:
    """Whether the file ``what`` exists, or for ``store:KEY`` whether the run's store holds KEY."""
    if not what.startswith("store:"):
        return Path(what).exists()
    if FaultyLeNet._store is None:  # a connection of its own to the run's store, as the launcher says where
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        FaultyLeNet._store = dist.TCPStore(address, port, is_master=False, timeout=datetime.timedelta(seconds=30))
    return FaultyLeNet._store.check([what.removeprefix("store:")])
