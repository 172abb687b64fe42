"""MorphNet on the real Fashion-MNIST: a run that ends on a FLOPs target, its accuracy against the dense network.

Fresh ``scaletrain train`` processes, one after another, train ResNet-20 on the first
``--train-samples`` Fashion-MNIST images from the same seed, batch and rate: dense, and with
``--technique morphnet`` (``--rounds`` rounds of ``--every`` epochs each: the FLOPs-weighted penalty
on the batch norms, then the dead channels removed and every group widened by one multiplier back to
``--target`` times the dense network's FLOPs). Read from each run: FLOPs per sample of the final
network (rebuilt with ``scaletrain.load_model``), parameters, channels per layer, test accuracy and
training seconds.

Goal (issue 14): the MorphNet network's FLOPs within 5 % of the target at the end; its accuracy is
stated against the dense network's (no goal). The exit status is 0 when the FLOPs goal is met.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/morphnet.py [--target 0.5 --strength 0.02 --every 3
--rounds 1 --epochs 8 --train-samples 12800 --threads 2 --json out.json]`` (the defaults; about 8 minutes here).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

import torch

import scaletrain
from scaletrain.efficient.cost import channels_per_layer, flops_per_sample
from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run

WITHIN = 0.05


def train(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    flags = [
        *("-o", "dataset=fashion-mnist", "-o", f"train_samples={args.train_samples}"),
        *("--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr)),
        *("--momentum", "0.9", "--weight-decay", "1e-4", "--lr-decay", "0.7", "--lr-decay-start", str(args.every)),
        *("--threads", str(args.threads), "--seed", str(args.seed), "--data-dir", str(data_dir), *extra),
    ]
    wall = train_run("resnet20", out, flags)
    records, summary = run_records(out)
    model = scaletrain.load_model(out)
    return {
        "flops_per_sample": flops_per_sample(model, torch.zeros(1, 1, 28, 28)),
        "parameters": summary["parameters"],
        "channels": channels_per_layer(model),
        "test_accuracy": summary["test_accuracy"],
        "train_seconds": sum(r["seconds"] for r in records if r["kind"] == "epoch"),
        "wall_seconds": wall,
        "accuracy_per_epoch": [round(r["test_accuracy"], 4) for r in records if r["kind"] == "epoch"],
        "changes": [
            {
                k: r[k]
                for k in ("epoch", "flops_per_sample_before", "flops_per_sample", "quality_before", "quality_after")
            }
            for r in records
            if r["kind"] == "reconfiguration"
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.5, help="FLOPs after each expansion, × the dense network's")
    parser.add_argument("--strength", type=float, default=0.02)
    parser.add_argument("--threshold", type=float, default=1e-3)
    parser.add_argument("--every", type=int, default=3, help="epochs per round")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--train-samples", type=int, default=12800)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    add_run_flags(parser)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    morph = [f"target={args.target}", f"strength={args.strength}", f"threshold={args.threshold}"]
    morph += [f"every={args.every}", f"rounds={args.rounds}"]
    print(
        f"ResNet-20, first {args.train_samples} Fashion-MNIST images ({data_dir}), {args.epochs} epochs, batch "
        f"{args.batch_size}, lr {args.lr} (×0.7 per epoch after {args.every}), {args.threads} threads; "
        f"morphnet {' '.join(morph)}",
        flush=True,
    )
    variants = {"dense": [], "morphnet": ["--technique", "morphnet", *(f for o in morph for f in ("-T", o))]}
    runs = {}
    with tempfile.TemporaryDirectory(prefix="st-morphnet-") as folder:
        for name, extra in variants.items():
            runs[name] = train(args, data_dir, Path(folder) / name, extra)
            print(f"  {name}: {json.dumps(runs[name])}", flush=True)
    dense, morph_run = runs["dense"], runs["morphnet"]
    target = args.target * dense["flops_per_sample"]
    print(f"\n{'':<10} {'MFLOPs/sample':>14} {'parameters':>11} {'test acc':>9} {'train s':>8}")
    for name, run in runs.items():
        print(
            f"{name:<10} {run['flops_per_sample'] / 1e6:>14.3f} {run['parameters']:>11,} {run['test_accuracy']:>9.4f} "
            f"{run['train_seconds']:>8.0f}"
        )
    print("channels per layer, dense → morphnet:")
    for layer, width in dense["channels"].items():
        print(f"  {layer:<28} {width:>4} → {morph_run['channels'].get(layer, 'gone')}")
    for change in morph_run["changes"]:
        before, after = change["quality_before"]["test_accuracy"], change["quality_after"]["test_accuracy"]
        print(
            f"  after epoch {change['epoch'] + 1}: {change['flops_per_sample_before'] / 1e6:.3f} → "
            f"{change['flops_per_sample'] / 1e6:.3f} MFLOPs, test accuracy {before:.4f} → {after:.4f}"
        )
    off = morph_run["flops_per_sample"] / target - 1
    met = abs(off) <= WITHIN
    points = 100 * (morph_run["test_accuracy"] - dense["test_accuracy"])
    print(
        f"\n{'PASS' if met else 'FAIL'}: FLOPs {morph_run['flops_per_sample'] / 1e6:.3f} M against the target "
        f"{target / 1e6:.3f} M ({off:+.1%}; goal within {WITHIN:.0%}); accuracy {morph_run['test_accuracy']:.4f} "
        f"against dense {dense['test_accuracy']:.4f} ({points:+.2f} points)"
    )
    return finish(args, {"runs": runs, "met": met}, met)


if __name__ == "__main__":
    raise SystemExit(main())
