"""Validation: predict with both models from a profile, then run the real sweep and compare.

The profile is measured first and the predictions are fixed before any validation run starts, so
no constant is fitted to the runs a model is judged on. The runs are ``scaletrain bench`` runs (the
same code as ``scaletrain train``) with ``local`` at one worker as the reference: measured speedup =
median batches/s of the configuration / median batches/s of ``local``, the quantity both models
predict (eq. 4.23: D·t_grad / t_train). Error = |predicted − measured| / measured.

With ``wire`` (and ``wire_options``, ``precision``, ``device``) the profile is measured and every run
trains as ``scaletrain train`` would with them: a compressed validation predicts from the codec's
encoded bytes and its measured compute (``codec_seconds``), and its rows say the wire.

With ``frameworks`` beyond scaletrain (``tensorflow``, ``mxnet``), each foreign engine is profiled with its own
program (``profile-FRAMEWORK.json``, :mod:`scaletrain.measure.engine_profile`), the sweep runs it beside
scaletrain's (the strategies it runs), and its rows (``framework``) are predicted from its own profile and
measured against its own one-worker run.

Writes into ``out``: ``profile.json``, ``bench/`` (runs, results, report), ``validation.csv``,
``validation.json``, ``validation.md`` and ``validation.png``. Each row holds the refined model's range beside its
prediction (:mod:`scaletrain.estimate.intervals`) and whether the measured speedup is inside it; the report gives
the share inside (coverage) beside the mean error, and the machine the profile was measured on. The table's rows
(measured beside predicted) are built by :mod:`scaletrain.measure.validation_rows`, the report by
:mod:`scaletrain.measure.validation_report`.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig
from scaletrain.engines.registry import FRAMEWORKS
from scaletrain.errors import ConfigError
from scaletrain.estimate.models import Configuration, predicted_speedup
from scaletrain.estimate.profile import Profile
from scaletrain.measure.bench import run_bench
from scaletrain.measure.machine import machine_label
from scaletrain.measure.profile import EXCHANGES, ProfileConfig, check_split, run_profile
from scaletrain.measure.ranking import RANK_NOISE, coverage, mean_errors, rank_agreement
from scaletrain.measure.results import framework_of
from scaletrain.measure.sweep import SweepConfig
from scaletrain.measure.validation_report import markdown, wire_label, wire_suffix
from scaletrain.measure.validation_rows import COLUMNS, VALIDATED_ASYNC_BATCHES, compare, validated
from scaletrain.parallel.strategies import check_strategy_settings, get_strategy
from scaletrain.workloads import create_workload

__all__ = [
    "DEFAULT_STRATEGIES",
    "ValidationConfig",
    "compare",
    "mean_errors",
    "probed_exchanges",
    "rank_agreement",
    "run_validation",
]

#: The training settings ``estimate --validate`` passes to its runs (and its profile's t_update).
RUN_SETTINGS = ("lr", "momentum", "optimizer", "optimizer_options")

DEFAULT_STRATEGIES = (
    "allreduce-join",
    "ps-central-join",
    "ps-central-split",
    "ps-central-async",
    "ps-sharded-join",
    "ps-sharded-async",
)


@dataclass(frozen=True)
class ValidationConfig:
    """The sweep to validate against (workers share this machine's cores)."""

    workload: str
    out: Path
    workers: tuple[int, ...] = (1, 2)
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    batch_size: int | None = None
    steps: int = 40
    warmup_steps: int = 5
    repeats: int = 3
    network: str | None = None
    options: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # RUN_SETTINGS for the runs
    data_dir: Path | None = None
    threads_per_worker: int = 1
    launches: int = 3  # fresh processes the profile pools each timing over
    wire: str = "fp32"  # the runs' --wire, and what the profile sizes and times
    wire_options: dict[str, str] = field(default_factory=dict)  # its -W options
    precision: str = "fp32"  # the runs' --precision, and the profile's autocast
    device: str = "cpu"  # where the runs train and the profile times t_grad
    frameworks: tuple[str, ...] = ("scaletrain",)  # and foreign engines, each profiled with its own program

    def __post_init__(self) -> None:
        unknown = [name for name in self.frameworks if name not in FRAMEWORKS]
        if unknown or not self.frameworks:
            raise ConfigError(f"--framework takes {', '.join(FRAMEWORKS)} (comma-separated), got {','.join(unknown)}")
        for spec in self.strategies:
            Configuration.parse(spec)
        if any(n < 1 for n in self.workers):
            raise ConfigError(f"--workers must be ≥ 1 each, got {','.join(map(str, self.workers))}")
        if self.repeats < 1 or self.launches < 1:
            raise ConfigError(f"--runs and --launches must be ≥ 1, got {self.repeats} and {self.launches}")
        # The runs' own settings are checked as every training run's are, now rather than after profiling.
        for spec in self.strategies:  # a codec one of the strategies cannot carry: one line before profiling
            check_strategy_settings(
                TrainConfig(
                    self.workload,
                    strategy=Configuration.parse(spec).strategy,
                    steps=self.steps,
                    warmup_steps=self.warmup_steps,
                    batch_size=self.batch_size,
                    threads=self.threads_per_worker,
                    **self.run_settings(),
                    **{key: value for key, value in self.settings.items() if key in RUN_SETTINGS},
                )
            )
        if self.steps <= self.warmup_steps:
            raise ConfigError(f"--steps ({self.steps}) must exceed --warmup-steps ({self.warmup_steps})")
        # the profile times t_grad at batch/N for every N > 1 here: refused now, not after the cases before this one
        batch = self.batch_size or create_workload(self.workload, self.options).defaults.batch_size
        check_split(batch, tuple(self.workers), flag="workers")

    def run_settings(self) -> dict[str, Any]:
        """The device every run trains on (the profile's), and the wire and precision not at their defaults."""
        given = {"wire": self.wire, "wire_options": dict(self.wire_options) or None, "precision": self.precision}
        defaults = {"wire": "fp32", "wire_options": None, "precision": "fp32"}
        return {"device": self.device, **{key: value for key, value in given.items() if value != defaults[key]}}


def probed_exchanges(strategies: tuple[str, ...]) -> tuple[str, ...]:
    """The exchanges a profile times for these strategies: those their estimator terms read (``probe`` for a
    synchronous step, ``network_probe`` for asynchronous updates).

    >>> probed_exchanges(("allreduce-join", "ps-central-async", "ps-sharded-async"))
    ('allreduce', 'central-async')
    """
    kinds = set()
    for spec in strategies:
        configuration = Configuration.parse(spec)
        terms = get_strategy(configuration.strategy).estimator_terms(configuration.server)
        if terms is not None:
            kinds.add(terms.network_probe if configuration.sync == "async" else terms.probe)
    return tuple(kind for kind in EXCHANGES if kind in kinds)


def run_validation(config: ValidationConfig) -> dict[str, Any]:
    """Profile, predict, run the sweep, compare; returns the table rows and both models' errors."""
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    splits = tuple(n for n in config.workers if n > 1)
    profiles = {
        name: run_profile(
            ProfileConfig(
                config.workload,
                batch_size=config.batch_size,
                framework=name,
                exchange_counts=splits,
                concurrency=min(max(config.workers), cores),
                network=config.network,
                threads=config.threads_per_worker,
                launches=config.launches,
                data_dir=config.data_dir,
            ),
            out=out / f"profile-{name}.json",
        )
        for name in config.frameworks
        if name != "scaletrain"
    }
    profile = run_profile(
        ProfileConfig(
            config.workload,
            batch_size=config.batch_size,
            options=dict(config.options),
            split_workers=splits,
            # the exchanges of the strategies validated, among as many workers as the runs have
            exchange_counts=splits,
            exchanges=probed_exchanges(config.strategies),
            concurrency=min(max(config.workers), cores),
            network=config.network,
            threads=config.threads_per_worker,
            launches=config.launches,
            lr=config.settings.get("lr"),
            momentum=config.settings.get("momentum"),
            optimizer=config.settings.get("optimizer"),
            optimizer_options=dict(config.settings.get("optimizer_options") or {}),
            data_dir=config.data_dir,
            wire=config.wire,
            wire_options=dict(config.wire_options),
            precision=config.precision,
            device=config.device,
        ),
        out=out / "profile.json",
    )
    bench = run_bench(
        SweepConfig(
            workload=config.workload,
            out=out / "bench",
            workers=tuple(sorted({1, *config.workers})),
            local_only_at=() if 1 in config.workers else (1,),  # the reference, even where no strategy runs at 1
            strategies=("local", *config.strategies),
            batch_sizes=(profile.batch_size,),
            steps=config.steps,
            warmup_steps=config.warmup_steps,
            repeats=config.repeats,
            threads_per_worker=config.threads_per_worker,
            network=config.network,
            data_dir=config.data_dir,
            options=dict(config.options),
            settings={**config.settings, **config.run_settings(), "async_batches": VALIDATED_ASYNC_BATCHES},
            frameworks=config.frameworks if "scaletrain" in config.frameworks else ("scaletrain", *config.frameworks),
        ),
        title=f"Validation runs of {config.workload}",
    )
    network = config.network or "loopback"
    wire = wire_label(config.wire, config.wire_options)
    rows = compare(
        {"scaletrain": profile, **profiles}, bench["rows"], steps=config.steps, cores=cores, network=network, wire=wire
    )
    return write_validation(profile, rows, config.strategies, out, others=list(profiles.values()))


def write_validation(
    profile: Profile,
    rows: list[dict[str, Any]],
    strategies: tuple[str, ...],
    out: Path,
    *,
    others: list[Profile] | None = None,
) -> dict[str, Any]:
    """Write the table, its JSON, report and plot (``profile``'s curves); ``others``: the foreign engines' profiles."""
    others = others or []
    errors = mean_errors(rows)
    with (out / "validation.csv").open("w", newline="", encoding="utf-8") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    ranking = rank_agreement(rows)
    result = {
        "rows": rows,
        "mean_absolute_percentage_error": errors,
        "refined_coverage": coverage(rows),  # the share of measured speedups inside the refined model's ranges
        "ranking": ranking,
        "machine": machine_label(profile.machine),
        "profile": profile.to_json(),
        "engine_profiles": {p.framework: p.to_json() for p in others},
    }
    (out / "validation.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    measured = {
        (row["strategy"], row["workers"]): row["measured_speedup"]
        for row in rows
        if framework_of(row) == profile.framework
    }
    max_workers = max((row["workers"] for row in rows), default=1)
    cores = os.cpu_count() or 1

    def predict(model: str, label: str, workers: int) -> float:
        batches = 128
        return predicted_speedup(model, profile, validated(label), workers, batches=batches, cores=cores)

    from scaletrain.estimate.plots import plot_curves  # matplotlib only when drawing

    picture = plot_curves(
        out / "validation.png",
        labels=list(strategies),
        max_workers=max_workers,
        predict=predict,
        measured=measured,
        title=f"{profile.workload}, batch {profile.batch_size}, {profile.network or 'loopback'}{wire_suffix(profile)}: "
        "predicted vs measured",
    )
    (out / "validation.md").write_text(
        markdown(profile, rows, errors, ranking, RANK_NOISE, others=others), encoding="utf-8"
    )
    return {**result, "picture": picture, "out": out}
