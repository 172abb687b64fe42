"""PruneTrain against dense training on the real Fashion-MNIST, side by side in one run.

Fresh ``scaletrain train`` processes (as a bench child runs them) train the same ResNet (default
``resnet20``: 20 layers, 272,474 parameters at 3 input channels, 272,186 at Fashion-MNIST's one) with
the same seed, batch, learning-rate schedule and epochs: once dense, then once with ``--technique
prunetrain`` per lasso ratio given (``--lasso-ratio 0.3 0.4`` compares two), one after another. Read
from each run's ``summary.json`` and ``model.pt``: parameters, forward FLOPs per sample (counted on the
final network rebuilt with :func:`scaletrain.load_model`), test accuracy, and the training seconds
(the sum of the epochs' measured training time, evaluations left out) and wall seconds.

Goals (issue 11), for each ratio against the dense run: the pruned network has ≥ 40 % fewer
parameters and FLOPs, its test accuracy is at most 1.5 points lower, and its total training time is
lower (ratio < 1). The exit status is 0 when some ratio meets every goal.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/prunetrain.py [--epochs 10 --lr-decay 0.6
--lr-decay-start 5 --reconfigure-every 2 --lasso-ratio 0.4 --threads 2 --json out.json]`` (the
defaults). Each epoch of ResNet-20 over the 60,000 images takes about 95 s on this 2-core CPU: the
defaults take about 30 minutes, each further ratio about 13.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import scaletrain
from scaletrain.efficient.cost import flops_per_sample
from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run

GOALS = {"parameters": 0.40, "flops": 0.40, "accuracy_points": 1.5}


def train(name: str, args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One fresh training process; its figures."""
    flags = [
        *("-o", "dataset=fashion-mnist", "--epochs", str(args.epochs), "--batch-size", str(args.batch_size)),
        *("--lr", str(args.lr), "--momentum", "0.9", "--weight-decay", str(args.weight_decay)),
        *("--lr-decay", str(args.lr_decay), "--lr-decay-start", str(args.lr_decay_start)),
        *("--threads", str(args.threads), "--seed", str(args.seed), "--data-dir", str(data_dir), *extra),
        *("-o", f"train_samples={args.train_samples}", "--device", args.device),
    ]
    wall = train_run(args.workload, out, flags)
    records, summary = run_records(out)
    epochs = [r for r in records if r["kind"] == "epoch"]
    model = scaletrain.load_model(out)
    return {
        "parameters": summary["parameters"],
        "parameters_initial": summary["parameters_initial"],
        "flops_per_sample": flops_per_sample(model, torch.zeros(1, 1, 28, 28)),
        "device": summary.get("device"),
        "test_accuracy": summary["test_accuracy"],
        "train_seconds": sum(r["seconds"] for r in epochs),
        "wall_seconds": wall,
        "seconds_per_epoch": [round(r["seconds"], 1) for r in epochs],
        "parameters_per_epoch": [r["parameters"] for r in epochs],
        "accuracy_per_epoch": [round(r["test_accuracy"], 4) for r in epochs],
        "reconfigurations": [
            {k: r[k] for k in ("epoch", "parameters_before", "parameters", "blocks_removed", "quality_after")}
            for r in records
            if r["kind"] == "reconfiguration"
        ],
    }


def goals(dense: dict[str, Any], pruned: dict[str, Any]) -> dict[str, bool]:
    """Issue 11's goals for one PruneTrain run against the dense one: each line and whether it holds."""
    fewer_parameters = 1 - pruned["parameters"] / dense["parameters"]
    fewer_flops = 1 - pruned["flops_per_sample"] / dense["flops_per_sample"]
    accuracy_drop = 100 * (dense["test_accuracy"] - pruned["test_accuracy"])
    time_ratio = pruned["train_seconds"] / dense["train_seconds"]
    wall_ratio = pruned["wall_seconds"] / dense["wall_seconds"]
    return {
        f"parameters −{100 * fewer_parameters:.1f} % (goal ≥ 40 %)": fewer_parameters >= GOALS["parameters"],
        f"FLOPs −{100 * fewer_flops:.1f} % (goal ≥ 40 %)": fewer_flops >= GOALS["flops"],
        f"accuracy {-accuracy_drop:+.2f} points (goal ≥ −1.5)": accuracy_drop <= GOALS["accuracy_points"],
        f"training time ratio {time_ratio:.3f}, wall {wall_ratio:.3f} (goal < 1)": time_ratio < 1,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet20", help="a ResNet of ≥ 20 layers (default resnet20)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--lr-decay", type=float, default=0.6, help="multiply the rate by this every epoch after")
    parser.add_argument("--lr-decay-start", type=int, default=5, help="epochs at the full rate")
    parser.add_argument(
        "--lasso-ratio", type=float, nargs="+", default=[0.4], help="one PruneTrain run per ratio, each against dense"
    )
    parser.add_argument("--prune-threshold", type=float, default=1e-4)
    parser.add_argument("--reconfigure-every", type=int, default=2)
    parser.add_argument("--train-samples", type=int, default=0, help="train on the first N images only (0: all)")
    parser.add_argument("--device", default="auto", help="where the runs train (auto, cpu, cuda)")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    print(
        f"{args.workload} on Fashion-MNIST ({data_dir}): {args.epochs} epochs, batch {args.batch_size}, lr {args.lr} "
        f"(×{args.lr_decay} per epoch after {args.lr_decay_start}), weight decay {args.weight_decay}, "
        f"{args.threads} threads; PruneTrain: lasso ratios {args.lasso_ratio}, threshold {args.prune_threshold}, "
        f"every {args.reconfigure_every} epochs",
        flush=True,
    )
    variants = {"dense": []} | {
        f"prunetrain r={ratio:g}": [
            *("--technique", "prunetrain", "--lasso-ratio", str(ratio), "--prune-threshold", str(args.prune_threshold)),
            *("--reconfigure-every", str(args.reconfigure_every)),
        ]
        for ratio in args.lasso_ratio
    }
    runs = {}
    with tempfile.TemporaryDirectory(prefix="st-prunetrain-") as folder:
        for name, extra in variants.items():
            runs[name] = train(name, args, data_dir, Path(folder) / name.replace(" ", "-"), extra)
            print(f"  {name}: {json.dumps(runs[name])}", flush=True)
    print(f"\n{'':<18} {'parameters':>11} {'MFLOPs/sample':>14} {'test acc':>9} {'train s':>8} {'wall s':>7}")
    for name, run in runs.items():
        print(
            f"{name:<18} {run['parameters']:>11,} {run['flops_per_sample'] / 1e6:>14.2f} {run['test_accuracy']:>9.4f} "
            f"{run['train_seconds']:>8.0f} {run['wall_seconds']:>7.0f}"
        )
    checks = {name: goals(runs["dense"], run) for name, run in runs.items() if name != "dense"}
    for name, verdicts in checks.items():
        print(f"\n{name} against dense:")
        for text, passed in verdicts.items():
            print(f"  {'PASS' if passed else 'FAIL'}: {text}")
    met = [name for name, verdicts in checks.items() if all(verdicts.values())]
    print(f"\nevery goal met by: {', '.join(met) if met else 'none of the ratios'}")
    return finish(args, {"runs": runs, "checks": checks}, bool(met))


if __name__ == "__main__":
    raise SystemExit(main())
