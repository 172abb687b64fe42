"""Mixed precision and a narrow wire, each measured side by side with float32 in one run.

**A. Compute.** For each workload (default: LeNet and ResNet-20 on the real Fashion-MNIST, SqueezeNet
on synthetic 64×64 images with 10 classes), one process times forward + backward (t_grad) and the
optimizer step (t_update) under ``--precision fp32`` and ``bf16``, each with the convolutions'
activations channels-first (``--memory-format contiguous``) and channels-last — the timing code
``scaletrain profile`` uses, with the forward pass run as ``train`` runs it. The four alternate, round
after round, so that all see the same machine; the step is the median t_grad plus the median
t_update over all rounds. Goal (issue 12): bf16 ≥ 1.8× faster than fp32 on the ResNet, judged in each
layout (like for like); printed beside it, what channels-last buys each precision, and bf16 with
channels-last against the fp32 channels-first step scaletrain took before it had the option.

**B. Wire.** LeNet with 2 workers (default: all-reduce and the sharded parameter server, ``split``)
across an emulated link (``--network``, default 50mbit; namespaces + veth + tc, root), once with
``--wire fp32`` and once with ``--wire bf16``, plus one local process as the speedup's reference.
Every run is a fresh ``scaletrain train`` process tree, one after another. Read from each
``summary.json``: batches per second and the exchange's seconds per step — communication plus
waiting, because on a saturated link a worker of the sharded server waits for an owner's reply
header while the other worker's gradient crosses the same link, so the split between the two is not
the transfer's (both are printed). Then the refined estimator, fed a profile measured with each wire
(``scaletrain profile --network RATE --wire W``), predicts the 2-worker speedup of each; the gain of
bf16 over fp32 measured against predicted. Goals: the exchange per step with bf16 within 10 % of half
the fp32 one; the measured gain within 10 % of the predicted.

Run (root): ``PYTHONPATH=src .venv/bin/python benchmarks/precision.py [--rounds 3 --steps 60
--json out.json]``; ``--skip-wire`` runs part A only (no root needed). On a GPU, part A also times fp16
(``--device cuda --precisions fp32,bf16,fp16``); ``--resnet-dataset cifar10`` times the ResNets on
CIFAR-10-shaped 3×32×32 inputs (``scripts/device-suite.sh`` gives them random images in its format).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

import scaletrain
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.measure.probe import time_gradient
from training_runs import fashion_mnist, run_records, train_run

COMPUTE_GOAL, WIRE_TOLERANCE, GAIN_TOLERANCE = 1.8, 0.10, 0.10
LAYOUTS = ("contiguous", "channels_last")
#: workload, its options, batch size
COMPUTE_WORKLOADS = {
    "lenet": ({}, 64),
    "resnet20": ({"dataset": "fashion-mnist"}, 64),
    "resnet32": ({"dataset": "fashion-mnist"}, 64),
    "squeezenet": ({"data": "synthetic", "image_size": "64", "num_classes": "10"}, 32),
}


def compute(args: argparse.Namespace, data_dir: Path) -> dict[str, Any]:
    """Part A: per workload, the median step of each precision in each layout, rounds alternating."""
    results = {}
    layouts = args.layouts.split(",")
    precisions = args.precisions.split(",")
    narrow = [precision for precision in precisions if precision != "fp32"]
    for workload in args.workloads.split(","):
        options, batch = COMPUTE_WORKLOADS[workload]
        if workload.startswith("resnet"):
            options = {**options, "dataset": args.resnet_dataset}
        batch = args.compute_batch or batch
        runs = [(precision, layout) for layout in layouts for precision in precisions]
        samples: dict[tuple[str, str], dict[str, list[float]]] = {run: {"t_grad": [], "t_update": []} for run in runs}
        for _ in range(args.rounds):
            for precision, layout in runs:
                job = {
                    **dict(workload=workload, options=options, data_dir=str(data_dir), download=False),
                    **dict(threads=args.threads, batch_size=batch, parts=[1], lr=0.01, momentum=0.9),
                    **dict(warmup=args.warmup, repeats=args.repeats, precision=precision, memory_format=layout),
                    "device": args.device,
                }
                measured = time_gradient(job)
                samples[precision, layout]["t_grad"] += measured["t_grad"]["1"]
                samples[precision, layout]["t_update"] += measured["t_update"]
        step = {run: statistics.median(s["t_grad"]) + statistics.median(s["t_update"]) for run, s in samples.items()}
        speedups = {p: {layout: step["fp32", layout] / step[p, layout] for layout in layouts} for p in narrow}
        results[workload] = {
            "batch_size": batch,
            "device": args.device,
            "step_seconds": {f"{precision}/{layout}": seconds for (precision, layout), seconds in step.items()},
            "speedup": speedups.get("bf16", {}),
            "speedups": speedups,
        }
        for layout in layouts:
            others = ", ".join(f"{p} {1000 * step[p, layout]:8.1f} ms → ×{speedups[p][layout]:.2f}" for p in narrow)
            print(
                f"  {workload:<11} batch {batch:>3}, {layout:<13}: fp32 {1000 * step['fp32', layout]:8.1f} ms"
                f"{', ' + others if others else ''} per step",
                flush=True,
            )
        if set(LAYOUTS) <= set(layouts) and "bf16" in precisions:
            fastest_fp32 = min(step["fp32", layout] for layout in layouts)
            results[workload]["bf16_channels_last_against_fp32_contiguous"] = (
                step["fp32", "contiguous"] / step["bf16", "channels_last"]
            )
            results[workload]["bf16_channels_last_against_fastest_fp32"] = fastest_fp32 / step["bf16", "channels_last"]
            print(
                f"  {workload:<11} channels_last against contiguous: fp32 "
                f"×{step['fp32', 'contiguous'] / step['fp32', 'channels_last']:.2f}, bf16 "
                f"×{step['bf16', 'contiguous'] / step['bf16', 'channels_last']:.2f}; bf16 channels_last against "
                f"fp32 contiguous ×{results[workload]['bf16_channels_last_against_fp32_contiguous']:.2f}",
                flush=True,
            )
    return results


def wire_run(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    flags = [
        *("--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", "1"),
        *("--seed", "0", "--data-dir", str(data_dir), "--warmup-steps", "5", *extra),
    ]
    train_run("lenet", out, flags, timeout=3600)
    _, summary = run_records(out)
    figures = ("batches_per_second", "communication_seconds_per_step", "wait_seconds_per_step", "test_accuracy")
    return {key: summary.get(key) for key in figures}


def wire(args: argparse.Namespace, data_dir: Path, folder: Path) -> tuple[dict[str, Any], dict[str, bool]]:
    """Part B: fp32 against bf16 on the wire, measured and predicted."""
    runs = {"local": wire_run(args, data_dir, folder / "local", [])}
    profiles = {
        codec: scaletrain.profile(
            "lenet",
            out=folder / f"profile-{codec}.json",
            batch_size=args.batch_size,
            network=args.network,
            wire=codec,
            split_workers=(2,),
            launches=2,
            data_dir=data_dir,
            download=False,
        )
        for codec in ("fp32", "bf16")
    }
    checks, table = {}, []
    for strategy in args.strategies.split(","):
        measured, predicted, exchange = {}, {}, {}
        for codec in ("fp32", "bf16"):
            layout = ["--workers", "2", "--strategy", strategy, "--network", args.network, "--wire", codec]
            run = runs[f"{strategy}/{codec}"] = wire_run(args, data_dir, folder / strategy / codec, layout)
            measured[codec] = run["batches_per_second"] / runs["local"]["batches_per_second"]
            predicted[codec] = predicted_speedup(
                "refined", profiles[codec], Configuration.parse(strategy), 2, batches=args.steps, cores=os.cpu_count()
            )
            exchange[codec] = run["communication_seconds_per_step"] + run["wait_seconds_per_step"]
            row = (strategy, codec, run["communication_seconds_per_step"], exchange[codec])
            table.append((*row, predicted[codec], measured[codec]))
        halved = exchange["bf16"] / exchange["fp32"]
        gain, predicted_gain = measured["bf16"] / measured["fp32"], predicted["bf16"] / predicted["fp32"]
        checks[f"{strategy}: exchange per step bf16/fp32 = {halved:.3f} (goal 0.5 ± 10 %)"] = (
            abs(halved / 0.5 - 1) <= WIRE_TOLERANCE
        )
        checks[f"{strategy}: speedup gain measured ×{gain:.3f}, predicted ×{predicted_gain:.3f} (goal within 10 %)"] = (
            abs(gain / predicted_gain - 1) <= GAIN_TOLERANCE
        )
    print(f"\n{'strategy':<18} {'wire':<5} {'comm':>8} {'+ wait':>8} {'predicted speedup':>18} {'measured':>9}")
    for strategy, codec, communication, both, predicted_value, measured_value in table:
        print(
            f"{strategy:<18} {codec:<5} {communication:>8.4f} {both:>8.4f} {predicted_value:>18.3f} "
            f"{measured_value:>9.3f}"
        )
    profile_bytes = {codec: profile.weight_bytes for codec, profile in profiles.items()}
    profile_comm = {codec: profile.t_comm for codec, profile in profiles.items()}
    print(f"profiles: weight bytes {profile_bytes}, t_comm {profile_comm}")
    return {"runs": runs, "profiles": {c: p.to_json() for c, p in profiles.items()}, "table": table}, checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="lenet,resnet20,squeezenet", help="part A's workloads")
    parser.add_argument("--rounds", type=int, default=3, help="part A: alternating rounds per precision")
    parser.add_argument("--repeats", type=int, default=10, help="part A: timed steps per round")
    parser.add_argument("--warmup", type=int, default=3, help="part A: untimed steps per round")
    parser.add_argument("--threads", type=int, default=1, help="part A: torch threads")
    parser.add_argument("--layouts", default=",".join(LAYOUTS), help="part A: --memory-format values to time")
    parser.add_argument("--compute-batch", type=int, help="part A: this batch for every workload (default: 64/64/32)")
    parser.add_argument("--precisions", default="fp32,bf16", help="part A: the first must be fp32; fp16 on CUDA only")
    parser.add_argument("--device", default="cpu", help="part A: where the steps run (cpu, cuda, cuda:K)")
    parser.add_argument("--resnet-dataset", default="fashion-mnist", help="part A: the ResNets' inputs (or cifar10)")
    parser.add_argument("--skip-wire", action="store_true", help="part A only")
    parser.add_argument("--strategies", default="allreduce-split,ps-sharded-split", help="part B's 2-worker runs")
    parser.add_argument("--network", default="50mbit")
    parser.add_argument("--steps", type=int, default=60, help="part B: steps per run")
    parser.add_argument("--batch-size", type=int, default=64, help="part B: global batch")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    print(f"A. bf16 autocast against fp32, {args.threads} thread(s), {args.rounds} alternating rounds", flush=True)
    result: dict[str, Any] = {"compute": compute(args, data_dir)}
    checks = {
        f"resnet20, {layout}: bf16 step ×{speedup:.2f} faster than fp32 in the same layout (goal ≥ {COMPUTE_GOAL})": (
            speedup >= COMPUTE_GOAL
        )
        for layout, speedup in result["compute"].get("resnet20", {}).get("speedup", {}).items()
    }
    if not args.skip_wire:
        print(f"\nB. --wire bf16 against fp32, LeNet, 2 workers over {args.network}", flush=True)
        folder = Path(tempfile.mkdtemp(prefix="st-precision-"))
        result["wire"], wire_checks = wire(args, data_dir, folder)
        checks.update(wire_checks)
    for text, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {text}")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        args.json.write_text(json.dumps({"settings": settings, **result, "checks": checks}, indent=2) + "\n")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
