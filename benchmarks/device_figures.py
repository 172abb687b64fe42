"""The GPU figures of ``scripts/device-suite.sh``, each part a run of an existing benchmark.

- ``precision``: ``benchmarks/precision.py``'s part A on the GPU — fp32, bf16 and fp16 step time of
  ResNet-20 and ResNet-32 on CIFAR-10-shaped inputs (random images written in CIFAR-10's binary format:
  timing only) at batch 128 and 256, channels-first and channels-last, each against fp32 in the same
  layout (issue 12's goal: ×1.8). The step is timed as ``scaletrain profile`` times it: forward and
  backward under autocast plus the fused SGD step, without the loss scaling (its few element-wise
  passes over the gradients are left out).
- ``gpu-vs-cpu``: the same timing, fp32, LeNet and ResNet-20 on Fashion-MNIST at batch 64, on the GPU
  and on one CPU thread of the same machine, both layouts.
- ``prunetrain``: ``benchmarks/prunetrain.py`` on the GPU — dense against PruneTrain, epoch times.
- ``adaptive-batch``: ``benchmarks/adaptive_batch.py`` on the GPU — the batch search after pruning,
  against device memory.

With ``--dry-run`` every part runs on this CPU at tiny sizes (fp16 left out: CUDA only), so the code
cannot rot between the GPU machine's visits. Each part writes its numbers to ``--json``.

Run: ``PYTHONPATH=src:benchmarks python benchmarks/device_figures.py PART --json OUT.json --data-dir DIR
--work DIR [--dry-run]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

import adaptive_batch
import precision
import prunetrain
from scaletrain.data.cifar import BATCHES_FOLDER, META_FILE, RECORD_BYTES, TEST_FILE, TRAIN_FILES

CIFAR_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def write_random_cifar10(folder: Path, *, per_file: int, seed: int = 0) -> Path:
    """``folder/cifar-10/cifar-10-batches-bin`` in CIFAR-10's binary format (a label byte, then 3,072 pixel
    bytes per record), random pixels and labels: CIFAR-10-shaped inputs for timing, nothing to learn."""
    target = folder / "cifar-10" / BATCHES_FOLDER
    target.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in (*TRAIN_FILES, TEST_FILE):
        records = rng.integers(0, 256, size=(per_file, RECORD_BYTES), dtype=np.uint8)
        records[:, 0] = rng.integers(0, 10, size=per_file)
        (target / name).write_bytes(records.tobytes())
    (target / META_FILE).write_text("\n".join(CIFAR_CLASSES) + "\n")
    return folder


def timing(args: argparse.Namespace, **settings: Any) -> argparse.Namespace:
    """The arguments :func:`precision.compute` reads, for one call."""
    dry = args.dry_run
    defaults = dict(rounds=1 if dry else 2, repeats=2 if dry else 10, warmup=1 if dry else 3, threads=1)
    defaults |= dict(layouts=",".join(precision.LAYOUTS), resnet_dataset="fashion-mnist", compute_batch=None)
    return argparse.Namespace(**(defaults | settings))


def precision_part(args: argparse.Namespace) -> dict[str, Any]:
    data = write_random_cifar10(args.work / "cifar-shaped", per_file=16 if args.dry_run else 512)
    device, kinds = ("cpu", "fp32,bf16") if args.dry_run else ("cuda", "fp32,bf16,fp16")
    batches = (8, 16) if args.dry_run else (128, 256)
    result: dict[str, Any] = {"device": device, "inputs": "random 3×32×32 images in CIFAR-10's format", "batches": {}}
    for batch in batches:
        settings = timing(args, workloads="resnet20,resnet32", compute_batch=batch, precisions=kinds, device=device)
        settings.resnet_dataset = "cifar10"
        result["batches"][str(batch)] = precision.compute(settings, data)
    return result


def gpu_vs_cpu_part(args: argparse.Namespace) -> dict[str, Any]:
    batch = 8 if args.dry_run else 64
    gpu = "cpu" if args.dry_run else "cuda"  # the dry run times the CPU twice: the code path, not the figure
    common = dict(workloads="lenet,resnet20", compute_batch=batch, precisions="fp32")
    return {
        "batch_size": batch,
        "gpu": precision.compute(timing(args, device=gpu, **common), args.data_dir),
        "cpu": precision.compute(timing(args, device="cpu", **common), args.data_dir),
        "cpu_threads": 1,
    }


def prunetrain_part(args: argparse.Namespace) -> dict[str, Any]:
    """Dense against PruneTrain on the GPU; an epoch's time before and after the network shrank."""
    if args.dry_run:
        flags = ["--epochs", "2", "--train-samples", "64", "--batch-size", "16", "--reconfigure-every", "1"]
        flags += ["--lasso-ratio", "0.9", "--lr-decay-start", "1", "--threads", "1", "--device", "cpu"]
    else:
        # r = 0.5 every 2 epochs pruned nothing in 6 epochs on the H100 (2026-11-26); r = 0.8 every epoch
        # at batch 64 shrank ResNet-20 from 272,186 to 104,665 parameters in 4 (the adaptive-batch part)
        flags = ["--epochs", "5", "--train-samples", "12800", "--batch-size", "64", "--reconfigure-every", "1"]
        flags += ["--lasso-ratio", "0.8", "--lr", "0.05", "--lr-decay-start", "4", "--threads", "2", "--device", "cuda"]
    return run_benchmark(prunetrain.main, flags, args)


def adaptive_batch_part(args: argparse.Namespace) -> dict[str, Any]:
    """PruneTrain with and without ``--batch-budget`` on the GPU: the batch found against device memory."""
    if args.dry_run:
        flags = ["--epochs", "2", "--train-samples", "128", "--batch-size", "16", "--budget", "1GB"]
        flags += ["--warmup", "2", "--threads", "1", "--device", "cpu"]
    else:
        flags = ["--epochs", "4", "--train-samples", "12800", "--batch-size", "64", "--budget", "1GB"]
        flags += ["--threads", "2", "--device", "cuda"]
    return run_benchmark(adaptive_batch.main, flags, args)


def run_benchmark(main: Any, flags: list[str], args: argparse.Namespace) -> dict[str, Any]:
    """A benchmark's ``main`` with ``--json``; its numbers and whether it met its own goals."""
    path = args.work / f"{args.part}-benchmark.json"
    status = main([*flags, "--data-dir", str(args.data_dir), "--json", str(path)])
    report = json.loads(path.read_text(encoding="utf-8"))
    return {"flags": flags, "goals_met": status == 0, **report}


PARTS = {
    "precision": precision_part,
    "gpu-vs-cpu": gpu_vs_cpu_part,
    "prunetrain": prunetrain_part,
    "adaptive-batch": adaptive_batch_part,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--data-dir", type=Path, required=True, help="the Fashion-MNIST folder")
    parser.add_argument("--work", type=Path, required=True, help="scratch folder")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on this CPU")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(PARTS[args.part](args), indent=1, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
