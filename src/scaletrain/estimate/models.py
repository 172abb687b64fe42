"""Both models behind one call: predicted speedup of a configuration (a bench strategy spec) on N workers.

``thesis`` is Šlampa's estimator fed with the profile's t_grad and t_comm (all-reduce, which the
thesis does not cover, gets its distributed-server formula: the same 2·t_comm·(N−1)/N per
iteration). ``refined`` is :mod:`scaletrain.estimate.refined` over the whole profile.

>>> from scaletrain.measure.profile import Profile
>>> profile = Profile("toy", 32, t_grad=1.0, t_comm=0.1)
>>> round(predicted_speedup("thesis", profile, Configuration.parse("ps-sharded-join"), 2, batches=128), 4)
1.8182
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.estimate import refined, thesis
from scaletrain.measure.profile import Profile
from scaletrain.measure.sweep import parse_strategy

__all__ = ["MODELS", "Configuration", "predicted_speedup", "thesis_configurations"]

MODELS = ("thesis", "refined")
THESIS_TYPES = {"join": "sync-join", "split": "sync-split", "async": "async"}


@dataclass(frozen=True)
class Configuration:
    """A strategy, server and sync mode, e.g. ``ps-central-async`` or ``allreduce-split``."""

    strategy: str
    server: str
    sync: str

    @classmethod
    def parse(cls, spec: str) -> Configuration:
        strategy, server, sync = parse_strategy(spec)
        if strategy == "local":
            raise ConfigError("local is the one-worker reference, not a configuration to predict")
        return cls(strategy, server if strategy == "ps" else "", sync)

    @classmethod
    def from_thesis(cls, kind: str, server: str, strategy: str = "ps") -> Configuration:
        """From the thesis's ``--type`` and ``--server`` (and ``--strategy allreduce``)."""
        syncs = {value: key for key, value in THESIS_TYPES.items()}
        if kind not in syncs:
            raise ConfigError(f"unknown --type {kind!r}; choose one of {', '.join(thesis.KINDS)}")
        if strategy == "allreduce":
            if kind == "async":
                raise ConfigError("all-reduce is synchronous; use --type sync-join or sync-split")
            return cls("allreduce", "", syncs[kind])
        return cls.parse(f"ps-{server}-{syncs[kind]}")

    @property
    def label(self) -> str:
        return f"allreduce-{self.sync}" if self.strategy == "allreduce" else f"ps-{self.server}-{self.sync}"

    @property
    def thesis_type(self) -> str:
        return THESIS_TYPES[self.sync]

    @property
    def thesis_server(self) -> str:
        return "central" if self.server == "central" else "distributed"


def thesis_configurations() -> list[Configuration]:
    """The six the thesis estimates: central/distributed server × async, sync-join, sync-split."""
    return [Configuration.parse(f"ps-{server}-{sync}") for server in ("central", "sharded") for sync in THESIS_TYPES]


def predicted_speedup(
    model: str,
    profile: Profile,
    configuration: Configuration,
    workers: int,
    *,
    batches: float,
    cores: int | None = None,
    case: str = "mean",
) -> float:
    """Speedup of ``configuration`` on ``workers`` workers against one worker alone."""
    if model == "thesis":
        return thesis.speedup(
            t_grad=profile.t_grad,
            t_comm=profile.t_comm,
            kind=configuration.thesis_type,
            server=configuration.thesis_server,
            workers=workers,
            batches=batches,
            case=case,
        )
    if model == "refined":
        return refined.predict(
            profile,
            strategy=configuration.strategy,
            server=configuration.server or "central",
            sync=configuration.sync,
            workers=workers,
            batches=batches,
            cores=cores,
        ).speedup
    raise ConfigError(f"unknown --model {model!r}; choose thesis or refined")
