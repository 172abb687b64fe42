"""``scaletrain bench WORKLOAD``: sweep workers × strategies × batch sizes; results, pictures, report.

Progress (a line as each run starts and one with its figures as it ends) goes to stderr; the table
of medians, the reading and the report's path go to stdout at the end.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from scaletrain.api import bench
from scaletrain.cli.arguments import name_list, number_list, workload_argument, workloads_offered
from scaletrain.cli.registry_flags import add_technique_flags, technique_settings
from scaletrain.cli.train import add_device_flags, add_model_flags, workload_options
from scaletrain.engines.registry import FRAMEWORKS
from scaletrain.errors import ConfigError
from scaletrain.measure.presets import PRESETS
from scaletrain.parallel.strategies.ps.options import ASYNC_BATCHES
from scaletrain.parallel.strategies.ps.staleness import COMPENSATIONS

__all__ = ["add_parser", "run", "sweep_settings"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    presets = "; ".join(f"{name}: {preset.description}" for name, preset in PRESETS.items())
    parser = subparsers.add_parser(
        "bench",
        help="measure throughput and speedup over workers, strategies and batch sizes",
        description=(
            "Run real training runs over a grid and write results.csv, results.jsonl, throughput.png, "
            f"speedup.png, time.png, split.png and report.md. Presets — {presets}."
        ),
    )
    parser.add_argument(
        "workload",
        nargs="?",
        type=workload_argument,
        metavar="WORKLOAD",
        help=f"what to train (or give --preset): {workloads_offered()}",
    )
    parser.add_argument("--preset", choices=sorted(PRESETS), help="a sweep from the thesis (see above)")
    parser.add_argument("--quick", action="store_true", help="with --preset: 16 steps per run (2 of them warm-up)")
    parser.add_argument(
        "--workers", type=number_list, help="worker counts, e.g. 1,2,5,10 (default: 1,2, or the preset's)"
    )
    parser.add_argument(
        "--strategies",
        type=name_list,
        help="strategy specs: local, allreduce-join, allreduce-split, ps-central-join, ps-sharded-async, … "
        "(default: allreduce-join, or the preset's)",
    )
    parser.add_argument(
        "--framework",
        type=name_list,
        help=f"frameworks to run side by side: {', '.join(FRAMEWORKS)} (foreign engines: 'scaletrain engines "
        "install NAME' first; they run local, allreduce-join, ps-central-async and ps-sharded-async) "
        "(default: scaletrain)",
    )
    parser.add_argument("--batch-sizes", type=number_list, help="batch sizes (default: the workload's)")
    parser.add_argument(
        "--steps",
        type=int,
        help="optimizer steps per run, per worker for an asynchronous one (default: 100, or the preset's epochs)",
    )
    parser.add_argument("--epochs", type=int, help="epochs per run instead of --steps")
    parser.add_argument("--repeats", type=int, help="runs per configuration (default: 1)")
    parser.add_argument("--warmup-steps", type=int, help="first steps of each process not timed (default: 5)")
    parser.add_argument("--threads-per-worker", type=int, help="torch threads per process (default: 1)")
    parser.add_argument("--max-workers", type=int, help="leave out worker counts above this")
    parser.add_argument("--network", help="emulated network rate for every link, e.g. 1gbit, 100mbit (root)")
    parser.add_argument(
        "--lr", type=float, help="learning rate for every run (default: the preset's or the workload's)"
    )
    parser.add_argument(
        "--momentum", type=float, help="SGD momentum for every run (default: the preset's or the workload's)"
    )
    parser.add_argument(
        "--async-compensation",
        choices=COMPENSATIONS,
        help="async runs: momentum (default), lr, delay or none; see scaletrain train --help",
    )
    parser.add_argument(
        "--async-batches",
        choices=ASYNC_BATCHES,
        help="async runs: split (default; each update --batch-size / N) or share; see scaletrain train --help",
    )
    parser.add_argument("--data-dir", type=Path, help="folder with the dataset files")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="workload option")
    parser.add_argument("--out", type=Path, help="output folder (default: bench-results/WORKLOAD-DATE-TIME)")
    add_technique_flags(parser)
    add_device_flags(parser)
    add_model_flags(parser)
    parser.set_defaults(handler=run)


def sweep_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The grid and the runs' settings from the flags above, as :func:`scaletrain.api.bench` takes them."""
    return {
        "workers": args.workers,
        "strategies": args.strategies,
        "frameworks": args.framework,
        "batch_sizes": args.batch_sizes,
        "steps": args.steps,
        "epochs": args.epochs,
        "repeats": args.repeats,
        "warmup_steps": args.warmup_steps,
        "threads_per_worker": args.threads_per_worker,
        "max_workers": args.max_workers,
        "network": args.network,
        "data_dir": args.data_dir,
        "options": workload_options(args) or None,
        "settings": {
            key: value
            for key, value in (
                ("lr", args.lr),
                ("momentum", args.momentum),
                ("async_compensation", args.async_compensation),
                ("async_batches", args.async_batches),
                ("wire", args.wire),
                ("error_feedback", args.error_feedback),
                ("overlap", args.overlap),
                ("bucket_mb", args.bucket_mb),
                ("device", args.device),
                *technique_settings(args).items(),  # --precision, --memory-format, --ghost-batch … too
            )
            if value is not None
        }
        or None,
    }


def run(args: argparse.Namespace) -> int:
    if args.workload is None and args.preset is None:
        raise ConfigError("name a workload (e.g. scaletrain bench lenet) or a --preset")
    if args.quick and args.preset is None:
        raise ConfigError("--quick shortens a --preset; for a workload use --steps")
    result = bench(
        args.workload,
        progress=lambda line: print(line, file=sys.stderr, flush=True),
        preset=args.preset,
        quick=args.quick,
        out=args.out,
        **sweep_settings(args),
    )
    failed = sum(1 for row in result["rows"] if row.get("status") != "ok")
    if result["table"].count("\n"):  # a header and at least one configuration
        print(result["table"], end="\n\n")
    print("\n".join(line.replace("**", "") for line in result["reading"]), end="\n\n")
    minutes, seconds = divmod(round(result["seconds"]), 60)
    print(f"{len(result['rows'])} runs ({failed} failed) in {minutes} min {seconds:02d} s; report: {result['report']}")
    for note in result["notes"]:
        print(f"note: {note}")
    return 1 if failed == len(result["rows"]) else 0
