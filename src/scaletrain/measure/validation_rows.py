"""The validation table's rows: each measured configuration's speedup beside both models' predictions.

A row's measured speedup is the median batches/s of its runs over the median of its framework's one-worker
reference; its predictions come from that framework's profile, and a synchronous step's measured parts are set
beside the refined model's. Kept apart from :mod:`scaletrain.measure.validate`, which profiles, runs the sweep
and writes the files, so saved runs can be predicted again (:func:`compare_measured`) without running anything.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.estimate.intervals import speedup_range
from scaletrain.estimate.models import MODELS, Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.refined import step_split
from scaletrain.measure.machine import machine_label
from scaletrain.measure.results import framework_of
from scaletrain.measure.sweep import run_steps
from scaletrain.measure.validation_report import FLAGS_APART
from scaletrain.parallel.strategies import get_strategy, parse_spec

__all__ = [
    "COLUMNS",
    "MEASURED_PARTS",
    "VALIDATED_ASYNC_BATCHES",
    "compare",
    "compare_measured",
    "predicted_row",
    "step_parts",
    "validated",
]

#: How the validations' asynchronous runs divide the batch: Downpour's, the mode every saved case measured
#: (``--async-batches split`` is predicted but not validated yet).
VALIDATED_ASYNC_BATCHES = "share"


def validated(label: str) -> Configuration:
    """The configuration a validation runs and predicts for ``label`` (its async runs: Downpour's shares)."""
    return dataclasses.replace(Configuration.parse(label), async_batches=VALIDATED_ASYNC_BATCHES)


#: the columns of a row, in ``validation.csv``
COLUMNS = (
    "workload",
    "framework",
    "network",
    "wire",
    "strategy",
    "workers",
    "runs",
    "measured_batches_per_second",
    "measured_speedup",
    "thesis_speedup",
    "refined_speedup",
    "thesis_error_percent",
    "refined_error_percent",
    # the refined model's range (scaletrain.estimate.intervals; empty where the profile measured no spread) and
    # whether the measured speedup is inside it
    "refined_speedup_low",
    "refined_speedup_high",
    "refined_inside",
    "machine",  # the profile's (machine_label)
    *(f"{source}_{part}_seconds" for part in ("compute", "wait", "exchange") for source in ("measured", "refined")),
    "flagged_runs",  # the bench's flags on the row's runs and on its reference's: "local r1: 32 % above … · …"
)


def compare(
    profiles: Profile | Mapping[str, Profile],
    results: list[dict[str, Any]],
    *,
    steps: int,
    cores: int | None,
    network: str,
    wire: str = "fp32",
) -> list[dict[str, Any]]:
    """Table rows: measured speedup (vs the median ``local`` run of the same framework) beside both models'
    predictions from that framework's profile (``profiles``: by framework; one profile: its framework's), and a
    synchronous step's parts (compute, waiting, communication) measured beside the refined model's. A foreign
    engine's one-worker ``allreduce-join`` is its one process too, so it counts as its reference as well."""
    profiles = {profiles.framework: profiles} if isinstance(profiles, Profile) else dict(profiles)
    rates: dict[tuple[str, str, int], list[float]] = defaultdict(list)
    parts: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    flags: dict[tuple[str, str, int], list[str]] = defaultdict(list)  # the bench's: a run far from its repeats
    for row in results:
        if row.get("status") == "ok":
            key = (framework_of(row), row["strategy"], int(row["workers"]))
            rates[key].append(float(row["batches_per_second"]))
            parts[key].append(row)
            flags[key] += [f"{row['strategy']} r{row['repeat']}: {row['flag']}"] if row.get("flag") else []
    unprofiled = sorted({framework for framework, _, _ in rates} - set(profiles))
    if unprofiled:
        raise ConfigError(
            f"no profile of {', '.join(unprofiled)} to predict its runs with: profile it with --framework"
        )
    table = []
    for (framework, label, workers), values in sorted(rates.items()):
        alone = ("local", "allreduce-join") if framework != "scaletrain" else ("local",)
        reference = [rate for name in alone for rate in rates.get((framework, name, 1), [])]
        if get_strategy(parse_spec(label)[0]).max_workers == 1:  # the one-process reference itself
            continue
        if not reference:
            raise ConfigError(
                f"no successful local run{'' if framework == 'scaletrain' else ' of ' + framework} to compare against; "
                "see the bench report for the failures"
            )
        profile = profiles[framework]
        measured = statistics.median(values) / statistics.median(reference)
        flagged = flags[(framework, label, workers)] + [flag for name in alone for flag in flags[(framework, name, 1)]]
        row = {
            "framework": framework,
            "measured_batches_per_second": statistics.median(values),
            "flagged_runs": FLAGS_APART.join(flagged),
        }
        row.update(
            predicted_row(
                profile, label, workers, measured, len(values), steps=steps, cores=cores, network=network, wire=wire
            )
        )
        row.update(step_parts(profile, validated(label), workers, parts[(framework, label, workers)], cores=cores))
        table.append(row)
    return table


def predicted_row(
    profile: Profile,
    label: str,
    workers: int,
    measured: float,
    runs: int,
    *,
    steps: int,
    cores: int | None,
    network: str,
    wire: str,
) -> dict[str, Any]:
    """One configuration's measured speedup beside both models' predictions from ``profile`` and their errors, the
    refined model's range and whether the measured speedup is inside it (None where the profile has no spread)."""
    configuration = validated(label)
    # the batches the run trained: a join step is N batches, a split step and an asynchronous update one
    batches = run_steps(steps, configuration.sync, workers) * (workers if configuration.sync == "join" else 1)
    row: dict[str, Any] = {
        "workload": profile.workload,
        "network": network,
        "wire": wire,
        "strategy": label,
        "workers": workers,
        "runs": runs,
        "measured_speedup": measured,
    }
    for model in MODELS:
        predicted = predicted_speedup(model, profile, configuration, workers, batches=batches, cores=cores)
        row[f"{model}_speedup"] = predicted
        row[f"{model}_error_percent"] = abs(predicted - measured) / measured * 100
    ranged = speedup_range(profile, configuration, workers, batches=batches, cores=cores)
    low, high = (ranged[0], ranged[2]) if ranged is not None else (None, None)
    row["refined_speedup_low"], row["refined_speedup_high"] = low, high
    row["refined_inside"] = None if ranged is None else low <= measured <= high
    row["machine"] = machine_label(profile.machine)
    return row


def compare_measured(
    profile: Profile,
    measured: Mapping[tuple[str, int], tuple[float, int]],
    *,
    steps: int,
    network: str,
    wire: str = "fp32",
    cores: int | None = None,
) -> list[dict[str, Any]]:
    """Rows from speedups measured before (``(strategy, workers) → (speedup, runs)``), predicted with today's
    models from the profile they were measured with; ``cores``: the machine's (default: this one's)."""
    cores = cores or os.cpu_count() or 1
    return [
        predicted_row(profile, label, workers, speedup, runs, steps=steps, cores=cores, network=network, wire=wire)
        for (label, workers), (speedup, runs) in sorted(measured.items())
    ]


#: a run's per-step figures (``summary.json``) → the refined model's part they are set beside
MEASURED_PARTS = {
    "compute": "compute_seconds_per_step",
    "wait": "wait_seconds_per_step",
    "exchange": "communication_seconds_per_step",
}


def step_parts(
    profile: Profile, configuration: Configuration, workers: int, runs: list[dict[str, Any]], *, cores: int | None
) -> dict[str, float | None]:
    """``measured_X_seconds`` (median over the runs; None where none reported it) and ``refined_X_seconds`` for
    X in compute, wait, exchange: a step's parts (:func:`~scaletrain.estimate.refined.step_split`), so a wrong
    term shows, not only a wrong total. The measured exchange is the communication alone; the predicted one
    holds the optimizer step too (under 1 % of a step in every profile here)."""
    split = step_split(
        profile,
        strategy=configuration.strategy,
        server=configuration.server,
        sync=configuration.sync,
        workers=workers,
        cores=cores,
    )
    result: dict[str, float | None] = {}
    for part, field_name in MEASURED_PARTS.items():
        values = [float(run[field_name]) for run in runs if run.get(field_name) is not None]
        result[f"measured_{part}_seconds"] = statistics.median(values) if values else None
        result[f"refined_{part}_seconds"] = split[part]
    return result
