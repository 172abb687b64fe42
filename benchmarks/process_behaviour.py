"""One behaviour for every process: the one-process path against a worker, and the allocator setting.

Every run is a fresh ``python -m scaletrain train lenet`` (as a bench child runs it) on real
Fashion-MNIST at one batch size (512) with 1 torch thread per process, TensorBoard and progress off,
and its figures are read from its ``summary.json``. Three configurations, round-robin, the order
reversed every other repeat so that a linear drift of the machine's speed cancels:

* ``one-process``: the local path, allocator tuned (scaletrain's default), alone on the machine.
* ``2 one-process at once``: two independent one-process runs started together, so that the cores,
  caches and memory bus carry the same load as under a 2-process run (its figures: the mean of the
  two). This is the fair partner of a worker: on 2 cores, two busy processes slow each other by
  5–10 % (the profile's contention factor), whichever path they take.
* ``worker of 2``: a 2-process all-reduce run (sync join: each worker computes a whole batch of 512)
  started by the local launcher; its ``compute_seconds_per_step`` is the mean over the two workers
  and leaves out the all-reduce and waiting, so it is the same work as a one-process step.
* ``one-process, malloc off``: ``SCALETRAIN_MALLOC=off``, glibc's default allocator behaviour.

Per run: compute ms per step and minor page faults per step (both after the warm-up steps).
Ratios are taken per repeat and their medians reported:

A) worker / one-process compute ms per step, both under the same load (``worker of 2`` against ``2
   one-process at once``). Goal: within 3 % (both paths now configure threads and the allocator in
   :func:`scaletrain.train.runtime.configure_process` and run the same driver). Also shown: the
   worker against a one-process run alone (the contention of sharing 2 cores, not a path difference).
B) malloc off / on: ms per step (the gain of the setting) and faults per step.

The children get no ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_``/``GLIBC_TUNABLES`` of the
caller, so that "on" is really scaletrain's setting; each summary's ``allocator`` field is checked.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/process_behaviour.py [--repeats 5 --steps 40
--batch-size 512 --json out.json]`` (about 6 min on a quiet 2-core machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from scaletrain.data.idx import find_fashion_mnist
from scaletrain.errors import DataError
from scaletrain.train.runtime import (
    ENV_GLIBC_TUNABLES,
    ENV_MALLOC,
    ENV_MALLOC_MMAP_THRESHOLD,
    ENV_MALLOC_TRIM_THRESHOLD,
)

SRC = Path(__file__).resolve().parents[1] / "src"
GOAL_PERCENT = 3.0
CONFIGS: dict[str, dict[str, Any]] = {  # extra CLI flags, SCALETRAIN_MALLOC, expected allocator
    "one-process": {"flags": [], "malloc": "on", "allocator": "tuned"},
    "2 one-process at once": {"flags": [], "malloc": "on", "allocator": "tuned", "pair": True},
    "worker of 2": {"flags": ["--workers", "2", "--strategy", "allreduce", "--sync", "join"], "malloc": "on",
                    "allocator": "tuned"},
    "one-process, malloc off": {"flags": [], "malloc": "off", "allocator": "off"},
}  # fmt: skip


def run(name: str, args: argparse.Namespace, data_dir: Path, out: Path) -> dict[str, Any]:
    """One fresh ``scaletrain train`` process (tree); its figures from ``summary.json``."""
    config = CONFIGS[name]
    environment = {
        key: value
        for key, value in os.environ.items()
        if key not in (ENV_MALLOC_MMAP_THRESHOLD, ENV_MALLOC_TRIM_THRESHOLD, ENV_GLIBC_TUNABLES)
    }
    environment.update(
        {
            ENV_MALLOC: config["malloc"],
            "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        }
    )
    command = [
        *(sys.executable, "-m", "scaletrain", "train", "lenet"),
        *("--steps", str(args.steps), "--batch-size", str(args.batch_size), "--threads", "1"),
        *("--warmup-steps", str(args.warmup), "--log-every", str(args.steps)),
        *("--data-dir", str(data_dir), "--progress", "off", "--no-tensorboard", "--no-download"),
    ]
    outs = [out, out.with_name(out.name + "-twin")] if config.get("pair") else [out]
    children = [
        subprocess.Popen([*command, "--out", str(folder), *config["flags"]], env=environment,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for folder in outs
    ]  # fmt: skip
    for child in children:
        _, stderr = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"{name} failed:\n{stderr[-2000:]}")
    results = [
        _figures(name, config, json.loads((folder / "summary.json").read_text(encoding="utf-8"))) for folder in outs
    ]
    return {key: statistics.mean(r[key] for r in results) for key in ("compute_ms", "step_ms", "faults")}


def _figures(name: str, config: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    if summary["allocator"] != config["allocator"] or summary["threads"] != 1:
        expected = f"expected {config['allocator']!r}, 1"
        raise SystemExit(f"{name}: allocator {summary['allocator']!r}, threads {summary['threads']}; {expected}")
    step = (
        summary["compute_seconds_per_step"]
        + summary["communication_seconds_per_step"]
        + summary["wait_seconds_per_step"]
        + summary.get("data_seconds_per_step", 0.0)
    )
    return {
        "compute_ms": 1000 * summary["compute_seconds_per_step"],
        "step_ms": 1000 * step,
        "faults": summary["minor_faults_per_step"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration (default 5)")
    parser.add_argument("--steps", type=int, default=40, help="optimizer steps per run (default 40)")
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the figures (default 5)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--data-dir", type=Path, help="Fashion-MNIST folder (default: found on disk)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.steps <= args.warmup:
        parser.error("--repeats must be ≥ 1 and --steps larger than --warmup")
    try:
        data_dir = find_fashion_mnist(args.data_dir, download=False)
    except DataError as exc:
        parser.error(f"this benchmark needs the real Fashion-MNIST: {exc}")
    began, load = time.time(), os.getloadavg()[0]
    print(
        f"lenet on Fashion-MNIST from {data_dir}: batch {args.batch_size}, {args.steps} steps "
        f"({args.warmup} warm-up left out), 1 thread per process, {args.repeats} repeats round-robin",
        flush=True,
    )
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="st-process-behaviour-") as folder:
        for repeat in range(args.repeats):
            order = list(CONFIGS) if repeat % 2 == 0 else list(reversed(CONFIGS))
            for name in order:
                result = run(name, args, data_dir, Path(folder) / f"{name.replace(' ', '_')}-{repeat}")
                runs[name].append(result)
                print(
                    f"  repeat {repeat + 1} {name:<24} {result['compute_ms']:7.1f} ms compute/step, "
                    f"{result['faults']:8.0f} faults/step",
                    flush=True,
                )
    med = statistics.median
    one, worker, off = runs["one-process"], runs["worker of 2"], runs["one-process, malloc off"]
    pair = runs["2 one-process at once"]
    ratios = {
        "worker_vs_one_process_ms": [w["compute_ms"] / o["compute_ms"] for w, o in zip(worker, pair, strict=True)],
        "worker_vs_one_process_alone_ms": [w["compute_ms"] / o["compute_ms"] for w, o in zip(worker, one, strict=True)],
        "off_vs_on_ms": [f["compute_ms"] / o["compute_ms"] for f, o in zip(off, one, strict=True)],
        "off_minus_on_faults": [f["faults"] - o["faults"] for f, o in zip(off, one, strict=True)],
    }
    print(f"\nmedians of {args.repeats} runs (a worker's figures: compute = mean over the 2 workers, faults = median)")
    print(f"{'configuration':<26} {'compute ms/step':>15} {'whole step ms':>13} {'minor faults/step':>17}")
    for name, results in runs.items():
        print(
            f"{name:<26} {med(r['compute_ms'] for r in results):>15.1f} {med(r['step_ms'] for r in results):>13.1f} "
            f"{med(r['faults'] for r in results):>17.0f}"
        )
    difference = (med(ratios["worker_vs_one_process_ms"]) - 1) * 100
    gain = (1 - 1 / med(ratios["off_vs_on_ms"])) * 100
    print("\nratios (median of per-repeat ratios; faults: median of per-repeat differences):")
    print(
        f"A) worker of 2 / 2 one-process at once, compute ms per step: {med(ratios['worker_vs_one_process_ms']):.3f} "
        f"({difference:+.1f} %; per repeat {', '.join(f'{r:.3f}' for r in ratios['worker_vs_one_process_ms'])})"
    )
    print(
        f"   worker of 2 / one-process alone: {med(ratios['worker_vs_one_process_alone_ms']):.3f} "
        "(two processes sharing the cores, whichever path they take)"
    )
    print(
        f"B) malloc off / on: ms per step {med(ratios['off_vs_on_ms']):.3f} (a tuned step is {abs(gain):.1f} % "
        f"{'shorter' if gain >= 0 else 'longer'}), faults per step {med(ratios['off_minus_on_faults']):+.0f} untuned"
    )
    verdict = "PASS" if abs(difference) <= GOAL_PERCENT else "FAIL"
    print(f"{verdict}: one-process vs worker step differ by {difference:+.1f} % (goal within ±{GOAL_PERCENT:.0f} %)")
    print(
        f"\ntotal {time.time() - began:.0f} s, torch {torch.__version__}, {os.cpu_count()} cores, load average "
        f"{load:.1f} at start and {os.getloadavg()[0]:.1f} at the end (other work on the machine skews the timings)"
    )
    if args.json:
        settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        report = {"settings": settings, "runs": runs, "ratios": ratios, "verdict": verdict}
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
