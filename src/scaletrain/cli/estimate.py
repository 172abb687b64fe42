"""``scaletrain estimate``: predicted speedup (Šlampa's ``estimate.py`` interface), advice, validation.

- ``scaletrain estimate --t-grad S --t-comm S --type T --server central --workers N --batches D
  --output single|csv|plot``: the thesis's estimator exactly (``--case best|worst|mean``).
- ``scaletrain estimate WORKLOAD ...``: profile the workload first (or ``--profile FILE``), then
  estimate; ``--model refined`` uses the whole profile.
- ``--recommend --max-workers N``: the best worker count and configuration under each model.
- ``--validate --workers 1,2``: run the real sweep and compare both models with it.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.api import estimate, profile, recommend, validate
from scaletrain.cli.bench import _names, _numbers
from scaletrain.cli.profile import add_profile_flags, describe, profile_settings
from scaletrain.errors import ConfigError
from scaletrain.estimate.models import MODELS, Configuration
from scaletrain.estimate.plots import plot_curves
from scaletrain.estimate.thesis import CASES, KINDS
from scaletrain.estimate.validate import DEFAULT_STRATEGIES
from scaletrain.measure.profile import Profile
from scaletrain.workloads import WORKLOADS

__all__ = ["add_parser", "run"]

OUTPUTS = ("single", "csv", "plot")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="predict the speedup on N workers (thesis or refined model), recommend, validate",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("workload", nargs="?", choices=sorted(WORKLOADS), help="profile this workload first")
    times = parser.add_argument_group("the thesis's inputs (instead of a workload)")
    times.add_argument("--t-grad", type=float, help="seconds to compute the gradient of one batch")
    times.add_argument("--t-comm", type=float, help="seconds to transfer all weights once")
    times.add_argument("--profile", type=Path, help="a profile written by `scaletrain profile`")
    model = parser.add_argument_group("estimate")
    model.add_argument("--type", dest="kind", choices=KINDS, default="sync-join", help="training type")
    model.add_argument("--server", choices=("central", "distributed", "sharded"), default="central")
    model.add_argument("--strategy", choices=("ps", "allreduce"), default="ps", help="parameter server or all-reduce")
    model.add_argument("--workers", type=_numbers, default=(1,), help="N (with --validate: a list, e.g. 1,2)")
    model.add_argument("--batches", type=float, default=128, help="D, batches to train (default 128, as 003 §6.1)")
    model.add_argument("--output", choices=OUTPUTS, default="single", help="speedup at N, 1..N as csv, or a PNG")
    model.add_argument("--plot-file", type=Path, default=Path("speedup-estimate.png"), help="PNG for --output plot")
    model.add_argument("--case", choices=CASES, default="mean", help="central server: best, worst or their mean")
    model.add_argument("--model", choices=MODELS, default="thesis", help="thesis (Šlampa 2017) or refined")
    model.add_argument("--cores", type=int, help="refined: the workers share this many cores (default: own machines)")
    model.add_argument("--save-profile", type=Path, help="write the measured profile here")
    advice = parser.add_argument_group("advice and validation")
    advice.add_argument("--recommend", action="store_true", help="best worker count and configuration per model")
    advice.add_argument("--max-workers", type=int, help="with --recommend: consider 1..N workers")
    advice.add_argument("--validate", action="store_true", help="run the real sweep and compare with both models")
    advice.add_argument("--strategies", type=_names, help=f"with --validate (default {','.join(DEFAULT_STRATEGIES)})")
    advice.add_argument("--steps", type=int, help="with --validate: optimizer steps per run (default 40)")
    advice.add_argument("--warmup-steps", type=int, help="with --validate: first steps left out (default 5)")
    advice.add_argument("--runs", type=int, dest="run_repeats", help="with --validate: runs per configuration (3)")
    advice.add_argument("--lr", type=float, help="with --validate: learning rate of the runs")
    advice.add_argument("--momentum", type=float, help="with --validate: momentum of the runs")
    advice.add_argument("--out", type=Path, help="with --validate: output folder")
    add_profile_flags(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.validate:
        return _validate(args)
    measured = _profile(args)
    if args.recommend:
        return _recommend(args, measured)
    if len(args.workers) != 1:
        raise ConfigError("--workers takes one number N here (a list only with --validate)")
    workers = args.workers[0]
    speedups = estimate(
        profile=measured,
        kind=args.kind,
        server=args.server,
        strategy=args.strategy,
        workers=workers,
        batches=args.batches,
        case=args.case,
        model=args.model,
        cores=args.cores,
    )
    if args.output == "single":
        print(f"{speedups[-1]:.4f}")
    elif args.output == "csv":
        print(";".join(f"{value:.4f}" for value in speedups))
    else:
        configuration = Configuration.from_thesis(args.kind, args.server, args.strategy)
        path = plot_curves(
            args.plot_file,
            labels=[configuration.label],
            max_workers=workers,
            predict=lambda model, _, n: speedups[n - 1],
            models=(args.model,),
            title=f"Predicted speedup ({args.model} model, {args.case} case, D = {args.batches:g})",
        )
        print(f"plot written to {path}")
    return 0


def _profile(args: argparse.Namespace) -> Profile:
    """The inputs: a saved profile, a fresh one of the workload, or the two times given."""
    given = args.t_grad is not None or args.t_comm is not None
    if sum((given, args.profile is not None, args.workload is not None)) != 1:
        raise ConfigError("give exactly one of: a WORKLOAD to profile, --profile FILE, or --t-grad and --t-comm")
    if given:
        if args.t_grad is None or args.t_comm is None:
            raise ConfigError("give both --t-grad and --t-comm")
        if args.model == "refined":
            print(
                "note: with only --t-grad/--t-comm the refined model assumes no latency, no update cost, no contention"
            )
        return Profile(workload="(given times)", batch_size=0, t_grad=args.t_grad, t_comm=args.t_comm)
    if args.profile is not None:
        return Profile.load(args.profile)
    split = tuple(n for n in range(2, max(args.workers) + 1)) if args.kind == "sync-split" else ()
    settings = profile_settings(args)
    settings["split_workers"] = tuple(sorted({*settings["split_workers"], *split}))
    measured = profile(args.workload, **settings)
    print(describe(measured))
    if args.save_profile is not None:
        print(f"profile written to {measured.save(args.save_profile)}")
    return measured


def _recommend(args: argparse.Namespace, measured: Profile) -> int:
    if args.max_workers is None:
        raise ConfigError("--recommend needs --max-workers N")
    advice = recommend(measured, max_workers=args.max_workers, batches=args.batches, cores=args.cores, case=args.case)
    for model, best in advice.items():
        print(
            f"{model} model: {best['workers']} worker(s), {best['configuration']}, "
            f"predicted speedup {best['speedup']:.2f}" + (f"  ({best['note']})" if best["note"] else "")
        )
    return 0


def _validate(args: argparse.Namespace) -> int:
    if args.workload is None:
        raise ConfigError("--validate runs a workload: name one, e.g. scaletrain estimate lenet --validate")
    out = args.out or Path("validation") / f"{args.workload}-{args.network or 'loopback'}"
    settings = {key: value for key, value in (("lr", args.lr), ("momentum", args.momentum)) if value is not None}
    validate(
        args.workload,
        out=out,
        workers=args.workers if args.workers != (1,) else None,
        strategies=args.strategies,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup_steps=args.warmup_steps,
        repeats=args.run_repeats,
        network=args.network,
        options=profile_settings(args)["options"],
        settings=settings,
        data_dir=args.data_dir,
        threads_per_worker=args.threads,
    )
    print((out / "validation.md").read_text(encoding="utf-8"))
    print(f"table, plot and runs in {out}")
    return 0
