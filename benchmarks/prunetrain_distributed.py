"""What PruneTrain buys a distributed run: one process against 2 workers on an emulated slow network.

The same ResNet trains dense and with ``--technique prunetrain``, once in one process and once with 2
workers for each strategy asked (default: all-reduce and the sharded parameter server, both
``split`` so every run sees the same global batch), the workers talking across an emulated link
(``--network``, default 50mbit; namespaces + veth + tc, root). Every run is a fresh ``scaletrain
train`` process tree; they run one after another.

Read from each run's ``metrics.jsonl`` (the epoch records of the worker that writes them): the
median communication seconds per step before the first reconfiguration and after the last, against
the parameters then (a reconfiguration after the last epoch is not measured: choose ``--epochs`` so
that the last one has epochs after it); the training seconds (the epochs' sum, evaluations left out). Then, per
strategy and phase (dense network, pruned network): the speedup measured (one process's median
seconds per step over the 2-worker run's) against the refined estimator's, fed a profile of that
network (``scaletrain profile --architecture-of RUN --network RATE``), and the step time each
reconfiguration record predicted against the one measured after it.

Goals (issue 11): communication per step falls in proportion to the parameters removed (within
15 %), and the 2-worker run's time saving (1 − PruneTrain's training seconds over dense's) is larger
than the one-process run's.

Run (root): ``PYTHONPATH=src .venv/bin/python benchmarks/prunetrain_distributed.py [--epochs 4
--train-samples 12800 --lasso-ratio 0.9 --network 50mbit --json out.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import scaletrain
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from training_runs import fashion_mnist, run_records, train_run

PROPORTION_TOLERANCE = 0.15
EPOCH_FIGURES = ("epoch", "parameters", "steps", "seconds", "seconds_per_step", "communication_seconds_per_step")


def train(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One fresh training run (or, with ``--runs``, the finished one already in ``out``); its figures."""
    flags = [
        *("-o", "dataset=fashion-mnist", "-o", f"train_samples={args.train_samples}", "--epochs", str(args.epochs)),
        *("--batch-size", str(args.batch_size), "--lr", str(args.lr), "--momentum", "0.9"),
        *("--weight-decay", "1e-4", "--threads", "1", "--seed", "0", "--data-dir", str(data_dir), *extra),
    ]
    finished = args.runs is not None and (out / "summary.json").exists()
    wall = None if finished else train_run(args.workload, out, flags, timeout=6 * 3600)
    records, summary = run_records(out)
    epochs = [r for r in records if r["kind"] == "epoch"]
    changes = [r for r in records if r["kind"] == "reconfiguration"]
    # a reconfiguration after the last epoch changes nothing that was measured
    measurable = [r["epoch"] for r in changes if r["epoch"] < epochs[-1]["epoch"]]
    first_change = measurable[0] if measurable else len(epochs)
    last_change = measurable[-1] if measurable else len(epochs)
    before = [r for r in epochs if r["epoch"] <= first_change]
    after = [r for r in epochs if r["epoch"] > last_change]
    return {
        "out": str(out),
        "wall_seconds": wall,
        "train_seconds": sum(r["seconds"] for r in epochs),
        "test_accuracy": summary["test_accuracy"],
        "parameters_initial": summary["parameters_initial"],
        "parameters": summary["parameters"],
        "step_before": statistics.median(r["seconds_per_step"] for r in before),
        "communication_before": statistics.median(r["communication_seconds_per_step"] for r in before),
        "parameters_after": after[0]["parameters"] if after else None,
        "step_after": statistics.median(r["seconds_per_step"] for r in after) if after else None,
        "communication_after": statistics.median(r["communication_seconds_per_step"] for r in after) if after else None,
        "predicted_after": [
            (r["epoch"], r["predicted_seconds_per_step"], r["seconds_per_step"])
            for r in epochs
            if "predicted_seconds_per_step" in r
        ],
        "epochs": [{k: r.get(k) for k in EPOCH_FIGURES} for r in epochs],
    }


def profile(args: argparse.Namespace, data_dir: Path, run: Path | None, out: Path) -> Profile:
    settings = {
        "batch_size": args.batch_size,
        "network": args.network,
        "split_workers": (2,),
        "options": {"dataset": "fashion-mnist", "train_samples": str(args.train_samples)},
        "launches": 2,
        "repeats": 8,
        "data_dir": data_dir,
        "download": False,
    }
    if args.runs is not None and out.exists():
        return Profile.load(out)
    return scaletrain.profile(args.workload, out=out, architecture_of=run, **settings)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet20")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=12_800, help="first N training images")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--lasso-ratio", type=float, default=0.9)
    parser.add_argument("--reconfigure-every", type=int, default=2)
    parser.add_argument("--network", default="50mbit")
    parser.add_argument("--strategies", default="allreduce-split,ps-sharded-split")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--runs", type=Path, metavar="FOLDER",
                        help="the folder of an earlier invocation (printed at its end): read the runs and profiles "
                             "it finished instead of making them again, and make the rest")  # fmt: skip
    args = parser.parse_args(argv)
    data_dir = fashion_mnist(parser, args.data_dir)
    prune = [
        *("--technique", "prunetrain", "--lasso-ratio", str(args.lasso_ratio)),
        *("--reconfigure-every", str(args.reconfigure_every)),
    ]
    strategies = args.strategies.split(",")
    print(
        f"{args.workload} on the first {args.train_samples} Fashion-MNIST images: {args.epochs} epochs, batch "
        f"{args.batch_size} (split over the workers), lr {args.lr}, 1 thread per process; PruneTrain lasso ratio "
        f"{args.lasso_ratio}, every {args.reconfigure_every} epochs; 2-worker links: {args.network}",
        flush=True,
    )
    runs: dict[str, dict[str, Any]] = {}
    folder = args.runs or Path(tempfile.mkdtemp(prefix="st-prunetrain-dist-"))
    for setting, layout in [("one process", []), *((s, ["--workers", "2", "--strategy", s]) for s in strategies)]:
        network = ["--network", args.network] if layout else []
        for kind, extra in (("dense", []), ("prunetrain", prune)):
            name = f"{setting}/{kind}"
            runs[name] = train(args, data_dir, folder / setting.replace(" ", "-") / kind, [*layout, *network, *extra])
            run = runs[name]
            print(
                f"  {name}: {run['parameters_initial']:,} → {run['parameters']:,} parameters, accuracy "
                f"{run['test_accuracy']:.4f}, {run['train_seconds']:.0f} s training; step {run['step_before']:.3f} s "
                f"(communication {run['communication_before']:.3f}) → "
                + (f"{run['step_after']:.3f} s ({run['communication_after']:.3f})" if run["step_after"] else "-"),
                flush=True,
            )

    checks: dict[str, bool] = {}
    saving_alone = 1 - runs["one process/prunetrain"]["train_seconds"] / runs["one process/dense"]["train_seconds"]
    print(f"\none process: PruneTrain saves {100 * saving_alone:+.1f} % of the training time")
    print(f"\n{'strategy':<18} {'params kept':>11} {'comm kept':>10} {'saving':>8} {'one-process saving':>19}")
    for strategy in strategies:
        pruned, dense = runs[f"{strategy}/prunetrain"], runs[f"{strategy}/dense"]
        kept = (pruned["parameters_after"] or pruned["parameters_initial"]) / pruned["parameters_initial"]
        communication = (pruned["communication_after"] or float("nan")) / pruned["communication_before"]
        saving = 1 - pruned["train_seconds"] / dense["train_seconds"]
        print(f"{strategy:<18} {kept:>11.3f} {communication:>10.3f} {100 * saving:>7.1f}% {100 * saving_alone:>18.1f}%")
        checks[
            f"{strategy}: communication per step ×{communication:.3f} against parameters ×{kept:.3f} (within 15 %)"
        ] = abs(communication / kept - 1) <= PROPORTION_TOLERANCE
        checks[f"{strategy}: 2-worker saving {100 * saving:.1f} % > one-process saving {100 * saving_alone:.1f} %"] = (
            saving > saving_alone
        )

    print("\nPredicted against measured (estimator: the refined model, fed a profile of each network):")
    print(f"{'strategy':<18} {'network':<8} {'parameters':>10} {'predicted speedup':>18} {'measured speedup':>17}")
    alone = runs["one process/prunetrain"]
    dense_profile = profile(args, data_dir, None, folder / "profile-dense.json")
    pruned_profile = profile(args, data_dir, Path(alone["out"]), folder / "profile-pruned.json")
    table = []
    for strategy in strategies:
        configuration = Configuration.parse(strategy)
        pruned = runs[f"{strategy}/prunetrain"]
        steps = sum(epoch["steps"] or 0 for epoch in pruned["epochs"]) or 1
        for phase, measured_profile, one, two in (
            ("dense", dense_profile, alone["step_before"], pruned["step_before"]),
            ("pruned", pruned_profile, alone["step_after"], pruned["step_after"]),
        ):
            if one is None or two is None:
                continue
            predicted = predicted_speedup(
                "refined", measured_profile, configuration, 2, batches=steps, cores=os.cpu_count()
            )
            measured = one / two
            table.append({"strategy": strategy, "phase": phase, "predicted": predicted, "measured": measured})
            print(f"{strategy:<18} {phase:<8} {measured_profile.parameters:>10,} {predicted:>18.3f} {measured:>17.3f}")
        for epoch, predicted_step, measured_step in pruned["predicted_after"]:
            print(
                f"{strategy:<18} epoch {epoch + 1}: the reconfiguration predicted {predicted_step:.3f} s per step, "
                f"measured {measured_step:.3f} s"
            )
    for text, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {text}")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end; runs in {folder}")
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        result = {"settings": settings, "runs": runs, "checks": checks, "predictions": table}
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
