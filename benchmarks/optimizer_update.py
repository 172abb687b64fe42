"""The optimizer step that ``scaletrain profile --optimizer`` times (``t_update``, the step a parameter server
makes for every update and the estimators add to each step): SGD with momentum against AdamW, side by side.

Fresh profiling processes, the optimizers alternating launch by launch (so a change in the machine's load falls on
both), ``--launches`` times each; in each, ``--repeats`` timed steps after the warm-up (the profile keeps their
median); the median over the launches. LeNet (431 080 weights) on the real Fashion-MNIST.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/optimizer_update.py [--launches 3 --repeats 20]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from scaletrain.measure.profile import ProfileConfig, run_profile
from training_runs import fashion_mnist

OPTIMIZERS = ("sgd", "adamw")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--data-dir", type=Path)
    args = parser.parse_args()
    data = fashion_mnist(parser, args.data_dir)
    samples: dict[str, list[float]] = {name: [] for name in OPTIMIZERS}
    with tempfile.TemporaryDirectory(prefix="optimizer-update-") as folder:
        for launch in range(args.launches):
            for name in OPTIMIZERS:
                config = ProfileConfig(
                    "lenet", batch_size=64, concurrency=1, repeats=args.repeats, warmup=3, round_trips=2,
                    launches=1, data_dir=data, download=False, optimizer=name,
                )  # fmt: skip
                profile = run_profile(config, out=Path(folder) / f"{name}-{launch}.json")
                samples[name].append(profile.t_update)  # the launch's median step
    medians = {name: statistics.median(values) for name, values in samples.items()}
    for name, median in medians.items():
        print(f"{name:6} t_update median {median * 1e3:.3f} ms over {len(samples[name])} launches")
    print(f"adamw / sgd: {medians['adamw'] / medians['sgd']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
