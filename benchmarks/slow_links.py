"""Slow links crossed the ways training crosses them now (issue 49): 2 workers against one process, on emulated
links of 50 and 10 Mbit/s (``--networks``; namespaces + veth + tc, root), with every exchange we have.

Rows (``--rows``, each a fresh ``scaletrain train`` process tree, one after another): the dense all-reduce,
PowerSGD rank 4 and top-k 1 % (with error feedback), local SGD (``--strategy diloco -S outer_lr=1 -S
outer_momentum=0``) and DiLoCo (outer Nesterov SGD at 0.7, momentum 0.9) at ``--sync-every`` 16 and 64; when
named (they take long), the asynchronous central server (``--async-batches split``), DiLoCo at H = 128 and 256, and
at H = 128 through the sharded server's asynchronous owners (``-S outer_exchange=sharded-async``), and DiLoCo and
local SGD at H = 16 with the outer exchange travelling beside 12 inner steps (``-S overlap_steps=12``). Every
synchronous row splits each global batch over the two workers, and DiLoCo's workers each take their share's
inner steps, so every row trains the same samples; the asynchronous row's workers each update with half a batch.
The ``join`` rows (named only) give each worker a whole batch, as the DiLoCo paper does: the dense all-reduce then
steps with twice the batch, half as often, and a DiLoCo or local SGD row's quality is held against that dense run.
ResNet-20's recipe is SGD or AdamW (``--optimizer``: the inner optimizer for DiLoCo, as in the paper), with a
cosine schedule to the end (so that the last epoch's quality is not the noise of a constant rate).

Per row: speedup (samples a second of the run's training time, warm-up, evaluation and checkpoints left out,
over one process's; the one process runs before the rows and again after them, and the faster of the two is the
reference), test accuracy after the same samples, one process's accuracy at the end of the last epoch
it had finished within the row's training time (quality at equal wall time), bytes sent per sample (every
worker's, over every sample), outer steps, and the refined estimator's speedup from one ``scaletrain profile``
of the network on that link (the codec rows with the codec's bytes and measured compute; DiLoCo with its H).
One table per link and one picture (speedup and accuracy per row and link).

Goal (issue 49): DiLoCo at 50 Mbit/s with speedup ≥ 1.8 and accuracy within 1 point of its dense run's (the one
whose workers take the same batches); the estimator within 10 % of each DiLoCo row.

Run (root): ``PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/slow_links.py [--epochs 3 --train-samples
12800 --networks 50mbit,10mbit --rows ... --json out.json --plot out.png]``; ``--workload gpt --steps 120`` for
``gpt`` (its own defaults; a dense step of its 1.5 M weights takes about 1 s at 50 Mbit/s and 5 s at 10).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import scaletrain
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.measure.profile import ProfileConfig, measure_codec
from scaletrain.measure.profile import network as built_network
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.workloads import create_workload
from training_runs import add_run_flags, fashion_mnist, finish, run_records, train_run

GOAL_SPEEDUP, ACCURACY_POINTS, ESTIMATE_TOLERANCE = 1.8, 0.01, 0.10
LOCAL_SGD = {"outer_lr": 1.0, "outer_momentum": 0.0}


@dataclass(frozen=True)
class Row:
    """A 2-worker configuration: its strategy spec, wire codec and options, as flags and as the estimator reads it."""

    spec: str
    wire: str = "fp32"
    wire_options: tuple[tuple[str, str], ...] = ()
    options: tuple[tuple[str, Any], ...] = ()

    def flags(self) -> list[str]:
        flags = ["--workers", "2", "--strategy", self.spec]
        if self.wire != "fp32":
            flags += ["--wire", self.wire, "--error-feedback"]
            flags += [f for key, value in self.wire_options for f in ("-W", f"{key}={value}")]
        if self.spec.endswith("-async"):
            flags += ["--async-batches", "split"]
        return flags + [f for key, value in self.options for f in ("-S", f"{key}={value}")]


ROWS = {
    "dense": Row("allreduce-split"),
    "powersgd rank 4": Row("allreduce-split", "powersgd", (("rank", "4"),)),
    "topk 1 %": Row("allreduce-split", "topk", (("ratio", "0.01"),)),
    "async central": Row("ps-central-async"),
    "local SGD H=16": Row("diloco-split", options=(("sync_every", 16), *LOCAL_SGD.items())),
    "diloco H=16": Row("diloco-split", options=(("sync_every", 16),)),
    "diloco H=64": Row("diloco-split", options=(("sync_every", 64),)),
    "diloco H=128": Row("diloco-split", options=(("sync_every", 128),)),
    "local SGD H=128": Row("diloco-split", options=(("sync_every", 128), *LOCAL_SGD.items())),
    "diloco H=128 bf16": Row("diloco-split", "bf16", options=(("sync_every", 128),)),
    "diloco H=256": Row("diloco-split", options=(("sync_every", 256),)),
    # each owner of the sharded server steps its share with each worker's change as it comes
    "diloco H=128 async": Row("diloco-split", options=(("sync_every", 128), ("outer_exchange", "sharded-async"))),
    # the outer exchange travels while each worker takes 12 more inner steps
    "diloco H=16 overlap 12": Row("diloco-split", options=(("sync_every", 16), ("overlap_steps", 12))),
    "local SGD H=16 overlap 12": Row(
        "diloco-split", options=(("sync_every", 16), ("overlap_steps", 12), *LOCAL_SGD.items())
    ),
    # each worker a whole batch, as in the paper (an N-times larger batch a step; its dense run is the comparison)
    "dense join": Row("allreduce-join"),
    "diloco H=32 join": Row("diloco-join", options=(("sync_every", 32),)),
    "local SGD H=128 join": Row("diloco-join", options=(("sync_every", 128), *LOCAL_SGD.items())),
}
#: what --rows leaves out unless named: the slow ones, whose figures a shorter run gives as well, and the rarer H
SLOW_ROWS = (
    "async central",
    "diloco H=128",
    "local SGD H=128",
    "diloco H=128 bf16",
    "diloco H=256",
    "diloco H=128 async",
    "diloco H=16 overlap 12",
    "local SGD H=16 overlap 12",
    "dense join",
    "diloco H=32 join",
    "local SGD H=128 join",
)


def recipe(args: argparse.Namespace, data_dir: Path) -> tuple[str, dict[str, str], list[str]]:
    """The workload, its options and the training flags every row shares."""
    common = ["--epochs", str(args.epochs), "--threads", str(args.threads), "--seed", str(args.seed)]
    common += ["--lr-schedule", "cosine", "--data-dir", str(data_dir)]
    common += ["--steps", str(args.steps)] if args.steps else []
    if args.workload == "gpt":  # its own defaults: AdamW, warm-up, cosine
        return "gpt", {"train_split": "valid"}, common
    options = {"dataset": "fashion-mnist", "train_samples": str(args.train_samples)}
    flags = ["--batch-size", str(args.batch_size), "--optimizer", args.optimizer, "--weight-decay", "1e-4"]
    flags += ["--lr", str(args.lr if args.lr is not None else 0.1 if args.optimizer == "sgd" else 2e-3)]
    flags += ["--momentum", "0.9"] if args.optimizer == "sgd" else []
    return "resnet20", options, [*common, *flags]


def train(args: argparse.Namespace, data_dir: Path, out: Path, extra: list[str]) -> dict[str, Any]:
    """One fresh run; its figures."""
    workload, options, flags = recipe(args, data_dir)
    wall = train_run(workload, out, [*flags, *(f for k, v in options.items() for f in ("-o", f"{k}={v}")), *extra])
    records, summary = run_records(out)
    workers = summary.get("per_worker") or []
    # a worker's step trains its share of a batch (split's, DiLoCo's inner step's, an async split update's) or a
    # whole one (join's)
    samples = sum(w["steps"] * w["batch_fraction"] for w in workers) * summary["batch_size"]
    epochs = [(r["seconds"], r.get("test_accuracy")) for r in records if r["kind"] == "epoch"]
    return {
        "out": str(out),
        "wall_seconds": wall,
        "quality": summary[summary["metric"]],
        "metric": summary["metric"],
        "samples_per_second": summary["samples_per_second"],
        "train_seconds": summary["train_seconds"],
        "bytes_per_sample": sum(w["gradient_bytes_sent"] for w in workers) / max(samples, 1),
        "outer_steps": summary.get("outer_steps"),
        "steps": summary["steps"],
        "epochs": epochs,
    }


def dense_of(name: str) -> str:
    """The dense run that a row's quality is held against: the one whose workers take the same batches."""
    return "dense join" if ROWS[name].spec.endswith("-join") else "dense"


def at_equal_time(alone: dict[str, Any], seconds: float) -> float | None:
    """One process's quality at the end of the last epoch it finished within ``seconds`` of training."""
    elapsed, quality = 0.0, None
    for epoch_seconds, value in alone["epochs"]:
        elapsed += epoch_seconds
        if elapsed > seconds:
            break
        quality = value
    return quality


def predicted(args: argparse.Namespace, profile: Profile, row: Row, layout: TensorLayout, steps: int) -> float:
    """The refined estimator's speedup of ``row`` on 2 workers from the dense profile, as the row's codec sends, for
    a run of ``steps`` batches (DiLoCo's last outer step concludes a shorter stretch of inner steps)."""
    if row.wire != "fp32":
        workload, options, _ = recipe(args, Path())
        wire_options = dict(row.wire_options)
        codec = WireCodec.of(row.wire, options=wire_options)
        compute = measure_codec(ProfileConfig(workload, options=options, wire=row.wire, wire_options=wire_options,
                                              threads=args.threads, repeats=8, download=False))  # fmt: skip
        # the dense all-reduce's timings (its seconds, the compute and the wait beside it) are fp32's: a codec's
        # message is the formula's (at 10 Mbit/s the dense exchange's 34 ms of wait put top-k at 1.20 for 1.67)
        dense_only = {key: {k: v for k, v in getattr(profile, key).items() if k != "allreduce"}
                      for key in ("exchange_compute", "exchange_wait")}  # fmt: skip
        profile = dataclasses.replace(
            profile, gradient_bytes=codec.steady_payload_bytes(layout), codec_seconds=compute,
            collective=codec.collective, collective_calls=codec.collective_calls, allreduce={}, **dense_only,
        )  # fmt: skip
    configuration = Configuration.parse(row.spec).with_options(dict(row.options))
    if row.spec.endswith("-async"):
        configuration = dataclasses.replace(configuration, async_batches="split")
    return predicted_speedup("refined", profile, configuration, 2, batches=steps, cores=os.cpu_count())


def profiled(args: argparse.Namespace, data_dir: Path, out: Path, network: str, rows: list[str]) -> Profile:
    """The user's profile for a validation: the exchanges the rows use timed among 2 workers on the link, beside a
    real gradient (without them the all-reduce would be the point-to-point formula's: at 10 Mbit/s 0.89 s where
    the runs took 0.99 s)."""
    workload, options, _ = recipe(args, data_dir)
    return scaletrain.profile(
        workload, out=out, batch_size=args.batch_size if workload != "gpt" else None, network=network,
        split_workers=(2,), contention_counts=(2,), threads=args.threads, options=options, launches=3, repeats=8,
        exchange_counts=(2,), exchanges=("allreduce", *(["central-async"] if "async central" in rows else [])),
        data_dir=data_dir, download=False,
    )  # fmt: skip


def draw(path: Path, report: dict[str, Any], rows: list[str]) -> None:
    """Speedup (measured bars, predicted dots) and quality per row, one colour per link."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, quality) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / len(report["links"])
    for index, (network, runs) in enumerate(report["links"].items()):
        places = [position + index * width for position in range(len(rows))]
        speed.bar(places, [runs[name]["speedup"] for name in rows], width, label=f"{network} measured")
        speed.plot(places, [runs[name]["predicted"] for name in rows], "k.", markersize=8)
        quality.bar(places, [runs[name]["quality"] for name in rows], width, label=network)
    alone = report["one_process"]["quality"]
    speed.axhline(1.0, color="grey", linewidth=0.8)
    quality.axhline(alone, color="grey", linewidth=0.8, label=f"one process {alone:.4f}")
    for axis, title in ((speed, "speedup over one process (dots: refined estimator)"), (quality, "test quality")):
        axis.set_xticks([position + 0.4 - width / 2 for position in range(len(rows))], rows, rotation=30, ha="right")
        axis.set_title(title)
        axis.legend(fontsize=8)
    low = min(run["quality"] for runs in report["links"].values() for run in runs.values())
    quality.set_ylim(max(0.0, low - 0.05), min(1.0, max(alone, low) + 0.03))
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def link_table(network: str, runs: dict[str, Any]) -> dict[str, bool]:
    """Print one link's table; the goals' checks on its rows."""
    checks: dict[str, bool] = {}
    print(f"\n{network}: {'row':<20} {'bytes/sample':>12} {'outer':>6} {'speedup':>8} {'predicted':>9} "
          f"{'quality':>8} {'alone, same time':>16}")  # fmt: skip
    for name, run in runs.items():
        same_time = run["alone_at_equal_time"]
        print(f"{'':>{len(network) + 2}}{name:<20} {run['bytes_per_sample']:>12,.0f} "
              f"{run['outer_steps'] if run['outer_steps'] is not None else '—':>6} {run['speedup']:>8.2f} "
              f"{run['predicted']:>9.2f} {run['quality']:>8.4f} "
              f"{f'{same_time:.4f}' if same_time is not None else '—':>16}")  # fmt: skip
        if ROWS[name].spec.startswith("diloco"):
            off = run["predicted"] / run["speedup"] - 1
            checks[f"{network} {name}: estimator within 10 % ({off:+.1%})"] = abs(off) <= ESTIMATE_TOLERANCE
    if network == "50mbit":  # the goal: one DiLoCo row both fast enough and close enough to its dense run
        met = [
            name
            for name, run in runs.items()
            if ROWS[name].spec.startswith("diloco")
            and run["speedup"] >= GOAL_SPEEDUP
            and run["quality"] >= runs[dense_of(name)]["quality"] - ACCURACY_POINTS
        ]
        denses = ", ".join(f"{name} {runs[name]['quality']:.4f}" for name in sorted({dense_of(n) for n in runs}))
        checks[f"50mbit: a DiLoCo row at speedup ≥ {GOAL_SPEEDUP} within 1 point of its dense run's "
               f"({denses}: {', '.join(met) or 'none'})"] = bool(met)  # fmt: skip
    return checks


def predict_again(args: argparse.Namespace, rows: list[str]) -> int:
    """``--predict-from``: the predictions of a finished report again, from the profiles it saved beside its runs
    (after a change to how a row is predicted); the measured figures are the report's."""
    saved = json.loads(args.predict_from.read_text(encoding="utf-8"))
    for key in ("workload", "epochs", "train_samples", "batch_size", "optimizer", "lr", "threads", "steps"):
        setattr(args, key, saved["settings"].get(key, getattr(args, key)))
    folder = Path(saved["one_process"]["out"]).parent
    workload, options, _ = recipe(args, Path())
    layout = TensorLayout.of([p for p in built_network(create_workload(workload, options), {}).parameters()])
    checks: dict[str, bool] = {}
    report = {"one_process": saved["one_process"], "links": saved["links"], "predicted_from": str(args.predict_from)}
    # a report from before the runs' length was kept: the recipe's (gpt's runs are always given --steps)
    steps = saved["one_process"].get("steps") or args.steps or args.epochs * args.train_samples // args.batch_size
    for network, runs in saved["links"].items():
        profile = Profile.load(folder / f"profile-{network}.json")
        for name, run in runs.items():
            run["predicted"] = predicted(args, profile, ROWS[name], layout, steps)
        checks |= link_table(network, runs)
    return close(args, report, checks, [name for name in rows if name in next(iter(saved["links"].values()))])


def close(args: argparse.Namespace, report: dict[str, Any], checks: dict[str, bool], rows: list[str]) -> int:
    """Print the checks, draw the picture if asked, write the report; the exit status."""
    for text, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {text}")
    if args.plot:
        draw(args.plot, report, rows)
        print(f"picture: {args.plot}")
    return finish(args, {**report, "checks": checks}, all(checks.values()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("resnet20", "gpt"), default="resnet20")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, help="stop each run after N global steps (the schedule ends there)")
    parser.add_argument("--train-samples", type=int, default=12_800, help="resnet20: the first N training images")
    parser.add_argument("--batch-size", type=int, default=64, help="resnet20's global batch")
    parser.add_argument("--optimizer", default="sgd", help="resnet20's optimizer (DiLoCo's inner one): sgd or adamw")
    parser.add_argument("--lr", type=float, help="resnet20's rate (default: 0.1 for SGD, 2e-3 for AdamW)")
    parser.add_argument("--networks", default="50mbit,10mbit", help="the links' rates, comma-separated")
    default_rows = ",".join(name for name in ROWS if name not in SLOW_ROWS)
    parser.add_argument("--rows", default=default_rows, help=f"which of {', '.join(ROWS)}".replace("%", "%%"))
    parser.add_argument("--plot", type=Path, help="draw speedup and accuracy per row into this PNG")
    parser.add_argument("--predict-from", type=Path, help="a finished run's --json: predict its rows again, no runs")
    add_run_flags(parser)
    parser.set_defaults(threads=1)  # one thread a process: the machine's two cores, one a worker
    args = parser.parse_args(argv)
    rows = [name.strip() for name in args.rows.split(",")]
    if unknown := [name for name in rows if name not in ROWS] or ("dense" not in rows and ["dense"]):
        parser.error(f"--rows must name dense and any of {', '.join(ROWS)}; got {', '.join(unknown)}")
    if missing := sorted({dense_of(name) for name in rows} - set(rows)):
        parser.error(f"--rows: add {', '.join(missing)}, the dense run its rows' quality is held against")
    if args.predict_from:
        return predict_again(args, rows)
    data_dir = fashion_mnist(parser, args.data_dir) if args.workload == "resnet20" else args.data_dir
    data_dir = data_dir or Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"
    folder = Path(tempfile.mkdtemp(prefix="st-slow-links-"))
    alone = train(args, data_dir, folder / "one-process", [])
    quality = f"{alone['metric']} {alone['quality']:.4f}"
    print(f"one process: {alone['samples_per_second']:.1f} samples/s, {quality}", flush=True)
    workload, options, _ = recipe(args, data_dir)
    layout = TensorLayout.of([p for p in built_network(create_workload(workload, options), {}).parameters()])
    report: dict[str, Any] = {"one_process": alone, "links": {}}
    for network in args.networks.split(","):
        profile = profiled(args, data_dir, folder / f"profile-{network}.json", network, rows)
        runs = report["links"][network] = {}
        for name in rows:
            run = runs[name] = train(args, data_dir, folder / network / name.replace(" ", "-").replace("%", "pc"),
                                     [*ROWS[name].flags(), "--network", network])  # fmt: skip
            run["speedup"] = run["samples_per_second"] / alone["samples_per_second"]
            run["predicted"] = predicted(args, profile, ROWS[name], layout, alone["steps"])
            run["alone_at_equal_time"] = at_equal_time(alone, run["train_seconds"])
            print(f"  {network} {name}: speedup {run['speedup']:.2f} over the first one-process run (predicted "
                  f"{run['predicted']:.2f}), {run['metric']} {run['quality']:.4f}", flush=True)  # fmt: skip
            if args.json:  # what was measured so far survives an interrupted run
                args.json.write_text(json.dumps(report, indent=2) + "\n")
    return close(args, report, against_the_faster(args, data_dir, folder, report), rows)


def against_the_faster(
    args: argparse.Namespace, data_dir: Path, folder: Path, report: dict[str, Any]
) -> dict[str, bool]:
    """One process once more after the rows; every speedup is then taken over the faster of the two runs (a run of
    the one process that the machine's noise made slow would lift every row: 2.12 for 2 workers on 2 cores once).
    Prints the tables; the checks."""
    alone, again = report["one_process"], train(args, data_dir, folder / "one-process-after", [])
    report["one_process_after"] = again
    rate = report["reference_samples_per_second"] = max(alone["samples_per_second"], again["samples_per_second"])
    print(f"one process again: {again['samples_per_second']:.1f} samples/s (before: "
          f"{alone['samples_per_second']:.1f}); speedups below are over {rate:.1f}", flush=True)  # fmt: skip
    checks: dict[str, bool] = {}
    for network, runs in report["links"].items():
        for run in runs.values():
            run["speedup"] = run["samples_per_second"] / rate
        checks |= link_table(network, runs)
    print(f"runs in {folder}")
    return checks


if __name__ == "__main__":
    raise SystemExit(main())
