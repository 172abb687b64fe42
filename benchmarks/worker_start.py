"""Starting a run's processes: forked from a preloaded process, against a fresh ``python -m`` each.

The local launcher forks each process of a run from Python's fork server with torch, ``torch._dynamo``
and scaletrain imported once (:mod:`scaletrain.parallel.preloaded`); ``SCALETRAIN_WORKER_START=exec``
starts each with ``python -m scaletrain.parallel.worker`` as before. This script measures both, side
by side, alternating the two in every repeat:

- **command**: ``python -m scaletrain train lenet --workers W --steps S`` as a user types it (one
  launch per command, so the fork server's own start is paid every time): wall seconds, and the CPU
  seconds of every process of the run (this script is their subreaper, so the fork server's children
  are counted too);
- **series**: one Python process that calls ``scaletrain.train`` ``--runs`` times (a sweep, a notebook,
  the test suite): the wall seconds of each run after the first.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/worker_start.py [--workers 4 --steps 4 --repeats 3]``
(needs Fashion-MNIST; 4 minutes here). Measured here with nothing else running: command 11.4 s
``exec`` against 8.9 s forked (CPU 16.8 s against 10.2 s), a later run in one process 9.1 s against 4.0 s.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("exec", "fork")
SERIES = """
import json, sys, time, scaletrain
walls = []
for index in range(int(sys.argv[3])):
    start = time.perf_counter()
    scaletrain.train("lenet", workers=int(sys.argv[1]), steps=int(sys.argv[2]), batch_size=32,
                     out=f"{sys.argv[4]}/run-{index}")
    walls.append(time.perf_counter() - start)
print(json.dumps(walls))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=4, help="runs per series process (the first is not counted)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    ctypes.CDLL(None, use_errno=True).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphaned descendants come here
    command: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}
    series: dict[str, list[float]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory(prefix="worker-start-") as folder:
        for repeat in range(args.repeats):
            for mode in MODES if repeat % 2 == 0 else MODES[::-1]:
                out = Path(folder) / f"{mode}-{repeat}"
                command[mode].append(one_command(mode, args.workers, args.steps, out / "command"))
                series[mode].extend(one_series(mode, args.workers, args.steps, args.runs, out / "series"))
    print(f"lenet, {args.workers} workers, {args.steps} steps; medians of {args.repeats} repeats")
    print(f"{'start':6} {'command wall s':>15} {'command CPU s':>14} {'series wall s/run':>18}")
    medians = {}
    for mode in MODES:
        walls, cpus = zip(*command[mode], strict=True)
        medians[mode] = (statistics.median(walls), statistics.median(cpus), statistics.median(series[mode]))
        print(f"{mode:6} {medians[mode][0]:15.2f} {medians[mode][1]:14.2f} {medians[mode][2]:18.2f}")
    names = ("command wall", "command CPU", "series wall")
    ratio = {name: medians["exec"][i] / medians["fork"][i] for i, name in enumerate(names)}
    print("exec / fork: " + ", ".join(f"{name} {value:.2f}" for name, value in ratio.items()))


def environment(mode: str) -> dict[str, str]:
    source = str(Path(__file__).resolve().parents[1] / "src")
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "SCALETRAIN_WORKER_START": mode, "SCALETRAIN_OFFLINE": "1", "PYTHONPATH": path}


def one_command(mode: str, workers: int, steps: int, out: Path) -> tuple[float, float]:
    """Wall and CPU seconds of one ``scaletrain train`` command with every process it started."""
    before = _children_cpu()
    start = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "scaletrain",
            "train",
            "lenet",
            "--workers",
            str(workers),
            "--steps",
            str(steps),
            "--batch-size",
            "32",
            "--out",
            str(out),
        ],
        env=environment(mode),
        check=True,
        capture_output=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    _reap_orphans()
    return wall, _children_cpu() - before


def one_series(mode: str, workers: int, steps: int, runs: int, out: Path) -> list[float]:
    found = subprocess.run(
        [sys.executable, "-c", SERIES, str(workers), str(steps), str(runs), str(out)],
        env=environment(mode),
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    )
    _reap_orphans()
    return json.loads(found.stdout.strip().splitlines()[-1])[1:]


def _reap_orphans() -> None:
    """Wait for the fork server (orphaned when its launcher exits, then ours), so its CPU time is counted."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.05)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
