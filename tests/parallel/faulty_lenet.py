"""LeNet whose process of a chosen rank kills or freezes itself at a chosen step, and which records the samples
each process computed: the elastic tests' workload, named ``tests.parallel.faulty_lenet:FaultyLeNet``.

``SCALETRAIN_TEST_FAULT=RANK:STEP:SIGNAL`` (e.g. ``2:8:SIGKILL``): that rank's process sends itself the signal
at the forward pass of its STEP-th step (counted from 1), before the step's all-reduce. ``SCALETRAIN_TEST_SAMPLES``
names a folder where each process appends, per global batch it starts, the sample indices of its part
(``samples-PID.jsonl``: rank, epoch, number, part count, indices), and where ``fault-time`` says when the
fault happened. ``SCALETRAIN_TEST_WAIT=RANK:STEP:PATH``: that rank waits at the forward pass of its STEP-th step
until PATH exists (at most a minute), so that a worker started mid-run (``--join``) is ready at a known step."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from scaletrain.data.sampler import EpochBatches, Part
from scaletrain.workloads.lenet import LeNetWorkload

ENV_FAULT = "SCALETRAIN_TEST_FAULT"
ENV_SAMPLES = "SCALETRAIN_TEST_SAMPLES"
ENV_WAIT = "SCALETRAIN_TEST_WAIT"


class FaultyLeNet(LeNetWorkload):
    _forward_passes = 0
    _waits = 0

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
        wait = os.environ.get(ENV_WAIT)
        if wait:
            rank, step, path = wait.split(":", 2)
            if int(os.environ.get("RANK", "-1")) == int(rank):
                FaultyLeNet._waits += 1
                deadline = time.monotonic() + 60
                while FaultyLeNet._waits == int(step) and not Path(path).exists() and time.monotonic() < deadline:
                    time.sleep(0.02)
        fault = os.environ.get(ENV_FAULT)
        if fault:
            rank, step, name = fault.split(":")
            if int(os.environ.get("RANK", "0")) == int(rank):
                FaultyLeNet._forward_passes += 1
                if FaultyLeNet._forward_passes == int(step):
                    folder = os.environ.get(ENV_SAMPLES)
                    if folder:  # when the fault happened, to time the survivors' recovery from
                        (Path(folder) / "fault-time").write_text(repr(time.time()))
                    os.kill(os.getpid(), getattr(signal, name))
        return super().training_loss(model, batch, state)
