"""CPU scaling on many cores: Jäger's experiment, measured and predicted (part of ``scripts/device-suite.sh``).

Jäger (2018) trained LeNet at batch 512 (which scaled linearly) and 128 (which flattened) and the
2×200 LSTM at batch 20 on up to 50 one-vCPU workers. Here: the same workloads on the cores this
process may use (one torch thread per process), at 1, 2, 4, 8, 12 and 14 workers, under all-reduce
(``allreduce-join``), the central server (``ps-central-join``, ``ps-central-async``) and the sharded
server (``ps-sharded-join``). Every run is a ``scaletrain bench`` run (:func:`run_sweep`, the same
code as ``scaletrain train``, a fresh process tree each); ``local`` at one worker is the reference.
The figures are batches per second, the speedup against ``local`` and the scaling efficiency
(speedup ÷ workers).

Before a workload's runs, ``scaletrain profile`` measures it on the same cores (contention up to
the largest worker count), so every prediction is fixed before the runs it is judged on; then
:func:`scaletrain.measure.validate.compare` sets both models beside every measured row, and this
module adds each model's mean absolute percentage error per strategy and whether it ranks the
strategies at each worker count as the runs did.

The design is reduced to fit minutes, not hours: few steps per run (warm-up steps excluded from the
rate), one run per configuration, the most valuable configurations first (``local``, then 14, 8, 4,
2 and 12 workers, the strategies' own one-worker runs last), and a deadline: what does not fit is
recorded as not run. A run that fails (e.g. the sharded server with more owners than LeNet has
tensors) is recorded with its error and the sweep goes on. The result JSON is rewritten after every
run, so a part killed at its limit keeps what it measured.

Run: ``PYTHONPATH=src python benchmarks/device_scaling.py --json scaling.json --work DIR [--dry-run]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.errors import ScaletrainError
from scaletrain.estimate.models import MODELS
from scaletrain.measure.profile import ProfileConfig, run_profile
from scaletrain.measure.results import add_speedups, flag_outliers
from scaletrain.measure.sweep import SweepConfig, run_sweep
from scaletrain.measure.validate import compare, rank_agreement

STRATEGIES = ("allreduce-join", "ps-central-join", "ps-sharded-join", "ps-central-async")


@dataclass(frozen=True)
class Sweep:
    """One workload at one batch size over worker counts (in the order they are run)."""

    name: str
    workload: str
    batch_size: int
    workers: tuple[int, ...]
    strategies: tuple[str, ...] = STRATEGIES
    options: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)
    steps: int = 12  # per worker: a synchronous run's steps; an asynchronous run takes workers × steps updates
    warmup_steps: int = 4
    strategies_at_one: bool = True  # also each strategy's own one-worker run (after everything else)


@dataclass(frozen=True)
class Plan:
    sweeps: tuple[Sweep, ...]
    profile_repeats: int = 4
    run_timeout: float = 30.0  # seconds any wait for another process may take inside a run
    warmup_run: bool = True  # one unmeasured run before the part's first measured one (issue 9)
    shared_time: bool = False  # each sweep ends by its share of the time left (no sweep is left without rows)


THESIS_CNN = {"lr": 0.025, "momentum": 0.0}  # Jäger §6.1 (the thesis-cnn preset)
THESIS_RNN = {"lr": 0.05}  # Jäger §6.2 (the thesis-rnn preset)
PTB_VALID = {"train_split": "valid"}  # offline PTB copies hold only valid and test
DEVICE_WORKERS = (14, 8, 4, 2, 12)  # after local; most valuable first

DEVICE_PLAN = Plan(  # the sweeps least measured on the GPU machine first (lenet-b512 ran in full on 2026-11-26,
    sweeps=(  # ptb-lstm-b20 at all but 12 workers on 2026-11-27)
        Sweep("lenet-b128", "lenet", 128, DEVICE_WORKERS, settings=THESIS_CNN),
        Sweep("ptb-lstm-b20", "ptb-lstm", 20, DEVICE_WORKERS, options={**PTB_VALID, "num_steps": "30"},
              settings=THESIS_RNN),
        Sweep("lenet-b512", "lenet", 512, DEVICE_WORKERS, settings=THESIS_CNN),
    )
)  # fmt: skip
TINY_LSTM = {**PTB_VALID, "num_steps": "5", "hidden_size": "16", "vocab_size": "50", "eval_batch_size": "4"}
DRY_PLAN = Plan(
    sweeps=(
        Sweep("lenet-b32", "lenet", 32, (2,), strategies=("allreduce-join", "ps-central-async"), settings=THESIS_CNN,
              steps=6, warmup_steps=2, strategies_at_one=False),
        Sweep("ptb-lstm-b4", "ptb-lstm", 4, (2,), strategies=("ps-sharded-join",), options=TINY_LSTM,
              settings=THESIS_RNN, steps=6, warmup_steps=2, strategies_at_one=False),
    ),
    profile_repeats=2,
    warmup_run=False,
)  # fmt: skip


def configurations(sweep: Sweep) -> list[tuple[str, int]]:
    """(strategy, workers) in the order they run: the reference, the worker counts, the one-worker runs."""
    runs = [("local", 1)] + [(spec, n) for n in sweep.workers if n > 1 for spec in sweep.strategies]
    if sweep.strategies_at_one:
        runs += [(spec, 1) for spec in sweep.strategies]
    return runs


def steps_of(sweep: Sweep, spec: str, workers: int) -> int:
    """Asynchronous ``--steps`` counts the server's updates of all workers together."""
    return sweep.steps * workers if spec.endswith("-async") else sweep.steps


class Recorder:
    """The part's JSON, rewritten (atomically) after every change."""

    def __init__(self, path: Path, result: dict[str, Any]) -> None:
        self.path, self.result = path, result
        self.save()

    def save(self) -> None:
        partial = self.path.with_suffix(".partial")
        partial.write_text(json.dumps(self.result, indent=1, default=str), encoding="utf-8")
        partial.replace(self.path)


def measure_sweep(sweep: Sweep, plan: Plan, entry: dict[str, Any], recorder: Recorder, context: dict[str, Any]) -> None:
    """Profile, then every configuration that fits before the deadline; predictions beside each row."""
    deadline, cores = context["sweep_deadline"], context["cores"]
    began = time.monotonic()
    try:
        profile = run_profile(
            ProfileConfig(
                sweep.workload, batch_size=sweep.batch_size, options=dict(sweep.options),
                concurrency=min(max(sweep.workers), cores), threads=1, repeats=plan.profile_repeats, warmup=1,
                contention_counts=tuple(n for n in sweep.workers if n > 1),  # the run's counts only (was 175 s)
                exchange_counts=tuple(n for n in sweep.workers if n > 1),
                round_trips=5, launches=1, lr=sweep.settings.get("lr"), momentum=sweep.settings.get("momentum"),
                data_dir=context["data_dir"], download=False, timeout=60.0,
            )
        )  # fmt: skip
        entry["profile"] = profile.to_json()
    except Exception as exc:  # without a profile the runs are still measured, only not predicted
        entry["profile_error"] = str(exc) if isinstance(exc, ScaletrainError) else traceback.format_exc()[-3000:]
        profile = None
    entry["profile_seconds"] = context["last_profile_seconds"] = time.monotonic() - began
    recorder.save()
    longest = 0.0
    for index, (spec, workers) in enumerate(configurations(sweep)):
        if time.time() + max(longest * 1.3, 5.0) > deadline:
            entry["not_run"].append({"strategy": spec, "workers": workers, "why": "the part's deadline"})
            continue
        started = time.monotonic()
        config = SweepConfig(
            workload=sweep.workload, out=context["work"] / sweep.name, workers=(workers,), strategies=(spec,),
            batch_sizes=(sweep.batch_size,), steps=steps_of(sweep, spec, workers), warmup_steps=sweep.warmup_steps,
            data_dir=context["data_dir"], options=dict(sweep.options),
            # the CPU's cores are measured: without --device cpu a GPU machine's runs would go to its GPU
            settings={**sweep.settings, "timeout": plan.run_timeout, "download": False, "device": "cpu"},
            warmup_run=plan.warmup_run and index == 0 and context["first"],
        )  # fmt: skip
        context["first"] = False
        rows, _ = run_sweep(config)
        for row in rows:
            row["run_seconds"] = time.monotonic() - started
        entry["rows"] += rows
        flag_outliers(add_speedups(entry["rows"]))
        longest = max(longest, time.monotonic() - started)
        if profile is not None:
            entry["predictions"] = predictions(profile, sweep, entry["rows"], cores)
            entry["errors"] = error_summary(entry["predictions"])
            entry["ranking"] = rank_agreement(entry["predictions"])
        recorder.save()


def predictions(profile: Any, sweep: Sweep, rows: list[dict[str, Any]], cores: int) -> list[dict[str, Any]]:
    """:func:`compare`'s rows (measured speedup against ``local`` beside both models), each configuration
    predicted with the batches it really trained (asynchronous runs: workers × steps updates)."""
    local = [row for row in rows if row["strategy"] == "local"]
    if not any(row.get("status") == "ok" for row in local):
        return []
    table = []
    for workers in sorted({row["workers"] for row in rows}):
        for asynchronous in (False, True):
            chosen = [
                row
                for row in rows
                if row["strategy"] != "local" and row["workers"] == workers
                and row["strategy"].endswith("-async") == asynchronous
            ]  # fmt: skip
            if any(row.get("status") == "ok" for row in chosen):
                steps = sweep.steps * workers if asynchronous else sweep.steps
                table += compare(profile, local + chosen, steps=steps, cores=cores, network="loopback")
    return sorted(table, key=lambda row: (row["strategy"], row["workers"]))


def error_summary(table: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Each model's mean absolute percentage error per strategy and over all rows."""
    summary: dict[str, dict[str, float]] = {}
    for model in MODELS:
        by_strategy: dict[str, list[float]] = {}
        for row in table:
            by_strategy.setdefault(row["strategy"], []).append(row[f"{model}_error_percent"])
        summary[model] = {strategy: statistics.mean(values) for strategy, values in sorted(by_strategy.items())}
        if table:
            summary[model]["all"] = statistics.mean(row[f"{model}_error_percent"] for row in table)
    return summary


def run_plan(
    plan: Plan, json_path: Path, work: Path, data_dir: Path | None, seconds: float, header: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every sweep of ``plan`` that fits in ``seconds``, the result (``header`` first) rewritten to ``json_path``
    after every run."""
    cores = len(os.sched_getaffinity(0))
    context = {
        "deadline": time.time() + seconds, "cores": cores, "data_dir": data_dir, "work": work, "first": True,
    }  # fmt: skip
    result: dict[str, Any] = {**(header or {}), "cores": cores, "cpu_count": os.cpu_count(), "sweeps": {}}
    recorder = Recorder(json_path, result)
    for index, sweep in enumerate(plan.sweeps):
        if time.time() + context.get("last_profile_seconds", 0.0) * 1.2 + 20 > context["deadline"]:
            result["sweeps"][sweep.name] = {"status": "not started: the part's deadline", "rows": []}
            recorder.save()
            continue
        share = (context["deadline"] - time.time()) / (len(plan.sweeps) - index)
        context["sweep_deadline"] = time.time() + share if plan.shared_time else context["deadline"]
        entry = result["sweeps"][sweep.name] = {
            "workload": sweep.workload, "batch_size": sweep.batch_size, "options": sweep.options,
            "settings": sweep.settings, "steps_per_worker": sweep.steps, "warmup_steps": sweep.warmup_steps,
            "workers": [1, *sweep.workers], "strategies": list(sweep.strategies), "status": "running",
            "rows": [], "not_run": [], "predictions": [], "errors": {}, "ranking": {},
        }  # fmt: skip
        recorder.save()
        try:
            measure_sweep(sweep, plan, entry, recorder, context)
            entry["status"] = "ok"
        except Exception as exc:  # one sweep's defect must not cost the others their figures
            entry["status"] = "failed"
            entry["error"] = "".join(traceback.format_exception(exc))[-3000:]
        recorder.save()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the result, rewritten after every run")
    parser.add_argument("--work", type=Path, required=True, help="folder for the runs and profiles")
    parser.add_argument("--data-dir", type=Path, help="folder with fashion-mnist/ and ptb/ (default: found on disk)")
    parser.add_argument("--seconds", type=float, default=420.0, help="time this part may take")
    parser.add_argument("--dry-run", action="store_true", help="tiny sweeps, for this CPU and CI")
    args = parser.parse_args(argv)
    run_plan(DRY_PLAN if args.dry_run else DEVICE_PLAN, args.json, args.work, args.data_dir, args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
