"""``--compile`` against eager, measured side by side in one run: batches per second and compile time.

Workloads: LeNet (``lenet``; the real Fashion-MNIST when installed, else synthetic files in its format), ResNet-20
(``resnet20`` on the same files) and Zaremba's small LSTM (``ptb-lstm`` on ``ptb.valid.txt``), each as one
process and as 2 all-reduce workers (``--sync join``), the threads scaletrain gives them (the usable cores ÷
its processes). Every run is a fresh ``scaletrain train`` process tree; eager and compiled alternate, the
compiled one first in every other repeat, so that a drift of the machine's speed falls on both. Each compiled run
compiles cold: inductor gets a cache folder of its own (a warm cache cuts the compile time several-fold).

From each ``summary.json``: ``batches_per_second`` (after ``--warmup-steps``, so without the first steps'
compilation) and ``compile_seconds`` (the slowest worker's seconds in dynamo's compilations, tracing and
inductor's C++ builds included). Printed: the medians over the repeats, compiled ÷ eager, and the machine's
5-minute load average after each configuration (with 2 workers on 2 cores, anything above 2 is other programs).

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/compile.py [--repeats 3 --steps 60 --json out.json]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from scaletrain.data.idx import find_fashion_mnist
from scaletrain.data.synthetic import write_synthetic_fashion_mnist
from scaletrain.errors import DataError
from training_runs import finish, run_records, train_run

PTB = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "ptb"
#: workload → (its flags but the data folder, which data: fmnist or ptb)
WORKLOADS: dict[str, tuple[list[str], str]] = {
    "lenet": (["--batch-size", "64", "--lr", "0.01", "--momentum", "0.9"], "fmnist"),
    "resnet20": (["-o", "dataset=fashion-mnist", "--batch-size", "64", "--lr", "0.05", "--momentum", "0.9"], "fmnist"),
    "ptb-lstm": (["-o", "train_split=valid", "--batch-size", "20"], "ptb"),
}


def fashion_mnist(folder: Path) -> tuple[Path, str]:
    """The real Fashion-MNIST's folder (never downloaded here), else synthetic files in its format."""
    try:
        return find_fashion_mnist(None, download=False), "Fashion-MNIST"
    except DataError:
        return write_synthetic_fashion_mnist(folder / "fmnist", train=6000, test=1000), "synthetic Fashion-MNIST"


def one_run(args: argparse.Namespace, workload: str, data: Path, workers: int, compiled: bool, out: Path) -> dict:
    flags, _ = WORKLOADS[workload]
    flags = [*flags, "--data-dir", str(data), "--steps", str(args.steps), "--warmup-steps", str(args.warmup_steps)]
    flags += ["--seed", str(args.seed), "--workers", str(workers), "--checkpoint-every", str(10 * args.steps)]
    if compiled:
        flags.append("--compile")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(out.parent / f"{out.name}-inductor")  # cold: a folder of its own
    try:
        wall = train_run(workload, out, flags)
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    _, summary = run_records(out)
    return {"batches_per_second": summary["batches_per_second"], "compile_seconds": summary["compile_seconds"]} | {
        "wall_seconds": wall
    }


def measure(args: argparse.Namespace, workload: str, data: Path, workers: int, folder: Path) -> dict[str, Any]:
    runs: dict[str, list[dict]] = {"eager": [], "compiled": []}
    for repeat in range(args.repeats):
        order = (True, False) if repeat % 2 == 0 else (False, True)
        for compiled in order:
            kind = "compiled" if compiled else "eager"
            out = folder / f"{workload}-{workers}-{kind}-{repeat}"
            runs[kind].append(one_run(args, workload, data, workers, compiled, out))
    eager = statistics.median(run["batches_per_second"] for run in runs["eager"])
    compiled = statistics.median(run["batches_per_second"] for run in runs["compiled"])
    compile_seconds = statistics.median(run["compile_seconds"] for run in runs["compiled"])
    load = os.getloadavg()[1]  # the last 5 minutes': other programs' share of the 2 cores shows here
    return {"eager": eager, "compiled": compiled, "ratio": compiled / eager, "compile_seconds": compile_seconds} | {
        "load_average": load,
        "runs": runs,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated, from the defaults")
    parser.add_argument("--workers", default="1,2", help="comma-separated numbers of processes")
    parser.add_argument("--repeats", type=int, default=3, help="eager and compiled runs of each configuration")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps of each run")
    parser.add_argument("--warmup-steps", type=int, default=10, help="first steps left out of the throughput")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ptb-dir", type=Path, default=PTB, help="folder with ptb.valid.txt and ptb.test.txt")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args()
    report: dict[str, Any] = {"rows": []}
    with tempfile.TemporaryDirectory(prefix="compile-bench-") as temporary:
        folder = Path(temporary)
        fmnist, named = fashion_mnist(folder)
        print(f"LeNet and ResNet-20 on {named} ({fmnist}); the LSTM on {args.ptb_dir / 'ptb.valid.txt'}", flush=True)
        header = f"{'workload':<9} {'workers':>7} {'eager batches/s':>16} {'compiled batches/s':>19} {'ratio':>6} "
        lines = [header + f"{'compile s':>10} {'load':>5}"]
        for workload in args.workloads.split(","):
            data = args.ptb_dir if WORKLOADS[workload][1] == "ptb" else fmnist
            if WORKLOADS[workload][1] == "ptb" and not (data / "ptb.valid.txt").is_file():
                print(f"{workload}: no ptb.valid.txt in {data}; left out (give --ptb-dir)", flush=True)
                continue
            for workers in (int(count) for count in args.workers.split(",")):
                row = measure(args, workload, data, workers, folder)
                report["rows"].append({"workload": workload, "workers": workers, **row})
                lines.append(
                    f"{workload:<9} {workers:>7} {row['eager']:>16.1f} {row['compiled']:>19.1f} "
                    f"{row['ratio']:>6.2f} {row['compile_seconds']:>10.1f} {row['load_average']:>5.1f}"
                )
                print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    report["table"] = "\n".join(lines)
    return finish(args, report, met=True)


if __name__ == "__main__":
    raise SystemExit(main())
