"""Asynchronous updates of whole batches (Downpour's ``--async-batches share``) against split ones (``split``, the
default): test perplexity and samples per second side by side, on the PTB LSTM of issue 31.

Fresh ``scaletrain train`` processes, the two modes alternating run by run (so a change in the machine's load
falls on both), each mode ``--repeats`` times: Zaremba's small LSTM (or ``--hidden`` units), plain SGD at lr 1.0,
clipping 5, batch 20, trained on ``ptb.valid.txt`` for ``--epochs``, on 3 asynchronous workers of one server kind.
One process at the same settings is the reference. Read from each run's ``summary.json``: the test perplexity
and ``samples_per_second`` (every worker's samples over the slowest worker's measured seconds).

Goal (issue 31): with the defaults the asynchronous perplexity ends within 10 % of one process's; the price of
split's N-times-as-many exchanges per sample is the ratio of the medians of samples per second.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/async_batches.py [--server central --repeats 2 --epochs 2
--hidden 200 --data-dir ../shared/datasets/ptb --json out.json]`` (about 8 minutes here with the defaults).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from training_runs import finish, run_records, train_run

WITHIN = 0.10


def train(args: argparse.Namespace, out: Path, extra: list[str]) -> dict[str, Any]:
    flags = [
        *("-o", "train_split=valid", "-o", f"hidden_size={args.hidden}", "--epochs", str(args.epochs)),
        *("--threads", "1", "--seed", str(args.seed), "--data-dir", str(args.data_dir), *extra),
    ]
    wall = train_run("ptb-lstm", out, flags)
    _, summary = run_records(out)
    return {
        "test_perplexity": summary["test_perplexity"],
        "samples_per_second": summary["samples_per_second"],
        "update_batch_size": summary.get("update_batch_size"),
        "wall_seconds": round(wall, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", choices=("central", "sharded"), default="central")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[2] / "shared/datasets/ptb")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.data_dir / "ptb.valid.txt").is_file():
        parser.error(f"no ptb.valid.txt in {args.data_dir}; give --data-dir with the Penn Treebank files")
    layout = ["--workers", "3", "--strategy", "ps", "--server", args.server, "--sync", "async"]
    runs: dict[str, list[dict[str, Any]]] = {"share": [], "split": []}
    with tempfile.TemporaryDirectory(prefix="async-batches-") as folder:
        one = train(args, Path(folder) / "one", [])
        for repeat in range(args.repeats):
            for mode in runs:
                runs[mode].append(train(args, Path(folder) / f"{mode}-{repeat}", [*layout, "--async-batches", mode]))
    median = {
        mode: {key: statistics.median(r[key] for r in rows) for key in ("test_perplexity", "samples_per_second")}
        for mode, rows in runs.items()
    }
    bound = (1 + WITHIN) * one["test_perplexity"]
    print(f"one process: perplexity {one['test_perplexity']:.1f}, {one['samples_per_second']:.0f} samples/s")
    for mode, rows in runs.items():
        figures = ", ".join(f"{r['test_perplexity']:.1f} at {r['samples_per_second']:.0f} samples/s" for r in rows)
        print(f"3 async workers, {args.server}, --async-batches {mode}: {figures}")
    ratio = median["split"]["samples_per_second"] / median["share"]["samples_per_second"]
    print(f"split / share samples per second (medians): {ratio:.2f}")
    met = median["split"]["test_perplexity"] <= bound
    print(f"goal: split's median perplexity ≤ {bound:.1f} (one process + 10 %): {'met' if met else 'not met'}")
    return finish(args, {"one": one, "runs": runs, "medians": median, "split_over_share": ratio}, met)


if __name__ == "__main__":
    raise SystemExit(main())
