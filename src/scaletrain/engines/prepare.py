"""What a foreign engine's program reads: ``spec.json``, the samples of every step and the initial weights.

The samples come from scaletrain's own sampler and the weights from its own seeded model, so an engine
trains the run scaletrain would: the same first weights, the same batches in the same order, the same
split of a global batch over the workers (:mod:`scaletrain.engines` states the contract).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaletrain.data.idx import (
    FASHION_MNIST_FILES,
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    fashion_mnist_file,
    find_fashion_mnist,
    read_idx,
)
from scaletrain.engines.orders import plans, worker_orders
from scaletrain.engines.prepare_text import FOLLOWED_OPTIONS, prepare_text
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload
from scaletrain.workloads.base import count_parameters

__all__ = ["EngineRun", "check_settings", "prepare"]

SPEC_NAME = "spec.json"
ORDER_NAME = "order.npz"
INIT_NAME = "init.npz"


@dataclass(frozen=True)
class EngineRun:
    """One foreign run: which engine and workload, its layout and its training settings."""

    framework: str
    workload: str
    mode: str  # local, sync or async
    workers: int
    servers: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    epochs: int | None
    steps: int | None
    warmup_steps: int
    threads: int
    seed: int
    data_dir: Path | None
    clip_norm: float | None = None  # the whole gradient's norm clipped to this (None or 0: not clipped)
    lr_warmup: int | None = None  # gpt: updates of the rate's linear warm-up (None: the workload's)
    options: dict[str, Any] = field(default_factory=dict)  # the workload's options (-o)


def check_settings(run: EngineRun) -> None:
    """Refuse, in one line, a workload option or setting the engines' programs do not follow for ``run``'s
    workload (before any file is read or written).

    >>> check_settings(EngineRun("mxnet", "lenet", "sync", 2, 0, 16, 0.1, 0.0, 0.0, 1, None, 0, 1, 0, None, 0.5))
    Traceback (most recent call last):
    scaletrain.errors.ConfigError: --clip-norm: the engines clip gradients for ptb-lstm and gpt, not for lenet
    """
    followed = FOLLOWED_OPTIONS.get(run.workload, ())
    unfollowed = sorted({key.replace("-", "_") for key in run.options} - set(followed))
    if unfollowed:
        raise ConfigError(
            f"workload option {', '.join(unfollowed)}: the engines follow "
            f"{'only ' + ', '.join(followed) if followed else 'none'} for {run.workload}"
        )
    if run.workload == "lenet" and run.clip_norm:
        raise ConfigError("--clip-norm: the engines clip gradients for ptb-lstm and gpt, not for lenet")
    if run.workload != "gpt" and run.lr_warmup:
        raise ConfigError(f"--lr-warmup: the engines warm the rate up for gpt only, not for {run.workload}")


def prepare(run: EngineRun, out: Path) -> dict[str, Any]:
    """Write ``spec.json``, ``order.npz`` and ``init.npz`` (and ``tokens.npz`` for a text) into ``out``; the spec."""
    check_settings(run)
    workload = create_workload(run.workload, run.options)
    out.mkdir(parents=True, exist_ok=True)
    if run.workload == "lenet":
        fields, orders = _prepare_images(run, out)
    else:
        fields, orders = prepare_text(run, plans(run), out)
    torch.manual_seed(run.seed)  # as scaletrain's own run builds its model (train/build.py)
    model = workload.build_model()
    parameters = count_parameters(model)
    np.savez(out / INIT_NAME, **{name: value.detach().numpy() for name, value in model.state_dict().items()})
    spec = {
        "workload": run.workload,
        "mode": run.mode,
        "workers": run.workers,
        "servers": run.servers,
        "batch_size": run.batch_size,
        "lr": run.lr,
        "momentum": run.momentum,
        "weight_decay": run.weight_decay,
        "clip_norm": run.clip_norm or 0.0,
        "steps": [len(order) for order in orders],
        "warmup_steps": run.warmup_steps,
        "threads": run.threads,
        "parameters": parameters,  # the programs check that their model has as many
        **fields,
        "order": str(out / ORDER_NAME),
        "init": str(out / INIT_NAME),
        "out": str(out),
    }
    (out / SPEC_NAME).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    return spec


def _prepare_images(run: EngineRun, out: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``lenet``: the Fashion-MNIST files and ``order.npz``; the spec's fields of the workload and the orders."""
    directory = find_fashion_mnist(run.data_dir, download=False)
    # a folder find_fashion_mnist returns holds all four files, gzipped or raw
    stems = [name.removesuffix(".gz") for name in FASHION_MNIST_FILES]
    files = {stem: fashion_mnist_file(directory, stem) for stem in stems}
    train_size = len(read_idx(files["train-labels-idx1-ubyte"]))
    orders = worker_orders(run, train_size)
    np.savez(out / ORDER_NAME, **{f"w{i}": order for i, order in enumerate(orders)})
    fields = {
        "data": {
            "train_images": str(files["train-images-idx3-ubyte"]),
            "train_labels": str(files["train-labels-idx1-ubyte"]),
            "test_images": str(files["t10k-images-idx3-ubyte"]),
            "test_labels": str(files["t10k-labels-idx1-ubyte"]),
            "mean": FASHION_MNIST_MEAN,
            "std": FASHION_MNIST_STD,
        },
        "train_size": train_size,
        "steps_per_epoch": train_size // (run.batch_size * plans(run)[0].global_batch_factor),
        "metric": "test_accuracy",
    }
    return fields, orders
