"""Run configuration: a validated dataclass, TOML loading, and the precedence rule.

Precedence, lowest first: the workload's defaults < the ``--config`` TOML file < command-line flags.
A field left at ``None`` means "use the workload's default" and is filled by :func:`resolve`.

Example::

    >>> from scaletrain.config import TrainConfig
    >>> TrainConfig(workload="lenet", epochs=2, batch_size=32).batch_size
    32
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError

__all__ = [
    "TrainConfig",
    "default_strategy",
    "from_json_dict",
    "load_toml",
    "merge",
    "to_json_dict",
]

PROGRESS_MODES = ("auto", "bar", "plain", "off")
FLOAT32_MAX = 3.4028234663852886e38
#: ``divergence``'s default: a loss ten thousand times its first values has left training behind.
DIVERGENCE_FACTOR = 1e4
#: How the rate moves over the run (``--lr-schedule``): ``step``, the per-epoch decay of ``lr_decay``
#: (constant at its default 1), or per update ``constant``, ``cosine`` (to 0) and ``linear`` (to 0).
LR_SCHEDULES = ("step", "constant", "cosine", "linear")


#: the first steps of each process a run's throughput leaves out (``--warmup-steps``; :mod:`scaletrain.train.meter`)
WARMUP_STEPS = 5


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; ``None`` fields take the workload's default. Each field is the
    ``scaletrain train`` flag of its name (``batch_size`` is ``--batch-size``; ``scaletrain train --help`` and
    docs/training.md say what each does), a key of a ``--config`` file and a keyword of :func:`scaletrain.train`.

    The groups: what is trained and for how long (``workload``, ``options``, ``epochs``, ``steps``); the
    optimization (``optimizer`` with ``optimizer_options``, ``lr``, ``momentum``, ``weight_decay``,
    ``clip_norm``, ``lr_schedule``, ``lr_warmup``, ``lr_decay``, ``accumulate``, ``divergence``); the processes
    (``workers``, ``strategy`` with its ``strategy_options``, ``server``, ``sync``, ``timeout``, the elastic
    ``min_workers``/``max_workers``/``join``, ``nodefile``/``index``, ``network``); the techniques
    (``technique`` with ``technique_options``, and the standing ones whose classes declare their own fields:
    ``precision``, ``loss_scale``, ``memory_format``, ``ghost_batch``, ``sync_batchnorm``, ``batch_budget`` …);
    the wire (``wire``, ``wire_options``, ``error_feedback``, ``overlap``, ``bucket_mb``); ``device`` and
    ``compile``; and the records (``out``, ``log_every``, ``checkpoint_every``, ``progress``, ``tensorboard``).

    A whole strategy spec (``ps-central-async``) is split into ``strategy``, ``server`` and ``sync`` by
    :func:`scaletrain.make_config`, which also lets the strategy judge its options, the wire and ``overlap``:
    this class cannot see strategies. The checks here build nothing.
    """

    workload: str
    epochs: int | None = None
    steps: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    momentum: float | None = None
    weight_decay: float = 0.0
    clip_norm: float | None = None
    divergence: float | str = DIVERGENCE_FACTOR
    lr_decay: float = 1.0
    lr_decay_start: int = 0
    lr_schedule: str | None = None
    lr_warmup: int | None = None
    optimizer: str | None = None
    optimizer_options: dict[str, Any] = field(default_factory=dict)
    accumulate: int = 1
    seed: int = 0
    threads: int | None = None
    data_dir: Path | None = None
    out: Path | None = None
    resume: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    log_every: int = 50
    checkpoint_every: int = 200
    warmup_steps: int = WARMUP_STEPS
    progress: str = "auto"
    tensorboard: bool = True
    download: bool = True
    loader_workers: int | None = None
    workers: int = 1
    strategy: str | None = None
    server: str = "central"
    sync: str = "join"
    timeout: float = 60.0
    min_workers: int | None = None
    max_workers: int | None = None
    join: bool = False
    nodefile: Path | None = None
    index: int | None = None
    network: str | None = None
    strategy_options: dict[str, Any] = field(default_factory=dict)
    technique: str | None = None
    technique_options: dict[str, Any] = field(default_factory=dict)
    precision: str = "fp32"
    loss_scale: str | float | None = None
    wire: str = "fp32"
    wire_options: dict[str, Any] = field(default_factory=dict)
    error_feedback: bool = False
    overlap: bool = False
    bucket_mb: float = 0.25
    device: str = "auto"
    memory_format: str = "auto"
    ghost_batch: int | None = None
    sync_batchnorm: bool = False
    batch_budget: str | None = None
    batch_scaling: str = "linear"
    batch_warmup: int = 0
    compile: bool = False

    def __post_init__(self) -> None:
        for name in ("data_dir", "out", "nodefile"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))
        positive = (
            "epochs",
            "steps",
            "batch_size",
            "threads",
            "log_every",
            "checkpoint_every",
            "workers",
            "accumulate",
        )
        for name in positive:
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise ConfigError(f"{name} must be a whole number ≥ 1, got {value!r}")
        workers = self.loader_workers
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 0):
            raise ConfigError(
                f"loader_workers must be a whole number ≥ 0 (0 reads in the training process), got {workers!r}"
            )
        for name in ("lr", "momentum", "weight_decay", "clip_norm", "lr_decay", "timeout"):
            value = getattr(self, name)
            # Beyond float32's range a value overflows the first time it meets a tensor.
            if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
                raise ConfigError(f"{name} must be a finite number (at most {FLOAT32_MAX:.3g}), got {value!r}")
        if self.lr is not None and not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr!r}")
        if self.clip_norm is not None and not self.clip_norm >= 0:
            raise ConfigError(f"clip_norm must be ≥ 0 (0 turns clipping off), got {self.clip_norm!r}")
        if self.momentum is not None and not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be ≥ 0, got {self.weight_decay!r}")
        if not 0.0 < self.lr_decay <= 1.0:
            raise ConfigError(f"lr_decay must be in (0, 1], got {self.lr_decay!r}")
        if self.lr_decay_start and self.lr_decay == 1.0:
            raise ConfigError(
                f"lr_decay_start {self.lr_decay_start} says when --lr-decay starts, and the rate does not decay "
                "(lr_decay 1); add --lr-decay FACTOR (e.g. 0.5), or drop --lr-decay-start"
            )
        self._check_schedule()
        object.__setattr__(self, "divergence", _divergence_factor(self.divergence))
        if self.warmup_steps < 0:
            raise ConfigError(f"warmup_steps must be ≥ 0, got {self.warmup_steps!r}")
        if self.progress not in PROGRESS_MODES:
            raise ConfigError(f"progress must be one of {', '.join(PROGRESS_MODES)}, got {self.progress!r}")
        if self.strategy is None:
            object.__setattr__(self, "strategy", default_strategy(self.workers))
        elif "-" in self.strategy:
            raise ConfigError(
                f"strategy {self.strategy!r} is a whole spec; build the config with scaletrain.make_config, "
                "which splits it, or give strategy, server and sync apart"
            )
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        minimum = self.min_workers
        if minimum is not None and (
            not isinstance(minimum, int) or isinstance(minimum, bool) or not 1 <= minimum <= self.workers
        ):
            raise ConfigError(
                f"min_workers must be a whole number from 1 to the {self.workers} workers of the run, got {minimum!r}"
            )
        most = self.max_workers
        if most is not None and (minimum is None or not isinstance(most, int) or most < self.workers):
            raise ConfigError(
                f"max_workers bounds an elastic run (--min-workers) from the {self.workers} workers it starts with; "
                f"give --min-workers and a --max-workers of at least {self.workers}, not {most!r}"
            )
        if self.join and minimum is None:
            raise ConfigError("--join joins an elastic run: give the run's own settings, --min-workers included")
        if (self.nodefile is None) != (self.index is None):
            raise ConfigError("--nodefile and --index go together: the file lists every process, --index is this one")
        if self.network is not None:
            from scaletrain.netem.network import parse_rate  # checks the rate early, with the accepted forms

            parse_rate(self.network)
        if not isinstance(self.options, dict):
            raise ConfigError("options must be a table of workload options, e.g. [options] num_steps = 35")
        if not isinstance(self.technique_options, dict):
            raise ConfigError('technique_options must be a table, e.g. [technique_options] layer = "classifier.1"')
        self._check_devices_and_techniques()

    def _check_schedule(self) -> None:
        if self.lr_schedule is not None and self.lr_schedule not in LR_SCHEDULES:
            raise ConfigError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}, got {self.lr_schedule!r}")
        if self.lr_schedule not in (None, "step") and (self.lr_decay != 1.0 or self.lr_decay_start):
            raise ConfigError(
                f"--lr-decay decays the rate per epoch (--lr-schedule step), not --lr-schedule {self.lr_schedule}; "
                "drop --lr-decay and --lr-decay-start, or use --lr-schedule step"
            )
        warmup = self.lr_warmup
        if warmup is not None and (isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0):
            raise ConfigError(f"lr_warmup must be a whole number of updates ≥ 0, got {warmup!r}")
        if not isinstance(self.optimizer_options, dict):
            raise ConfigError("optimizer_options must be a table, e.g. [optimizer_options] betas = [0.9, 0.95]")
        if self.optimizer is not None and not isinstance(self.optimizer, str):
            raise ConfigError(f"optimizer must be a name (sgd, adamw, …) or module:attribute, got {self.optimizer!r}")

    def _check_devices_and_techniques(self) -> None:
        from scaletrain.efficient import check_techniques
        from scaletrain.tensors.codec import CODECS
        from scaletrain.tensors.device import check_device
        from scaletrain.tensors.optimizers import check_optimizer

        check_device(self.device)
        settings = {"momentum": self.momentum, "weight_decay": self.weight_decay, "lr": self.lr}
        check_optimizer(self.optimizer or "sgd", self.optimizer_options, **settings)  # unset: SGD or the workload's
        # the --technique choice and its options, then every standing technique's settings (its class says
        # which fields it reads and what it refuses): nothing is built here
        check_techniques(vars(self))
        if self.wire not in CODECS:
            raise ConfigError(f"wire must be one of {', '.join(CODECS)}, got {self.wire!r}")
        if not isinstance(self.wire_options, dict):
            raise ConfigError("wire_options must be a table of the codec's options, e.g. [wire_options] rank = 2")
        CODECS[self.wire].parse_options(self.wire_options)
        if self.error_feedback and self.wire == "fp32":
            raise ConfigError("--error-feedback corrects a narrower wire's rounding; add --wire bf16 or --wire fp16")
        if not isinstance(self.strategy_options, dict):
            raise ConfigError("strategy_options must be a table of the strategy's options, e.g. [strategy_options]")
        self._check_overlap()
        self._check_compile()

    def _check_overlap(self) -> None:
        from scaletrain.efficient.precision import parse_loss_scale

        size = self.bucket_mb
        if isinstance(size, bool) or not isinstance(size, int | float) or not (math.isfinite(size) and size > 0):
            raise ConfigError(f"bucket_mb must be a number of MiB > 0, e.g. --bucket-mb 0.25; got {size!r}")
        if not self.overlap:
            if size != TrainConfig.bucket_mb:
                raise ConfigError(f"--bucket-mb {size:g} sizes the buckets of --overlap; add --overlap, or drop it")
            return
        if self.min_workers is not None:
            raise ConfigError("--overlap is not available to an elastic run (--min-workers): drop one of the two")
        if self.accumulate > 1:
            raise ConfigError(
                f"--overlap reduces gradients during each backward pass, and --accumulate {self.accumulate} makes "
                f"{self.accumulate} backward passes per exchange; drop one of the two"
            )
        if parse_loss_scale(self.loss_scale, self.precision) is not None:
            raise ConfigError(
                "--overlap sends gradients before dynamic loss scaling can unscale them; use --precision bf16 or "
                "--loss-scale off with --overlap, or drop --overlap"
            )

    def _check_compile(self) -> None:
        if not isinstance(self.compile, bool):
            raise ConfigError(f"compile must be true or false, got {self.compile!r}")
        if not self.compile or not self._computes_on_cpu():
            return
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.exc import InvalidCxxCompiler

        try:  # the search inductor makes at its first compilation: $CXX, else g++
            get_cpp_compiler()
        except InvalidCxxCompiler:
            raise ConfigError(
                "--compile: torch.compile finds no C++ compiler here ($CXX, else g++) to build the CPU code it "
                "generates; install one (e.g. apt-get install g++), point CXX at one, or drop --compile"
            ) from None

    def _computes_on_cpu(self) -> bool:
        import torch

        return self.device == "cpu" or (self.device == "auto" and not torch.cuda.is_available())


def _divergence_factor(value: Any) -> float | str:
    """``divergence`` as given (a number, its text from the command line, or ``off``) → a float > 1 or ``"off"``.

    >>> _divergence_factor("1e3"), _divergence_factor(100), _divergence_factor("OFF")
    (1000.0, 100.0, 'off')
    """
    if isinstance(value, str) and value.strip().lower() == "off":
        return "off"
    try:
        factor = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        factor = math.nan
    if not (math.isfinite(factor) and factor > 1):
        raise ConfigError(
            f"divergence must be a factor > 1 (e.g. 1e4: stop when the loss grows past 10000 × its first "
            f"values) or off, got {value!r}"
        )
    return factor


def _field_names() -> set[str]:
    return {f.name for f in fields(TrainConfig)}


def load_toml(path: Path, also: Iterable[str] = ()) -> dict[str, Any]:
    """Read a TOML config file into a dict of :class:`TrainConfig` fields and of the keywords in ``also`` (the
    strategies' flagged options, which :func:`scaletrain.make_config` moves into ``strategy_options``).

    Keys may use dashes or underscores (``batch-size`` = ``batch_size``); workload options go in an
    ``[options]`` table. Unknown keys are an error that lists the known ones.

    >>> import tempfile, pathlib
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "run.toml"
    >>> _ = p.write_text('batch-size = 64\\n[options]\\nnum_steps = 35\\n')
    >>> load_toml(p)
    {'batch_size': 64, 'options': {'num_steps': 35}}
    """
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the path given to --config") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    known = _field_names() | set(also)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in known:
            raise ConfigError(f"unknown key {key!r} in {path}; known keys: {', '.join(sorted(known))}")
        values[name] = value
    return values


def default_strategy(workers: int) -> str:
    """The strategy of a run that names none: one process alone, all-reduce for more.

    >>> default_strategy(1), default_strategy(4)
    ('local', 'allreduce')
    """
    return "local" if workers == 1 else "allreduce"


def merge(*layers: dict[str, Any]) -> dict[str, Any]:
    """Combine layers of settings, later layers winning; ``options`` tables merge key by key."""
    merged: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in ("options", "strategy_options", "technique_options", "wire_options", "optimizer_options"):
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
    return merged


def to_json_dict(config: TrainConfig) -> dict[str, Any]:
    """The config as JSON-ready values (paths as strings), for handing to worker processes."""
    values = dataclasses.asdict(config)
    return {key: str(value) if isinstance(value, Path) else value for key, value in values.items()}


def from_json_dict(values: dict[str, Any]) -> TrainConfig:
    """Inverse of :func:`to_json_dict`."""
    return TrainConfig(**values)
