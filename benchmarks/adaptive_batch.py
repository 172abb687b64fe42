"""Batch adaptation after pruning on the real Fashion-MNIST: PruneTrain with and without ``--batch-budget``.

Two fresh ``scaletrain train`` processes, one after another, train ResNet-20 on the first
``--train-samples`` Fashion-MNIST images with PruneTrain (a strong lasso ratio, so that the network
shrinks within the run) from the same seed, batch and rate: once with a fixed batch, once with
``--batch-budget``, which after the first epoch and after every reconfiguration searches (on real
steps, in forked copies of the training process) the largest batch whose step's peak resident memory
fits the budget, scaling the rate linearly with a warm-up. Read from each run: the epochs' training
seconds, parameters and batch, and every search's batch and measured peak against the budget.

Goals (issue 14): every search's chosen batch peaks within 10 % under the budget (0.9 ≤ peak /
budget ≤ 1) while the network shrinks; the time per epoch of both runs side by side.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/adaptive_batch.py [--budget 1.6GB --epochs 6
--train-samples 12800 --batch-size 64 --lasso-ratio 0.8 --threads 2 --json out.json]`` (the defaults;
about 8 minutes on this 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from scaletrain.efficient.adaptive_batch import parse_bytes
from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run

WITHIN = 0.10


def train(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    flags = [
        *("-o", "dataset=fashion-mnist", "-o", f"train_samples={args.train_samples}"),
        *("--epochs", str(args.epochs), "--batch-size", str(args.batch_size), "--lr", str(args.lr)),
        *("--momentum", "0.9", "--weight-decay", "1e-4", "--threads", str(args.threads), "--seed", str(args.seed)),
        *("--technique", "prunetrain", "--lasso-ratio", str(args.lasso_ratio), "--reconfigure-every", "1"),
        *("--data-dir", str(data_dir), "--device", args.device, *extra),
    ]
    wall = train_run("resnet20", out, flags)
    records, summary = run_records(out)
    epochs = [r for r in records if r["kind"] == "epoch"]
    batches = {segment["epoch"]: segment["batch_size"] for segment in summary["batch_schedule"] or []}
    batch, per_epoch = args.batch_size, []
    for record in epochs:
        batch = batches.get(record["epoch"], batch)
        per_epoch.append(batch)
    return {
        "wall_seconds": wall,
        "train_seconds": sum(r["seconds"] for r in epochs),
        "seconds_per_epoch": [round(r["seconds"], 1) for r in epochs],
        "parameters_per_epoch": [r["parameters"] for r in epochs],
        "batch_per_epoch": per_epoch,
        "test_accuracy": summary["test_accuracy"],
        "device": summary.get("device"),
        "searches": [
            {k: s[k] for k in ("epoch", "parameters", "batch_size", "peak_bytes", "budget_bytes", "probes")}
            for s in summary["batch_searches"] or []
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", default="1.6GB", help="--batch-budget of the adapting run")
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--train-samples", type=int, default=12800)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lasso-ratio", type=float, default=0.8)
    parser.add_argument("--warmup", type=int, default=20, help="--batch-warmup (updates)")
    parser.add_argument("--device", default="auto", help="where the runs train (auto, cpu, cuda)")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    budget = parse_bytes(args.budget)
    print(
        f"ResNet-20, first {args.train_samples} Fashion-MNIST images ({data_dir}), PruneTrain r={args.lasso_ratio} "
        f"every epoch, {args.epochs} epochs, batch {args.batch_size}, lr {args.lr}, {args.threads} threads; "
        f"budget {budget:,} bytes",
        flush=True,
    )
    variants = {
        "fixed batch": [],
        "--batch-budget": ["--batch-budget", args.budget, "--batch-warmup", str(args.warmup)],
    }
    runs = {}
    with tempfile.TemporaryDirectory(prefix="st-adapt-") as folder:
        for name, extra in variants.items():
            runs[name] = train(args, data_dir, Path(folder) / name.strip("-").replace(" ", "-"), extra)
            print(f"  {name}: {json.dumps(runs[name])}", flush=True)
    print(f"\n{'epoch':>5}  " + "  ".join(f"{name + ': s, batch, parameters':>42}" for name in runs))
    for epoch in range(args.epochs):
        cells = []
        for run in runs.values():
            cells.append(
                f"{run['seconds_per_epoch'][epoch]:>10.1f} {run['batch_per_epoch'][epoch]:>8} "
                f"{run['parameters_per_epoch'][epoch]:>22,}"
            )
        print(f"{epoch + 1:>5}  " + "  ".join(f"{cell:>42}" for cell in cells))
    for name, run in runs.items():
        print(f"{name}: training {run['train_seconds']:.0f} s, wall {run['wall_seconds']:.0f} s, "
              f"test accuracy {run['test_accuracy']:.4f}")  # fmt: skip
    searches = runs["--batch-budget"]["searches"]
    verdicts = []
    print("\nsearches (after epoch: parameters → batch, its measured peak against the budget):")
    for search in searches:
        ratio = search["peak_bytes"] / search["budget_bytes"]
        passed = 1 - WITHIN <= ratio <= 1
        verdicts.append(passed)
        print(
            f"  epoch {search['epoch'] + 1}: {search['parameters']:,} parameters → batch {search['batch_size']}, peak "
            f"{search['peak_bytes']:,} B = {ratio:.3f} of the budget ({len(search['probes'])} trial steps): "
            f"{'PASS' if passed else 'FAIL'}"
        )
    met = bool(verdicts) and all(verdicts)
    print(f"\n{'PASS' if met else 'FAIL'}: every search's peak within {WITHIN:.0%} under the budget")
    return finish(args, {"runs": runs, "met": met}, met)


if __name__ == "__main__":
    raise SystemExit(main())
