"""``scaletrain train WORKLOAD``: one training run; flags override ``--config`` which overrides defaults."""

from __future__ import annotations

import argparse
import os
from dataclasses import fields
from pathlib import Path

from scaletrain.api import train
from scaletrain.config import PROGRESS_MODES, TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.rendezvous import ENV_RANK
from scaletrain.parallel.worker import exit_now
from scaletrain.workloads import WORKLOADS

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a workload",
        description="Train a workload. Precedence: workload defaults < --config FILE < flags.",
        # Every flag defaults to None so that only the flags actually given override the config file.
        argument_default=None,
    )
    parser.add_argument("workload", choices=sorted(WORKLOADS), help="what to train (see `scaletrain workloads`)")
    parser.add_argument("--config", type=Path, help="TOML file with any of the settings below")
    parser.add_argument("--epochs", type=int, help="epochs to train")
    parser.add_argument("--steps", type=int, help="stop after this many optimizer steps in total")
    parser.add_argument("--batch-size", type=int, help="samples per batch (rows of words for ptb-lstm)")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--momentum", type=float, help="SGD momentum (0 = plain SGD)")
    parser.add_argument("--weight-decay", type=float, help="L2 weight decay")
    parser.add_argument("--clip-norm", type=float, help="clip the gradient norm to this (0 = off)")
    parser.add_argument("--lr-decay", type=float, help="multiply the rate by this every epoch after --lr-decay-start")
    parser.add_argument("--lr-decay-start", type=int, help="epochs trained at the full rate before decaying")
    parser.add_argument("--seed", type=int, help="random seed (same seed and settings ⇒ identical weights)")
    parser.add_argument("--threads", type=int, help="torch threads")
    parser.add_argument("--data-dir", type=Path, help="folder with the dataset files")
    parser.add_argument("--out", type=Path, help="output folder (default: runs/WORKLOAD-DATE-TIME)")
    parser.add_argument("--resume", action="store_true", default=None, help="continue from OUT/checkpoint.pt")
    parser.add_argument("--log-every", type=int, help="steps between metrics.jsonl records")
    parser.add_argument("--checkpoint-every", type=int, help="steps between checkpoints (also at each epoch end)")
    parser.add_argument("--warmup-steps", type=int, help="first steps left out of the throughput")
    parser.add_argument("--progress", choices=PROGRESS_MODES, help="progress display (auto: bar on a terminal)")
    parser.add_argument(
        "--no-tensorboard",
        dest="tensorboard",
        action="store_false",
        default=None,
        help="write no TensorBoard events",
    )
    parser.add_argument(
        "--no-download", dest="download", action="store_false", default=None, help="never download datasets"
    )
    group = parser.add_argument_group("distributed training")
    group.add_argument("--workers", type=int, help="worker processes (default 1)")
    group.add_argument(
        "--strategy",
        choices=("local", "allreduce", "ps"),
        help="local (1 worker), allreduce (default for >1), ps",
    )
    group.add_argument("--server", choices=("central", "sharded", "distributed"), help="parameter server type")
    group.add_argument("--sync", choices=("join", "split", "async", "none"), help="update mode (default join)")
    group.add_argument(
        "--ps-admission",
        choices=("none", "exclusive"),
        help="exclusive: one transfer at a time per direction",
    )
    group.add_argument("--async-lr", choices=("constant", "staleness"), help="staleness: lr / staleness")
    group.add_argument("--timeout", type=float, help="seconds any wait for another process may take (default 60)")
    group.add_argument("--network", help="emulate a cluster network of this rate, e.g. 100mbit (local, root)")
    group.add_argument("--nodefile", type=Path, help="file with one host:port per process (rank 0 first)")
    group.add_argument("--index", type=int, help="this process's line in --nodefile (its rank)")
    parser.add_argument(
        "-o",
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="workload option, e.g. -o num_steps=35 -o train_split=valid for ptb-lstm",
    )
    parser.set_defaults(handler=run)


def parse_options(pairs: list[str]) -> dict[str, str]:
    """``["a=1", "b=x"]`` → ``{"a": "1", "b": "x"}``."""
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"workload option {pair!r} must look like KEY=VALUE, e.g. -o num_steps=35")
        options[key.strip()] = value.strip()
    return options


def run(args: argparse.Namespace) -> int:
    # Every flag named like a TrainConfig field is a setting; None means "not given".
    settings = {
        f.name: getattr(args, f.name)
        for f in fields(TrainConfig)
        if f.name not in ("workload", "options") and hasattr(args, f.name)
    }
    options = parse_options(args.option)
    summary = train(args.workload, config_file=args.config, options=options or None, **settings)
    if "metric" not in summary:  # a non-zero rank of a job started by another launcher
        print(f"rank {summary['rank']} finished; rank 0 writes the summary to {summary['out']}")
        exit_now(0)
    metric = summary["metric"]
    rate = summary["batches_per_second"]
    print(
        f"{summary['workload']}: {metric} {summary[metric]:.4f} after {summary['steps']} steps "
        f"({summary['epochs']:.2f} epochs), "
        + (f"{rate:.1f} batches/s, " if rate else "")
        + f"outputs in {summary['out']}"
    )
    if args.nodefile is not None or ENV_RANK in os.environ:
        exit_now(0)  # this process was a member of a process group started elsewhere
    return 0
