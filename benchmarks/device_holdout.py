"""Prediction at scale, held out (issue 50, part 2): scaling cases chosen on 2026-11-28 before any run of them.

**The cases were chosen and committed before any of them ran**, with the models of the tree as they are, and
nothing in the models may change while looking at their figures (the protocol of
``src/scaletrain/measure/cases.py`` and ``results/prediction-holdout-2026-11-27/``). None was run before:

- the GPU machine's scaling part ran LeNet at batch 512 and 128 and the PTB LSTM at batch 20 (1–14 workers,
  loopback; ``results/h100-2026-11-2*``, ``results/h200-2026-11-26``);
- the held-out rounds of 2026-11-27 ran 2 workers on the 2-core development machine over emulated links.

Here: workloads and batches the scaling part never ran, at 4 and 6 one-thread workers on loopback, each
beside the one-process ``local`` reference. Six cores: on the GPU machine this part runs on cores 10–15 while the
slow-link part (:mod:`device_slowlink`) takes cores 2–9 and the GPU parts cores 0–1, so the counts stop at 6.
Each case is a :class:`device_scaling.Sweep`: ``scaletrain profile`` on the same cores first (contention and
every exchange timed at 4 and 6), the predictions of both models fixed from it, then the runs, 6 workers before
4; each case ends by its share of the part's time, so a short visit cuts 4-worker rows, not whole cases. The
result has, per case, each model's error per strategy and worker count and Kendall's τ per worker count
(:func:`scaletrain.measure.validate.rank_agreement`), refined and thesis side by side.

Run: ``PYTHONPATH=src:benchmarks python benchmarks/device_holdout.py --json OUT.json --work DIR --data-dir DIR
[--seconds 400] [--dry-run]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from device_scaling import PTB_VALID, THESIS_CNN, THESIS_RNN, Plan, Sweep, run_plan

CHOSEN_ON = "2026-11-28"
HOLDOUT_WORKERS = (6, 4)  # the part's six cores: the largest count first
FASHION = {"dataset": "fashion-mnist"}

#: chosen 2026-11-28, before any run of them (not to be edited after the visit that measures them)
HOLDOUT_PLAN = Plan(
    sweeps=(
        # ResNet-20 never ran in a scaling sweep; the strategies whose order the 2-worker rounds missed once
        Sweep("resnet20-b64", "resnet20", 64, HOLDOUT_WORKERS, strategies=("allreduce-join", "ps-sharded-join",
              "ps-central-async"), options=FASHION, strategies_at_one=False),
        # LeNet between the two batches the machine ran (128 and 512), the central server's two modes
        Sweep("lenet-b256", "lenet", 256, HOLDOUT_WORKERS, strategies=("allreduce-join", "ps-central-join",
              "ps-central-async"), settings=THESIS_CNN, strategies_at_one=False),
        # the LSTM at twice the batch it ran at (20), with the sharded server
        Sweep("ptb-lstm-b40", "ptb-lstm", 40, HOLDOUT_WORKERS, strategies=("allreduce-join", "ps-sharded-join",
              "ps-central-join"), options={**PTB_VALID, "num_steps": "30"}, settings=THESIS_RNN,
              strategies_at_one=False),
    ),
    shared_time=True,
)  # fmt: skip
DRY_PLAN = Plan(
    sweeps=(
        Sweep("resnet20-b16", "resnet20", 16, (2,), strategies=("allreduce-join", "ps-central-async"),
              options={**FASHION, "train_samples": "256"}, steps=4, warmup_steps=1, strategies_at_one=False),
    ),
    profile_repeats=2,
    warmup_run=False,
    shared_time=True,
)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the result, rewritten after every run")
    parser.add_argument("--work", type=Path, required=True, help="folder for the runs and profiles")
    parser.add_argument("--data-dir", type=Path, help="folder with fashion-mnist/ and ptb/")
    parser.add_argument("--seconds", type=float, default=400.0, help="time this part may take")
    parser.add_argument("--dry-run", action="store_true", help="one tiny case, for this CPU and CI")
    args = parser.parse_args(argv)
    plan = DRY_PLAN if args.dry_run else HOLDOUT_PLAN
    header = {"chosen_on": CHOSEN_ON, "held_out": not args.dry_run, "cases": [vars(sweep) for sweep in plan.sweeps]}
    run_plan(plan, args.json, args.work, args.data_dir, args.seconds, header)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
