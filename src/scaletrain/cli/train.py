"""``scaletrain train WORKLOAD``: one training run; flags override ``--config`` which overrides defaults."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import MISSING, fields
from pathlib import Path

from scaletrain.api import exit_now, runs_alone, train
from scaletrain.cli.arguments import workload_argument, workloads_offered
from scaletrain.cli.formatter import shown_default
from scaletrain.cli.registry_flags import (
    add_strategy_flags,
    add_technique_flags,
    parse_options,
    strategy_settings,
    technique_settings,
)
from scaletrain.cli.supervise import run_supervised
from scaletrain.config import LR_SCHEDULES, PROGRESS_MODES, TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.rendezvous import ENV_RANK
from scaletrain.parallel.strategies import STRATEGIES, all_specs
from scaletrain.tensors.codec import CODECS
from scaletrain.workloads import WORKLOADS
from scaletrain.workloads.base import WorkloadDefaults

__all__ = [
    "MODEL_FLAGS",
    "add_device_flags",
    "add_model_flags",
    "add_parser",
    "run",
    "workload_options",
]

#: Workload options that have a flag of their own: option name → flag.
MODEL_FLAGS = {"num_classes": "--num-classes", "image_size": "--image-size"}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a workload",
        description="Train a workload. Precedence: workload defaults < --config FILE < flags.",
        # Every flag defaults to None so that only the flags actually given override the config file.
        argument_default=None,
    )
    parser.add_argument(
        "workload",
        type=workload_argument,
        metavar="WORKLOAD",
        nargs="?",
        help=f"what to train: {workloads_offered()} (default: the --config file's workload key)",
    )
    parser.add_argument("--config", type=Path, metavar="FILE", help="TOML file with any of the settings below")
    parser.add_argument("--epochs", type=int, help="epochs to train")
    parser.add_argument(
        "--steps", type=int, help="stop after this many optimizer steps in all (default: --epochs decides)"
    )
    parser.add_argument("--batch-size", type=int, help="samples per batch (rows of words for ptb-lstm)")
    parser.add_argument("--lr", type=float, help="learning rate")
    parser.add_argument("--momentum", type=float, help="SGD momentum (0 = plain SGD)")
    parser.add_argument("--weight-decay", type=float, help="L2 weight decay")
    parser.add_argument("--clip-norm", type=float, help="clip the gradient norm to this (0 = off)")
    parser.add_argument(
        "--divergence",
        metavar="FACTOR|off",
        help="stop the run when its loss stays past FACTOR × its first steps' loss (docs/training.md); off: never",
    )
    parser.add_argument(
        "--optimizer",
        metavar="NAME",
        help="sgd, any torch.optim class by name (adamw, adam, rmsprop, …) or module:attribute of your own "
        "(default: the workload's: sgd, adamw for gpt)",
    )
    parser.add_argument(
        "-O",
        "--optimizer-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of --optimizer, e.g. -O betas=0.9,0.95 -O eps=1e-8 (--lr, --momentum, --weight-decay apart)",
    )
    parser.add_argument(
        "--lr-schedule",
        choices=LR_SCHEDULES,
        help="step: --lr-decay per epoch; per update: constant, cosine or linear decay to 0 over the run "
        "(default: the workload's: step, cosine for gpt)",
    )
    parser.add_argument("--lr-warmup", type=int, metavar="N", help="raise the rate linearly to --lr over N updates")
    parser.add_argument(
        "--accumulate",
        type=int,
        metavar="K",
        help="K micro-batches of --batch-size per update, their gradients summed and exchanged once (default: 1)",
    )
    parser.add_argument("--lr-decay", type=float, help="multiply the rate by this every epoch after --lr-decay-start")
    parser.add_argument("--lr-decay-start", type=int, help="epochs trained at the full rate before decaying")
    parser.add_argument("--seed", type=int, help="random seed (same seed and settings ⇒ identical weights)")
    parser.add_argument(
        "--threads", type=int, help="torch threads per process (default: the usable cores ÷ this run's processes here)"
    )
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
    parser.add_argument(
        "--loader-workers",
        type=int,
        metavar="N",
        help="worker processes that read the data of a workload made from torch datasets (0: the training "
        "process reads)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        default=None,
        help="run the training forward and backward under torch.compile (inductor; compiled again after a "
        "reconfiguration; evaluation stays eager)",
    )
    group = parser.add_argument_group("distributed training")
    group.add_argument("--workers", type=int, help="worker processes")
    group.add_argument(
        "--strategy",
        choices=strategy_choices(),
        metavar="STRATEGY",
        help=f"{', '.join(STRATEGIES)} (default: local for 1 worker, else allreduce), or a whole spec as the bench "
        f"names it: {', '.join(all_specs()[1:])}",
    )
    servers = sorted({server for s in STRATEGIES.values() for server in s.servers} | {"distributed"})
    syncs = sorted({sync for s in STRATEGIES.values() for sync in s.syncs} | {"none"})
    group.add_argument("--server", choices=servers, help="parameter server type")
    group.add_argument("--sync", choices=syncs, help="update mode")
    add_strategy_flags(group)
    group.add_argument("--timeout", type=float, help="seconds any wait for another process may take")
    group.add_argument(
        "--min-workers",
        type=int,
        metavar="M",
        help="all-reduce or the central server (join, split): a lost worker does not stop the run; the survivors "
        "go on while at least M remain",
    )
    group.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="with --min-workers: the most workers the run admits, started later with --join (default: --workers)",
    )
    group.add_argument(
        "--join",
        action="store_true",
        default=None,
        help="join the running elastic run of --out (or of MASTER_ADDR:MASTER_PORT) as one more worker, at its "
        "next step boundary; give the run's own settings",
    )
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
    add_technique_flags(parser)
    add_device_flags(parser)
    add_model_flags(parser)
    _name_config_defaults(parser)
    parser.set_defaults(handler=run)


def add_device_flags(parser: argparse.ArgumentParser) -> None:
    """``--wire``, ``--device`` and ``--error-feedback`` (flags default to None: a config file may set them)."""
    group = parser.add_argument_group("wire and device (scaletrain.tensors.codec, scaletrain.tensors.device)")
    group.add_argument(
        "--wire", choices=sorted(CODECS), help="what gradients (and a parameter server's weights) travel as"
    )
    group.add_argument(
        "-W",
        "--wire-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="wire codec option, e.g. -W rank=2 -W start=50 for powersgd, -W ratio=0.01 for topk",
    )
    group.add_argument(
        "--device",
        metavar="auto|cpu|cuda|cuda:K",
        help="where workers compute (auto: the process's GPU when torch sees one — cuda:LOCAL_RANK under a "
        "launcher — else the CPU; a parameter server process always uses the CPU)",
    )
    group.add_argument(
        "--error-feedback",
        action="store_true",
        default=None,
        help="add what each gradient message lost to the next one (with --wire bf16, fp16, powersgd, topk)",
    )
    group.add_argument(
        "--overlap",
        action="store_true",
        default=None,
        help="all-reduce buckets of gradients while backward computes the rest (all-reduce only)",
    )
    group.add_argument(
        "--bucket-mb",
        type=float,
        metavar="MIB",
        help="with --overlap: gradient per bucket, in MiB (default 0.25)",
    )


def strategy_choices() -> list[str]:
    """What ``--strategy`` accepts: every strategy's name and every spec (from the registry)."""
    return list(dict.fromkeys([*STRATEGIES, *all_specs()]))


def _name_config_defaults(parser: argparse.ArgumentParser) -> None:
    """Say each setting's default in its help: the workload's, or :class:`TrainConfig`'s.

    The flags themselves default to None (so that a config file can set them), so the help
    formatter cannot see these defaults.
    """
    from_workload = {f.name for f in fields(WorkloadDefaults)}
    defaults = {f.name: f.default for f in fields(TrainConfig) if f.default is not MISSING}
    for action in parser._actions:
        if not action.option_strings or action.dest not in defaults or "default" in (action.help or "default"):
            continue
        shown = "the workload's" if action.dest in from_workload else shown_default(defaults[action.dest])
        if shown is not None and not isinstance(defaults[action.dest], bool):
            action.help += f" (default: {shown})"


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """``--num-classes`` and ``--image-size``: the image networks' options as flags; see :func:`workload_options`."""
    group = parser.add_argument_group("image networks (vgg16e, googlenet, squeezenet, resnet34)")
    group.add_argument(
        "--num-classes",
        type=int,
        default=None,
        help="network outputs; at least the class folders (default: 257, Caltech256 with its clutter class)",
    )
    group.add_argument(
        "--image-size",
        type=int,
        default=None,
        help="images are resized to this many pixels square, ≥ 32 (default: 224; 128 for vgg16e)",
    )


def workload_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``-o KEY=VALUE`` pairs with the flags of :func:`add_model_flags` added; a flag wins over ``-o``.

    A flag that the named workload has no option for is an error that says which workloads take it.

    >>> args = argparse.Namespace(workload="resnet34", option=["data=synthetic"], num_classes=10, image_size=None)
    >>> workload_options(args)
    {'data': 'synthetic', 'num_classes': '10'}
    """
    options = parse_options(getattr(args, "option", None) or [])
    workload = getattr(args, "workload", None)
    for name, flag in MODEL_FLAGS.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        takers = [key for key, kind in WORKLOADS.items() if name in {f.name for f in fields(kind.options_type)}]
        # a workload of one's own (a reference, an installed package's) says itself what it takes
        if workload in WORKLOADS and workload not in takers:
            raise ConfigError(f"{flag}: workload {workload} has no option {name}; it applies to {', '.join(takers)}")
        options[name] = str(value)
    return options


def run(args: argparse.Namespace) -> int:
    # Every flag named like a TrainConfig field is a setting; None means "not given".
    settings = {
        f.name: getattr(args, f.name)
        for f in fields(TrainConfig)
        if f.name not in ("workload", "options") and hasattr(args, f.name)
    }
    wire_options = parse_options(getattr(args, "wire_option", []), what="wire option", example="-W rank=2")
    settings["wire_options"] = wire_options or None
    optimizer_options = parse_options(args.optimizer_option, what="optimizer option", example="-O betas=0.9,0.95")
    settings["optimizer_options"] = optimizer_options or None
    options = workload_options(args)
    given = {"options": options or None, **settings, **strategy_settings(args), **technique_settings(args)}
    elsewhere = args.join or args.nodefile is not None or ENV_RANK in os.environ  # watched by their own launcher
    if args.supervise and not elsewhere and runs_alone(args.workload, config_file=args.config, **given):
        return run_supervised(args.argv, "the training process")  # it runs this command again, as its child
    summary = train(args.workload, config_file=args.config, **given)
    if "metric" not in summary:  # a non-zero rank of a job started by another launcher, or a joining worker
        joined = summary.get("joined")
        if joined is not None:  # its --out may be another folder than the run's (MASTER_ADDR and MASTER_PORT)
            rank, step = summary["rank"], joined["step"]
            print(f"rank {rank} (joined after step {step}) finished; the run's rank 0 writes the summary")
        else:
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
    if summary.get("quality_warning"):
        print(f"warning: {summary['quality_warning']}", file=sys.stderr)
    for lost in summary.get("lost_workers") or []:  # an asynchronous run went on without them
        print(
            f"lost worker rank {lost['rank']} ({lost['reason']}): {lost['batches_not_done']} of its batches not done",
            file=sys.stderr,
        )
    if args.nodefile is not None or ENV_RANK in os.environ or args.join:
        exit_now(0)  # this process was a member of a process group started elsewhere
    return 0
