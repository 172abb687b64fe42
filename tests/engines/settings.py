"""One foreign run's settings for the engines' tests: LeNet, lr 0.05, momentum 0.9, 30 steps, seed 3."""

from __future__ import annotations

from pathlib import Path

from scaletrain.engines.prepare import EngineRun


def setting(engine: str, mode: str, workers: int, batch: int, data: Path, **changes: object) -> EngineRun:
    servers = {"local": 0, "sync": 0 if engine == "tensorflow" else 1, "async": 1}[mode]
    fields = dict(
        framework=engine, workload="lenet", mode=mode, workers=workers, servers=servers, batch_size=batch, lr=0.05,
        momentum=0.9, weight_decay=0.0, epochs=None, steps=30, warmup_steps=2, threads=1, seed=3, data_dir=data,
    )  # fmt: skip
    return EngineRun(**{**fields, **changes})
