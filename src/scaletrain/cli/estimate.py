"""``scaletrain estimate``: predicted speedup (Šlampa's ``estimate.py`` interface), advice, validation.

- ``scaletrain estimate --t-grad S --t-comm S --type T --server central --workers N --batches D
  --output single|csv|plot``: the thesis's estimator exactly (``--case best|worst|mean``).
- ``--strategy SPEC`` (``ps-central-join``, ``allreduce-split`` …, the registry's predicted specs)
  instead of ``--strategy ps|allreduce --type T --server S``; a flag that contradicts the spec is an
  error.
- ``scaletrain estimate WORKLOAD ...``: profile the workload first (or ``--profile FILE``), then
  estimate; ``--model refined`` uses the whole profile.
- ``--recommend --max-workers N``: the best worker count and configuration under each model.
- ``--validate --workers 1,2``: run the real sweep and compare both models with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from scaletrain.api import estimate, estimate_range, profile, recommend, strategy_spec, validate, validate_cases
from scaletrain.cli.arguments import name_list, number_list, workload_argument, workloads_offered
from scaletrain.cli.formatter import RawDescriptionDefaultsHelpFormatter
from scaletrain.cli.profile import add_profile_flags, describe, profile_settings
from scaletrain.cli.registry_flags import add_strategy_flags, given_strategy_options, parse_options
from scaletrain.errors import ConfigError
from scaletrain.estimate.models import MODELS, check_inputs
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.thesis import CASES, KINDS
from scaletrain.measure.machine import machine_info, machine_note
from scaletrain.measure.profile import ProfileConfig
from scaletrain.measure.validate import DEFAULT_STRATEGIES
from scaletrain.parallel.strategies import ALIASES, STRATEGIES, all_specs, parse_spec
from scaletrain.parallel.strategies.ps.options import ASYNC_BATCHES

__all__ = ["add_parser", "run", "strategy_choices"]

OUTPUTS = ("single", "csv", "plot")
#: Nine significant digits: a speedup read back from the output is within 1e-8 (relative) of the model's.
DIGITS = ".9g"


DESCRIPTION = """\
Predict the speedup of data-parallel training on N workers, recommend a configuration, or check
the predictions against real runs.

  scaletrain estimate --t-grad S --t-comm S --type T --server central --workers N --batches D
      the thesis's estimator (Šlampa 2017) from two measured times; --output single, csv or plot
  scaletrain estimate ... --strategy ps-central-join
      a whole strategy spec instead of --strategy, --type and --server
  scaletrain estimate WORKLOAD ...
      profile the workload first (or give --profile FILE), then estimate; --model refined uses
      the whole profile (latency, update time, contention, stragglers, shard sizes)
  scaletrain estimate ... --recommend --max-workers N
      the best worker count and configuration under each model
  scaletrain estimate WORKLOAD --validate --workers 1,2
      run the real sweep and compare both models with it
"""


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "estimate",
        help="predict the speedup on N workers (thesis or refined model), recommend, validate",
        description=DESCRIPTION,
        formatter_class=RawDescriptionDefaultsHelpFormatter,
    )
    parser.add_argument(
        "workload",
        nargs="?",
        type=workload_argument,
        metavar="WORKLOAD",
        help=f"profile this workload first: {workloads_offered()}",
    )
    times = parser.add_argument_group("the thesis's inputs (instead of a workload)")
    times.add_argument("--t-grad", type=float, metavar="SECONDS", help="time to compute the gradient of one batch")
    times.add_argument("--t-comm", type=float, metavar="SECONDS", help="time to transfer all weights once")
    times.add_argument("--profile", type=Path, metavar="FILE", help="a profile written by scaletrain profile")
    model = parser.add_argument_group("estimate")
    model.add_argument("--type", dest="kind", choices=KINDS, help="training type (default: sync-join, or the spec's)")
    servers = {server for s in STRATEGIES.values() for server in s.servers}
    model.add_argument(
        "--server",
        choices=sorted(servers | {alias for alias, server in ALIASES.items() if server in servers}),
        help="parameter server: one central process, or distributed (sharded) over every worker "
        "(default: central, or the spec's)",
    )
    model.add_argument(
        "--strategy",
        choices=strategy_choices(),
        default="ps",
        metavar="STRATEGY",
        help=f"a strategy spec, which sets --type and --server too: {', '.join(all_specs(predicted_only=True))}; "
        f"or a strategy with --type and --server: {', '.join(s.name for s in STRATEGIES.values() if s.predicted)}",
    )
    model.add_argument(
        "--workers", type=number_list, default=(1,), metavar="N", help="worker count; with --validate a list, e.g. 1,2"
    )
    model.add_argument("--batches", type=float, default=128, metavar="D", help="batches to train, as in the thesis")
    add_strategy_flags(model, skip=("async_batches",))  # -S sync_every=16, --sync-every 16 …
    model.add_argument(
        "--async-batches",
        choices=ASYNC_BATCHES,
        help="async: split (each update --batch-size / N, as training does unless told) or share "
        "(Downpour's whole batches: the thesis's async, and what --validate measures) (default: split "
        "with a workload or --profile, share with --t-grad and --t-comm)",
    )
    model.add_argument("--output", choices=OUTPUTS, default="single", help="speedup at N, 1..N as csv, or a PNG")
    model.add_argument(
        "--plot-file", type=Path, default=Path("speedup-estimate.png"), metavar="PNG", help="picture for --output plot"
    )
    model.add_argument("--case", choices=CASES, default="mean", help="central server: best, worst or their mean")
    model.add_argument("--model", choices=MODELS, default="thesis", help="thesis (Šlampa 2017) or refined")
    model.add_argument(
        "--cores", type=int, metavar="N", help="refined: the workers share this many cores (default: a machine each)"
    )
    model.add_argument("--save-profile", type=Path, metavar="FILE", help="write the measured profile here")
    advice = parser.add_argument_group("advice and validation")
    advice.add_argument("--recommend", action="store_true", help="best worker count and configuration per model")
    advice.add_argument("--max-workers", type=int, metavar="N", help="with --recommend: consider 1..N workers")
    advice.add_argument("--validate", action="store_true", help="run the real sweep and compare with both models")
    advice.add_argument(
        "--strategies",
        type=name_list,
        metavar="LIST",
        help=f"with --validate: strategy specs (default: {','.join(DEFAULT_STRATEGIES)})",
    )
    advice.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="with --validate: optimizer steps per run, per worker for an asynchronous one (default: 40)",
    )
    advice.add_argument(
        "--warmup-steps", type=int, metavar="N", help="with --validate: first steps left out (default: 5)"
    )
    advice.add_argument(
        "--runs", type=int, dest="run_repeats", metavar="N", help="with --validate: runs per configuration (default: 3)"
    )
    advice.add_argument(
        "--lr", type=float, metavar="RATE", help="with --validate: learning rate of the runs (default: the workload's)"
    )
    advice.add_argument(
        "--momentum", type=float, metavar="M", help="with --validate: momentum of the runs (default: the workload's)"
    )

    advice.add_argument(
        "--cases",
        metavar="WHICH",
        help="with --validate and no WORKLOAD: the named validation cases instead, each with its "
        "own flags: holdout (none of them used to adjust the models), adjusted, all, or case names; "
        "the report gives each model's errors on adjusted-on and held-out cases apart",
    )
    advice.add_argument(
        "--rescore",
        type=Path,
        metavar="FOLDER",
        help="with --cases: run nothing; predict the cases saved in FOLDER/CASE (profile.json, "
        "validation.csv) again with today's models, e.g. results/validation",
    )
    advice.add_argument(
        "--out",
        type=Path,
        metavar="FOLDER",
        help="with --validate: output folder (default: validation/WORKLOAD-NETWORK…)",
    )
    add_profile_flags(parser)
    parser.set_defaults(handler=run)


def strategy_choices() -> list[str]:
    """What ``--strategy`` accepts: each predicted strategy's name and every predicted spec (from the registry)."""
    names = [name for name, strategy in STRATEGIES.items() if strategy.predicted]
    return list(dict.fromkeys([*names, *all_specs(predicted_only=True)]))


def run(args: argparse.Namespace) -> int:
    _check_numbers(args)
    if not args.validate and (args.cases is not None or args.rescore is not None):
        raise ConfigError("--cases and --rescore compare the models with runs: add --validate")
    if args.validate:
        return _validate(args)
    # The spec and the thesis's flags agree (or the error says how) before anything is profiled.
    spec = strategy_spec(args.strategy, kind=args.kind, server=args.server)
    measured = _profile(args, spec)
    if args.recommend:
        return _recommend(args, measured)
    speedups = estimate(
        profile=measured,
        strategy=spec,
        workers=args.workers[0],
        batches=args.batches,
        case=args.case,
        model=args.model,
        cores=args.cores,
        plot=args.plot_file if args.output == "plot" else None,
        async_batches=_async_batches(args),
        strategy_options=given_strategy_options(args),
    )
    if args.output == "single":
        print(f"{speedups[-1]:{DIGITS}}" + _range(args, measured, spec))
    elif args.output == "csv":
        print(";".join(f"{value:{DIGITS}}" for value in speedups))
    else:
        print(f"plot written to {args.plot_file}")
    return 0


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse impossible counts before anything is profiled (which takes minutes)."""
    check_inputs(None, min(args.workers), batches=args.batches, cores=args.cores)
    if len(args.workers) != 1 and not (args.validate or args.recommend):
        raise ConfigError("--workers takes one number N here (a list only with --validate)")
    if args.recommend:
        if args.max_workers is None:
            raise ConfigError("--recommend needs --max-workers N")
        if args.max_workers < 1:
            raise ConfigError(f"--max-workers must be ≥ 1, got {args.max_workers}")


def _profile(args: argparse.Namespace, spec: str) -> Profile:
    """The inputs: a saved profile, a fresh one of the workload, or the two times given."""
    given = args.t_grad is not None or args.t_comm is not None
    if sum((given, args.profile is not None, args.workload is not None)) != 1:
        raise ConfigError("give exactly one of: a WORKLOAD to profile, --profile FILE, or --t-grad and --t-comm")
    if given:
        if args.t_grad is None or args.t_comm is None:
            raise ConfigError("give both --t-grad and --t-comm")
        given = Profile(workload="(given times)", batch_size=0, t_grad=args.t_grad, t_comm=args.t_comm)
        check_inputs(given, 1, batches=args.batches)
        if args.model == "refined":
            print(
                "note: with only --t-grad/--t-comm the refined model assumes no latency, no update cost, no "
                "contention, and has no measured spread to give a range"
            )
        return given
    if args.profile is not None:
        loaded = Profile.load(args.profile)
        note = machine_note(loaded.machine, machine_info())
        if note:  # on stderr: the speedups on stdout stay one line a program reads
            print(note, file=sys.stderr)
        return loaded
    split = tuple(range(2, max(args.workers) + 1)) if parse_spec(spec)[2] == "split" else ()
    settings = profile_settings(args)
    settings["split_workers"] = tuple(sorted({*settings["split_workers"], *split}))
    measured = profile(args.workload, **settings)
    print(describe(measured))
    if args.save_profile is not None:
        print(f"profile written to {measured.save(args.save_profile)}")
    return measured


def _range(args: argparse.Namespace, measured: Profile, spec: str) -> str:
    """`` (1.55–1.70)``: the refined model's range from the profile's samples; nothing without them or thesis's."""
    options = {"async_batches": _async_batches(args), "strategy_options": given_strategy_options(args)}
    settings = {"strategy": spec, "workers": args.workers[0], "batches": args.batches, "cores": args.cores, **options}
    ranged = estimate_range(measured, **settings) if args.model == "refined" else None
    return "" if ranged is None else f" ({_spread(ranged)})"


def _spread(ranged: tuple[float, float, float]) -> str:
    return f"{ranged[0]:#.3g}–{ranged[2]:#.3g}"


def _async_batches(args: argparse.Namespace) -> str:
    """``--async-batches``, or its default: the thesis's Downpour for given times, training's split otherwise."""
    return args.async_batches or ("share" if args.t_grad is not None or args.t_comm is not None else "split")


def _recommend(args: argparse.Namespace, measured: Profile) -> int:
    advice = recommend(
        measured,
        max_workers=args.max_workers,
        batches=args.batches,
        cores=args.cores,
        case=args.case,
        async_batches=_async_batches(args),
        strategy_options=given_strategy_options(args),
    )
    for model, best in advice.items():
        ranged = f" ({_spread(best['range'])})" if best.get("range") else ""
        print(
            f"{model} model: {best['workers']} worker(s), {best['configuration']}, "
            f"predicted speedup {best['speedup']:.2f}{ranged}" + (f"  ({best['note']})" if best["note"] else "")
        )
        rival = best.get("runner_up")
        if best.get("indistinguishable") and rival:
            first, other = best["configuration"], rival["configuration"]
            pair = f"{first} and {other} on {best['workers']} worker(s)"
            if rival["workers"] != best["workers"]:
                pair = f"{best['workers']} worker(s) {first} and {rival['workers']} {other}"
            print(
                f"{model} model: {pair} are indistinguishable: their predicted ranges {_spread(best['range'])} and "
                f"{_spread(rival['range'])} overlap"
            )
    return 0


def _validate(args: argparse.Namespace) -> int:
    if args.async_batches == "split":
        raise ConfigError(
            "--validate runs and predicts Downpour's asynchronous updates (--async-batches share), the mode its "
            "cases were measured in; split is predicted (without --validate) but not validated yet: drop it"
        )
    if args.cases is not None or args.rescore is not None:
        return _validate_cases(args)
    if args.workload is None:
        raise ConfigError("--validate runs a workload: name one, e.g. scaletrain estimate lenet --validate")
    # what the validation measures itself, or does not take: refused rather than silently not done
    counted = {
        "--split-workers": args.split_workers,
        "--concurrency": args.concurrency,
        "--contention-at": args.contention_at,
        "--exchange-at": args.exchange_at,
    }
    defaults = {field.name: field.default for field in dataclasses.fields(ProfileConfig)}
    untaken = {
        "--repeats": "repeats",
        "--round-trips": "round_trips",
        "--timeout": "timeout",
        "--memory-format": "memory_format",
    }
    given = [flag for flag, value in counted.items() if value]
    given += [flag for flag, name in untaken.items() if getattr(args, name) != defaults[name]]
    if given:
        raise ConfigError(
            f"--validate does not take {', '.join(given)}: it profiles at the runs' own worker counts with the "
            "defaults; drop them, or run scaletrain profile with them and estimate --profile FILE"
        )
    wire = f"-{args.wire}" if args.wire != "fp32" else ""
    wire += "".join(f"-{name}" for name in args.framework if name != "scaletrain")
    out = args.out or Path("validation") / f"{args.workload}-{args.network or 'loopback'}{wire}"
    given = (("lr", args.lr), ("momentum", args.momentum), ("optimizer", args.optimizer))
    settings = {key: value for key, value in given if value is not None}
    optimizer_options = parse_options(args.optimizer_option, what="optimizer option", example="-O betas=0.9,0.95")
    if optimizer_options:
        settings["optimizer_options"] = optimizer_options
    validate(
        args.workload,
        out=out,
        frameworks=args.framework,
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
        launches=args.launches,
        **{
            key: value
            for key, value in profile_settings(args).items()
            if key in ("wire", "wire_options", "precision", "device")
        },  # the runs train as the profile times
    )
    print((out / "validation.md").read_text(encoding="utf-8"))
    print(f"table, plot and runs in {out}")
    return 0


#: what a case fixes itself (``scaletrain.measure.cases``): given with --cases, refused rather than ignored
CASE_FLAGS = (
    "workload",
    "strategies",
    "steps",
    "warmup_steps",
    "run_repeats",
    "lr",
    "momentum",
    "optimizer",
    "optimizer_option",
    "network",
    "batch_size",
    "wire_option",
)


def _validate_cases(args: argparse.Namespace) -> int:
    if args.cases is None:
        raise ConfigError(
            "--rescore FOLDER goes with --cases WHICH, e.g. --validate --cases all --rescore results/validation"
        )
    given = [name for name in CASE_FLAGS if getattr(args, name, None) not in (None, [])]
    given += ["workers"] if args.workers != (1,) else []
    given += ["wire"] if args.wire != "fp32" else []
    if given:
        shown = ", ".join("WORKLOAD" if name == "workload" else "--" + name.replace("_", "-") for name in given)
        raise ConfigError(f"--cases runs each case with its own flags: drop {shown}")
    out = args.out or Path("validation") / ("cases-rescored" if args.rescore else "cases")
    result = validate_cases(args.cases, out, rescore_from=args.rescore, data_dir=args.data_dir)
    print(result["report"].read_text(encoding="utf-8"))
    print(f"tables and runs in {out}")
    return 0
