"""Time of ``recommend`` (both models, every configuration, 1..N workers) against N, and the one-pass
curves against predicting one worker count at a time.

Profiles: the thesis's inputs alone (t_grad 0.821 s, t_comm 0.811 s, as ``scaletrain estimate
--t-grad 0.821 --t-comm 0.811 --recommend`` builds it) and the measured LeNet (100 Mbit/s) and
SqueezeNet (loopback) profiles in ``results/validation``; each with the workers on machines of their
own, and sharing 2 cores (``--cores 2``). Reported: median CPU seconds (``process_time``, which
other processes on a shared machine do not inflate) and wall seconds over the repeats. The torch
import of the command itself (seconds) is not included.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/estimate_recommend.py [--workers 1000,10000
--repeats 3 --per-count 300]``. Goal: ≤ 1 s at 10,000 workers.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from scaletrain.estimate.models import predicted_configurations, predicted_speedup, predicted_speedups
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.recommend import recommend

REPO = Path(__file__).resolve().parents[1]


def profiles() -> dict[str, Profile]:
    return {
        "times only": Profile("(given times)", 0, t_grad=0.821, t_comm=0.811),
        "lenet 100mbit": Profile.load(REPO / "results/validation/lenet-100mbit/profile.json"),
        "squeezenet loopback": Profile.load(REPO / "results/validation/squeezenet-loopback/profile.json"),
    }


def timed(call, repeats: int) -> tuple[float, float]:
    cpu, wall = [], []
    for _ in range(repeats):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        call()
        cpu.append(time.process_time() - started_cpu)
        wall.append(time.perf_counter() - started_wall)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1000,10000", help="values of --max-workers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-count", type=int, default=300, help="N for the one-count-at-a-time comparison")
    args = parser.parse_args()
    counts = [int(part) for part in args.workers.split(",")]
    print(f"{'profile':<21} {'cores':>5} {'N':>6} {'CPU s':>7} {'wall s':>7}  best (refined model)")
    for name, profile in profiles().items():
        for cores in (None, 2):
            for count in counts:
                advice = {}
                cpu, wall = timed(
                    lambda p=profile, n=count, c=cores, a=advice: a.update(recommend(p, max_workers=n, cores=c)),
                    args.repeats,
                )
                best = advice["refined"]
                print(f"{name:<21} {cores or '-':>5} {count:>6} {cpu:7.3f} {wall:7.3f}  "
                      f"{best['workers']} × {best['configuration']} ({best['speedup']:.3g})")  # fmt: skip
    configurations = predicted_configurations()
    n = args.per_count
    print(f"\nrefined model, {len(configurations)} configurations, 1..{n} workers: all counts at once vs one at a time")
    for name, profile in profiles().items():
        at_once, _ = timed(lambda p=profile: predicted_speedups("refined", p, configurations, n, batches=128), 1)
        one_by_one, _ = timed(
            lambda p=profile: [
                predicted_speedup("refined", p, c, k, batches=128) for c in configurations for k in range(1, n + 1)
            ],
            1,
        )
        print(f"{name:<21} at once {at_once:6.3f} s   one at a time {one_by_one:6.3f} s   "
              f"ratio {one_by_one / at_once:5.1f}×")  # fmt: skip


if __name__ == "__main__":
    main()
