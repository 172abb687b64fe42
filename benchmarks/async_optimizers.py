"""Asynchronous AdamW beside asynchronous SGD: the test accuracy of 4 asynchronous workers (central and sharded
servers) against one process with the same optimizer, LeNet on the real Fashion-MNIST.

Fresh ``scaletrain train`` processes, one after the other: for each optimizer one process, then 4 asynchronous
workers with each server kind, all with the defaults (``--async-batches split``, ``--async-compensation
momentum``: for AdamW the server lowers β1 as it lowers SGD's momentum). SGD: the workload's rate and momentum;
AdamW: lr 1e-3, betas 0.9, 0.999, weight decay 0.01 (torch's defaults). Read from each run's ``summary.json``.

Goal: every asynchronous run ends within 10 % of its optimizer's one-process accuracy.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/async_optimizers.py [--epochs 1 --json out.json]``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run

WITHIN = 0.10
OPTIMIZERS = {"sgd": [], "adamw": ["--optimizer", "adamw", "--lr", "1e-3"]}
LAYOUTS = {
    "one process": [],
    "4 async, central": ["--workers", "4", "--strategy", "ps-central-async"],
    "4 async, sharded": ["--workers", "4", "--strategy", "ps-sharded-async"],
}


def train(args: argparse.Namespace, out: Path, flags: list[str]) -> dict[str, Any]:
    common = ["--epochs", str(args.epochs), "--threads", "1", "--seed", str(args.seed), "--data-dir", str(args.data)]
    wall = train_run("lenet", out, [*common, *flags])
    _, summary = run_records(out)
    compensation = summary.get("async_compensation") or {}
    return {
        "accuracy": summary["test_accuracy"],
        "explicit_momentum": compensation.get("mean_explicit_momentum"),
        "wall_seconds": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    add_run_flags(parser)
    args = parser.parse_args()
    args.data = fashion_mnist(parser, args.data_dir)
    results: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="async-optimizers-") as folder:
        for optimizer, flags in OPTIMIZERS.items():
            results[optimizer] = {
                layout: train(args, Path(folder) / f"{optimizer}-{index}", [*flags, *extra])
                for index, (layout, extra) in enumerate(LAYOUTS.items())
            }
    met = True
    print(f"{'optimizer':9} {'layout':18} {'test accuracy':>13} {'÷ one process':>13} {'mean β1/momentum':>16}")
    for optimizer, rows in results.items():
        alone = rows["one process"]["accuracy"]
        for layout, row in rows.items():
            ratio = row["accuracy"] / alone
            met &= ratio >= 1 - WITHIN
            momentum = "" if row["explicit_momentum"] is None else f"{row['explicit_momentum']:.3f}"
            print(f"{optimizer:9} {layout:18} {row['accuracy']:13.4f} {ratio:13.3f} {momentum:>16}")
    print(
        f"goal: every asynchronous run within {WITHIN:.0%} of its one-process accuracy: {'met' if met else 'not met'}"
    )
    return finish(args, {"results": results}, met)


if __name__ == "__main__":
    raise SystemExit(main())
