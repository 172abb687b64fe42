"""``scaletrain bench``: real training runs over a grid of workers × strategies × batch sizes.

Every configuration runs through :func:`scaletrain.train`, the same code as ``scaletrain train``,
in its own folder under ``OUT/runs/``. Rows are appended to ``results.jsonl`` as runs finish, so an
interrupted sweep keeps what it measured; a run that fails is recorded with its error and the sweep
goes on. Before the first measured run, a short unmeasured warm-up run of the same configuration
brings the machine to the state the later runs find it in: without it the first run of a sweep was
measured up to 1.9× slower than the same training later in the sweep.

>>> parse_strategy("ps-distributed-none")
('ps', 'sharded', 'async')
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scaletrain.engines.launch import check_engine, run_engine
from scaletrain.engines.layouts import FOREIGN_STRATEGIES, engine_run, foreign_mode
from scaletrain.engines.prepare_text import FOLLOWED_OPTIONS
from scaletrain.engines.registry import ENGINES, FRAMEWORKS
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.measure.machine import machine_info
from scaletrain.parallel.preloaded import start_fresh
from scaletrain.parallel.run import make_config, run_training
from scaletrain.parallel.strategies import Layout, get_strategy, parse_spec, strategy_flags
from scaletrain.plugins import load_plugins

__all__ = ["Run", "SweepConfig", "parse_strategy", "plan_runs", "run_settings", "run_steps", "run_sweep"]

DEFAULT_STEPS = 100
#: the run settings a foreign engine follows too (scaletrain.engines.prepare.EngineRun)
FOREIGN_SETTINGS = ("lr", "momentum", "weight_decay", "clip_norm", "seed", "timeout")
WARMUP_RUN_STEPS = 30  # steps of the unmeasured warm-up run (fewer when the measured runs are shorter)
CHILD_POLL_SECONDS = 0.5


def parse_strategy(spec: str) -> tuple[str, str, str]:
    """A strategy spec (``local``, ``allreduce-join``, ``ps-central-async`` …) → (strategy, server, sync).

    >>> parse_strategy("ps-sharded-split")
    ('ps', 'sharded', 'split')
    """
    return parse_spec(spec)


def label(strategy: str, server: str, sync: str) -> str:
    return Layout(strategy, 1, server, sync).label


@dataclass(frozen=True)
class SweepConfig:
    """The grid and the settings every run of a sweep shares."""

    workload: str
    out: Path
    workers: tuple[int, ...] = (1, 2)
    strategies: tuple[str, ...] = ("allreduce-join",)
    batch_sizes: tuple[int, ...] | None = None  # None: the workload's default batch
    steps: int | None = None
    epochs: int | None = None
    repeats: int = 1
    warmup_steps: int = 5
    threads_per_worker: int = 1
    network: str | None = None
    data_dir: Path | None = None
    options: dict[str, str] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=dict)  # other TrainConfig fields (lr, momentum, ...)
    max_workers: int | None = None
    warmup_run: bool = True  # a short unmeasured run before the first measured one (of each framework)
    frameworks: tuple[str, ...] = ("scaletrain",)  # and foreign engines: tensorflow, mxnet (scaletrain.engines)
    local_only_at: tuple[int, ...] = ()  # counts at which only a one-process strategy runs (a validation's reference)

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ConfigError(f"--repeats must be ≥ 1, got {self.repeats}")
        if not self.workers or min(self.workers) < 1:
            raise ConfigError(f"--workers needs whole numbers ≥ 1, got {self.workers}")
        if self.steps is not None and self.epochs is not None:
            raise ConfigError("give --steps or --epochs, not both")
        for spec in self.strategies:
            parse_strategy(spec)
        unknown = [name for name in self.frameworks if name not in FRAMEWORKS]
        if unknown or not self.frameworks:
            raise ConfigError(f"--framework takes {', '.join(FRAMEWORKS)} (comma-separated), got {','.join(unknown)}")
        foreign = [name for name in self.frameworks if name != "scaletrain"]
        # the engines train on the CPU (tensorflow-cpu, MXNet's CPU build) with whole batches per asynchronous
        # update: --device cpu and --async-batches share are what they do too
        alike = (("device", "cpu"), ("async_batches", "share"))
        followed = {key for key, value in self.settings.items() if key in FOREIGN_SETTINGS or (key, value) in alike}
        unread = [f"--{key.replace('_', '-')}" for key in sorted(self.settings) if key not in followed]
        given = {key.replace("-", "_") for key in self.options}
        unread += ["-o"] if given - set(FOLLOWED_OPTIONS.get(self.workload, ())) else []
        if foreign and unread:
            it = "they set" if len(unread) > 1 else "it sets"
            raise ConfigError(
                f"{', '.join(unread)}: {it} how scaletrain trains, and {' and '.join(foreign)} would not follow: "
                "compare the frameworks without, or bench scaletrain alone with it"
            )


@dataclass(frozen=True)
class Run:
    """One configuration and repeat of a sweep."""

    strategy: str
    server: str
    sync: str
    workers: int
    batch_size: int | None
    repeat: int
    framework: str = "scaletrain"

    @property
    def label(self) -> str:
        return label(self.strategy, self.server, self.sync)

    @property
    def foreign(self) -> bool:
        return self.framework != "scaletrain"

    def folder(self) -> str:
        batch = self.batch_size if self.batch_size is not None else "default"
        prefix = f"{self.framework}-" if self.foreign else ""
        return f"{prefix}{self.label}-b{batch}-w{self.workers}-r{self.repeat}"

    def describe(self) -> str:
        """``allreduce-join, batch 64, 2 workers`` (``tensorflow allreduce-join, …``) — for progress lines."""
        batch = self.batch_size if self.batch_size is not None else "default"
        prefix = f"{self.framework} " if self.foreign else ""
        return f"{prefix}{self.label}, batch {batch}, {self.workers} worker{'s' if self.workers > 1 else ''}"


def plan_runs(config: SweepConfig) -> tuple[list[Run], list[str]]:
    """Every run of the sweep, repeats interleaved (so slow drift spreads over all configurations),
    and notes on what was left out (``local`` beyond one worker, counts over ``max_workers``)."""
    notes = []
    workers = sorted(set(config.workers))
    if config.max_workers is not None and max(workers) > config.max_workers:
        dropped = [n for n in workers if n > config.max_workers]
        workers = [n for n in workers if n <= config.max_workers]
        notes.append(
            f"worker counts {', '.join(map(str, dropped))} left out: this machine runs at most "
            f"{config.max_workers} (one process per core, as the thesis's one-vCPU nodes; change with --max-workers)"
        )
    batches = config.batch_sizes or (None,)
    runs = []
    unrun: dict[tuple[str, str], str] = {}  # (framework, strategy) its engine does not run for this workload
    for repeat in range(config.repeats):
        for framework, spec, batch, count in itertools.product(config.frameworks, config.strategies, batches, workers):
            strategy, server, sync = parse_strategy(spec)
            most = get_strategy(strategy).max_workers
            if count in config.local_only_at and most != 1:  # only the one-process reference there
                continue
            if most is not None and count > most:
                continue
            run = Run(strategy, server, sync, count, batch, repeat, framework)
            if run.foreign and foreign_mode(run.label, count) is None:
                continue
            limited = dict(ENGINES[framework].workload_modes).get(config.workload) if run.foreign else None
            if limited is not None and foreign_mode(run.label, count)[0] not in limited:
                unrun.setdefault((framework, spec), " and ".join(limited))
                continue
            runs.append(run)
    for (framework, spec), modes in unrun.items():
        notes.append(f"{framework} left out {spec}: it trains {config.workload} in {modes} mode only")
    for framework in config.frameworks:
        missing = [spec for spec in config.strategies if spec not in FOREIGN_STRATEGIES]
        if framework != "scaletrain" and missing:
            notes.append(
                f"{framework} left out {', '.join(missing)}: a foreign engine runs {', '.join(FOREIGN_STRATEGIES)}"
            )
    for spec in config.strategies:
        most = get_strategy(parse_strategy(spec)[0]).max_workers
        if most is not None and any(n > most for n in workers):
            notes.append(f"{spec} runs only at 1 worker" if most == 1 else f"{spec} runs only up to {most} workers")
    return runs, notes


def run_sweep(
    config: SweepConfig,
    *,
    on_row: Callable[[dict[str, Any]], None] | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Run every configuration; returns the result rows (without speedups) and the notes.

    ``progress`` receives a line when the warm-up and each run start (``[3/8] ps-central-join, batch 64,
    2 workers …``); ``on_row`` receives each row as its run ends.
    """
    runs, notes = plan_runs(config)
    for framework in {run.framework for run in runs if run.foreign}:
        check_engine(framework, config.workload)  # installed, and it trains this workload: before any run
    machine = machine_info(config.network)
    say = progress or (lambda line: None)
    warmed_up = set() if config.warmup_run else set(config.frameworks)  # each framework's first run warms up
    rows = []
    for index, run in enumerate(runs, 1):
        folder = config.out / "runs" / run.folder()
        settings = _settings(config, run, folder)
        try:
            if (folder / "summary.json").exists():
                say(f"[{index}/{len(runs)}] {run.describe()}: measured before, kept")
                summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
            else:
                if run.framework not in warmed_up:
                    _warm_up(config, run, settings, say)
                    warmed_up.add(run.framework)
                repeat = f", repeat {run.repeat + 1} of {config.repeats}" if config.repeats > 1 else ""
                say(f"[{index}/{len(runs)}] {run.describe()}{repeat} …")
                summary = _train(config, run, settings)
            row = _row(config, run, summary, machine)
            if row["batches_per_second"] is None:
                row["status"] = "failed"
                row["error"] = "every step was a warm-up step; raise --steps or lower --warmup-steps"
        except ScaletrainError as exc:
            row = {**_identity(config, run, machine), "status": "failed", "error": str(exc)}
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows, notes


def run_steps(steps: int, sync: str, workers: int) -> int:
    """The optimizer steps a run of the sweep trains for ``--steps``: those, or for asynchronous updates N times as
    many, so each worker trains and measures the steps a synchronous worker does past the same warm-up (an
    asynchronous run's steps are its updates, shared among its workers). With them shared, a short run measured
    mostly its start, where the workers push in phase and queue (LeNet b256, 2 workers, 1 Gbit/s: 1.249 measured
    over 10 steps a worker, 1.307 over 20 after 20 warm-up).

    >>> run_steps(30, "join", 2), run_steps(30, "async", 2)
    (30, 60)
    """
    return steps * workers if sync == "async" else steps


def run_settings(config: SweepConfig, run: Run) -> dict[str, Any]:
    """The training settings of one run wherever it runs: here (:func:`run_sweep`) or in a cluster's
    pods (:mod:`scaletrain.deploy.sweep`); without the run folder and the emulated network.

    >>> config = SweepConfig("lenet", Path("out"), strategies=("ps-central-async",), batch_sizes=(64,))
    >>> settings = run_settings(config, plan_runs(config)[0][-1])
    >>> [settings[key] for key in ("strategy", "server", "sync", "workers", "batch_size", "steps")]
    ['ps', 'central', 'async', 2, 64, 200]
    """
    steps = config.steps if config.steps is not None or config.epochs is not None else DEFAULT_STEPS
    steps = run_steps(steps, run.sync, run.workers) if steps is not None else None
    # what only some runs of the grid read goes to those (a run refuses a setting it would not read)
    others = {keyword for keyword, (owner, _) in strategy_flags().items() if owner != run.strategy}
    unread = others | (set() if run.server else {"server"})
    if run.sync != "async":
        unread |= {"async_compensation", "async_batches", "max_staleness"}
    if run.sync == "async" or run.workers == 1:  # no global batch shared by several workers
        unread.add("sync_batchnorm")
    if not get_strategy(run.strategy).overlaps:  # buckets reduced during backward
        unread |= {"overlap", "bucket_mb"}
    # beside the engines' asynchronous runs (Downpour's: a whole batch per update), scaletrain's do the same work
    alike = {"async_batches": "share"} if run.sync == "async" and len(config.frameworks) > 1 else {}
    return {
        **alike,
        **{key: value for key, value in config.settings.items() if key not in unread},
        "workers": run.workers,
        "strategy": run.strategy,
        **({"server": run.server} if run.server else {}),  # a strategy without servers names none
        "sync": run.sync,
        "batch_size": run.batch_size,
        "steps": steps,
        "epochs": config.epochs,
        "warmup_steps": config.warmup_steps,
        "threads": config.threads_per_worker,
        "data_dir": config.data_dir,
        "options": dict(config.options),
        "progress": "off",
        "tensorboard": False,
    }


def _settings(config: SweepConfig, run: Run, folder: Path) -> dict[str, Any]:
    """The :func:`scaletrain.train` settings of one run here."""
    alone = Layout(run.strategy, run.workers, run.server, run.sync).world_size == 1
    return {
        **run_settings(config, run),
        # a run of one process has no links to emulate: it trains as it would on any network
        "network": None if alone else config.network,
        "out": folder,
        # A sweep run again in the same folder continues: finished runs are kept, an interrupted
        # one resumes from its checkpoint.
        "resume": (folder / "checkpoint.pt").exists(),
    }


def _warm_up(config: SweepConfig, run: Run, settings: dict[str, Any], say: Callable[[str], None]) -> None:
    """Train ``run``'s configuration briefly in a throw-away folder; nothing of it is recorded."""
    steps = min(settings["steps"] or WARMUP_RUN_STEPS, WARMUP_RUN_STEPS)
    say(f"warm-up: {run.describe()}, {steps} steps, not measured …")
    with tempfile.TemporaryDirectory(prefix="scaletrain-warm-up-") as folder:
        warm = {**settings, "steps": steps, "epochs": None, "warmup_steps": 0, "out": Path(folder), "resume": False}
        try:
            _train(config, run, warm)
        except ScaletrainError as exc:
            say(f"warm-up failed (the measured runs go on): {exc}")


def _train(config: SweepConfig, run: Run, settings: dict[str, Any]) -> dict[str, Any]:
    """One run's summary: scaletrain's own training in a fresh process, or a foreign engine's processes."""
    if not run.foreign:
        return train_in_fresh_process(config.workload, settings)
    foreign = engine_run(run.framework, config.workload, run.label, run.workers, settings)
    return run_engine(foreign, settings["out"], network=settings["network"], timeout=settings.get("timeout") or 60.0)


def train_in_fresh_process(workload: str, settings: dict[str, Any]) -> dict[str, Any]:
    """``scaletrain.train`` in a fresh process, so every run of a sweep starts alike.

    A one-process run would otherwise train inside this long-lived process, measured 10–20 % slower
    per step here than a fresh process, which made one-worker references look slow next to
    multi-process runs (whose processes are always fresh). The process is a fork of the preloaded
    server, which has imported but never trained (:func:`~scaletrain.parallel.preloaded.start_fresh`).
    """
    receiver, sender = multiprocessing.Pipe(duplex=False)
    child = start_fresh(_train_child, (workload, settings, sender))
    sender.close()
    try:
        while not receiver.poll(CHILD_POLL_SECONDS):
            if not child.is_alive():
                raise ScaletrainError(f"the training process died with exit code {child.exitcode}")
        kind, payload = receiver.recv()
    except EOFError:
        raise ScaletrainError(f"the training process died with exit code {child.exitcode}") from None
    finally:
        child.join(CHILD_POLL_SECONDS * 10)
        if child.is_alive():
            child.kill()
    if kind == "error":
        raise ScaletrainError(payload)
    return payload


def _train_child(workload: str, settings: dict[str, Any], sender: Any) -> None:
    try:
        load_plugins()  # a fresh interpreter: the registries as the parent had them from SCALETRAIN_PLUGINS
        sender.send(("ok", run_training(make_config(workload, **settings))))
    except ScaletrainError as exc:
        sender.send(("error", str(exc)))
    except BaseException as exc:
        sender.send(("error", f"{type(exc).__name__}: {exc}"))
        raise


def _identity(config: SweepConfig, run: Run, machine: dict[str, Any]) -> dict[str, Any]:
    return {
        "workload": config.workload,
        "framework": run.framework,
        "strategy": run.label,
        "strategy_kind": run.strategy,
        "server": Layout(run.strategy, 1, run.server, run.sync).server,
        "sync": run.sync,
        "workers": run.workers,
        "batch_size": run.batch_size,
        "repeat": run.repeat,
        "threads_per_worker": config.threads_per_worker,
        **machine,
        "run_dir": str(config.out / "runs" / run.folder()),
    }


def _row(config: SweepConfig, run: Run, summary: dict[str, Any], machine: dict[str, Any]) -> dict[str, Any]:
    identity = _identity(config, run, machine)
    identity["batch_size"] = summary["batch_size"]
    metric = summary["metric"]
    # One epoch in samples: a join step consumes a global batch of workers × batch_size.
    layout = Layout(run.strategy, run.workers, run.server, run.sync)
    join = layout.worker_plan(layout.worker_ranks()[0]).global_batch_factor > 1
    epoch_samples = summary["steps_per_epoch"] * summary["batch_size"] * (run.workers if join else 1)
    rate = summary["samples_per_second"]
    return {
        **identity,
        "status": "ok",
        "batches_per_second": summary["batches_per_second"],
        "samples_per_second": summary["samples_per_second"],
        "compute_seconds_per_step": summary.get("compute_seconds_per_step"),
        "communication_seconds_per_step": summary.get("communication_seconds_per_step"),
        "wait_seconds_per_step": summary.get("wait_seconds_per_step"),
        "data_seconds_per_step": summary.get("data_seconds_per_step"),
        "train_seconds": summary.get("train_seconds"),
        "wall_seconds": summary["wall_seconds"],
        "steps": summary["steps"],
        "steps_per_epoch": summary["steps_per_epoch"],
        "epoch_seconds": epoch_samples / rate if rate else None,
        "metric": metric,
        "quality": summary[metric],
        "quality_warning": summary.get("quality_warning"),
    }
