"""Net2Net on the real Fashion-MNIST: a narrow ResNet widened mid-training against the wide one from scratch.

Fresh ``scaletrain train`` processes train ResNet-20 with the same seed, batch, learning-rate schedule
and number of epochs, one after another: the wide network (``-o width=16``, 272,186 parameters) from
scratch, and the narrow one (``-o width=8``, 68,642 parameters) that ``--technique net2net -T
plan=K:wider-all:2`` widens after epoch K to exactly the wide network's shape (every group of
channels doubled, the function unchanged) and trains on. Each epoch record gives the test accuracy
and the training seconds (evaluations left out), so the table shows, per run, when (in cumulative
training seconds) the test accuracy first reached the wide run's final accuracy. The widened run may
train longer (``--grown-epochs``, default two more epochs, the rate decaying on): its narrow epochs
are cheap, and the question is the time to the accuracy, not the epochs.

Goal (issue 14): the widened run reaches the wide network's accuracy in fewer total seconds than the
wide one from scratch; or, if it does not, the figures say by how much it misses. The exit status is
0 when the goal is met.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/net2net.py [--epochs 6 --widen-after 3 --lr-decay 0.6
--lr-decay-start 3 --threads 2 --json out.json]`` (the defaults; about 20 minutes on this 2-core CPU).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run


def train(args: argparse.Namespace, data_dir: Path, out: Path, epochs: int, extra: list[str]) -> dict[str, Any]:
    """One fresh training process; its epoch-by-epoch figures."""
    flags = [
        *("-o", "dataset=fashion-mnist", "--epochs", str(epochs), "--batch-size", str(args.batch_size)),
        *("--lr", str(args.lr), "--momentum", "0.9", "--weight-decay", str(args.weight_decay)),
        *("--lr-decay", str(args.lr_decay), "--lr-decay-start", str(args.lr_decay_start)),
        *("--threads", str(args.threads), "--seed", str(args.seed), "--data-dir", str(data_dir), *extra),
    ]
    wall = train_run("resnet20", out, flags)
    records, summary = run_records(out)
    epochs = [r for r in records if r["kind"] == "epoch"]
    cumulative, elapsed = [], 0.0
    for record in epochs:
        elapsed += record["seconds"]
        cumulative.append(round(elapsed, 1))
    return {
        "parameters": summary["parameters"],
        "parameters_initial": summary["parameters_initial"],
        "test_accuracy": summary["test_accuracy"],
        "train_seconds": elapsed,
        "wall_seconds": wall,
        "accuracy_per_epoch": [round(r["test_accuracy"], 4) for r in epochs],
        "cumulative_seconds": cumulative,
        "parameters_per_epoch": [r["parameters"] for r in epochs],
        "changes": [
            {k: r[k] for k in ("epoch", "parameters_before", "parameters", "quality_before", "quality_after")}
            for r in records
            if r["kind"] == "reconfiguration"
        ],
    }


def seconds_to_reach(run: dict[str, Any], accuracy: float) -> float | None:
    """Cumulative training seconds at the first epoch whose test accuracy is at least ``accuracy``."""
    for seconds, reached in zip(run["cumulative_seconds"], run["accuracy_per_epoch"], strict=True):
        if reached >= accuracy:
            return seconds
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--widen-after", type=int, default=3, help="the narrow run is widened after this epoch")
    parser.add_argument(
        "--grown-epochs", type=int, help="epochs of the widened run (default: --epochs + 2; its first are cheap)"
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--weight-decay", type=float, default=1e-4)
    parser.add_argument("--lr-decay", type=float, default=0.6, help="multiply the rate by this every epoch after")
    parser.add_argument("--lr-decay-start", type=int, default=3, help="epochs at the full rate")
    add_run_flags(parser)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    print(
        f"ResNet-20 on Fashion-MNIST ({data_dir}): {args.epochs} epochs, batch {args.batch_size}, lr {args.lr} "
        f"(×{args.lr_decay} per epoch after {args.lr_decay_start}), weight decay {args.weight_decay}, "
        f"{args.threads} threads; widened ×2 after epoch {args.widen_after}",
        flush=True,
    )
    grown_epochs = args.grown_epochs or args.epochs + 2
    variants = {
        "wide from scratch": (args.epochs, ["-o", "width=16"]),
        "narrow, widened": (
            grown_epochs,
            ["-o", "width=8", "--technique", "net2net", "-T", f"plan={args.widen_after}:wider-all:2"],
        ),
    }
    runs = {}
    with tempfile.TemporaryDirectory(prefix="st-net2net-") as folder:
        for name, (epochs, extra) in variants.items():
            out = Path(folder) / name.replace(" ", "-").replace(",", "")
            runs[name] = train(args, data_dir, out, epochs, extra)
            print(f"  {name}: {json.dumps(runs[name])}", flush=True)
    wide, grown = runs["wide from scratch"], runs["narrow, widened"]
    target = wide["test_accuracy"]
    print(f"\n{'':<18} {'parameters':>11} {'final acc':>10} {'train s':>8} {'wall s':>7}  s to reach {target:.4f}")
    for name, run in runs.items():
        reach = seconds_to_reach(run, target)
        print(
            f"{name:<18} {run['parameters']:>11,} {run['test_accuracy']:>10.4f} {run['train_seconds']:>8.0f} "
            f"{run['wall_seconds']:>7.0f}  {'never' if reach is None else f'{reach:.0f}'}"
        )
    for name, run in runs.items():
        history = zip(run["accuracy_per_epoch"], run["cumulative_seconds"], strict=True)
        pairs = ", ".join(f"{accuracy:.4f}@{seconds:.0f}s" for accuracy, seconds in history)
        print(f"  {name}: accuracy @ cumulative training seconds per epoch: {pairs}")
    for change in grown["changes"]:
        before, after = change["quality_before"]["test_accuracy"], change["quality_after"]["test_accuracy"]
        print(
            f"  widened after epoch {change['epoch'] + 1}: {change['parameters_before']:,} → {change['parameters']:,}"
            f" parameters, test accuracy {before:.4f} before and {after:.4f} after (the function is kept)"
        )
    wide_time, grown_time = seconds_to_reach(wide, target), seconds_to_reach(grown, target)
    met = grown_time is not None and wide_time is not None and grown_time < wide_time
    if grown_time is None:
        gap = 100 * (target - grown["test_accuracy"])
        verdict = f"FAIL: the widened run ended {gap:.2f} points below the wide run's {target:.4f}"
    else:
        verdict = (
            f"{'PASS' if met else 'FAIL'}: reached {target:.4f} after {grown_time:.0f} s against {wide_time:.0f} s"
        )
    print(f"\n{verdict} (goal: fewer seconds to the wide network's accuracy)")
    return finish(args, {"runs": runs, "met": met}, met)


if __name__ == "__main__":
    raise SystemExit(main())
