"""What ``--sync-batchnorm`` costs per step: ResNet-20 on 2 all-reduce workers splitting each batch, with and
without synchronised batch norm, measured side by side.

Each run is a fresh ``scaletrain train resnet20 -o dataset=fashion-mnist --workers 2 --strategy
allreduce-split --steps N`` process tree; the two settings alternate (plain first in odd repeats,
synchronised first in even ones, so that a linear drift of the machine's speed cancels). A run's step time
is its summary's seconds per step (the slower worker's measured steps, warm-up left out; each step
includes its gradient all-reduce). These machines are shared and noisy, so the medians over the repeats
are reported, and their ratio: the cost of ResNet-20's 21 batch norms × 2 all-reduces per step (a
forward one of 2C+1 numbers and a backward one of 2C).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/sync_batchnorm.py [--repeats 5 --steps 40
--batch-size 64 --threads 1 --json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from training_runs import add_run_flags, fashion_mnist, finish, train_run

SETTINGS = {"plain": [], "sync-batchnorm": ["--sync-batchnorm"]}


def step_seconds(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> float:
    """One 2-worker run's mean seconds per measured step."""
    flags = [
        *("-o", "dataset=fashion-mnist", "--workers", "2", "--strategy", "allreduce-split"),
        *("--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", str(args.threads)),
        *("--seed", str(args.seed), "--data-dir", str(data_dir), "--warmup-steps", "5", *extra),
    ]
    train_run("resnet20", out, flags, timeout=3600)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    return 1.0 / summary["batches_per_second"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch (split over the 2 workers)")
    add_run_flags(parser)
    parser.set_defaults(threads=1)
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    print(
        f"resnet20 on Fashion-MNIST, 2 workers allreduce-split, batch {args.batch_size} ({args.batch_size // 2} per "
        f"worker), {args.steps} steps (5 warm-up), {args.threads} thread(s) per worker, {args.repeats} repeats",
        flush=True,
    )
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    folder = Path(tempfile.mkdtemp(prefix="st-sync-batchnorm-"))
    for repeat in range(args.repeats):
        order = list(SETTINGS) if repeat % 2 == 0 else list(reversed(SETTINGS))
        for name in order:
            seconds = step_seconds(args, data_dir, folder / f"{name}-{repeat}", SETTINGS[name])
            times[name].append(seconds)
            print(f"  repeat {repeat + 1} {name:<15} {1000 * seconds:7.1f} ms per step", flush=True)
    medians = {name: statistics.median(values) for name, values in times.items()}
    ratio = medians["sync-batchnorm"] / medians["plain"]
    for name, median in medians.items():
        print(f"{name:<15} median {1000 * median:7.1f} ms per step")
    print(f"ratio (sync-batchnorm / plain): {ratio:.3f}")
    return finish(args, {"seconds_per_step": times, "medians": medians, "ratio": ratio}, True)


if __name__ == "__main__":
    raise SystemExit(main())
