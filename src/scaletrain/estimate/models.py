"""Both models behind one call: predicted speedup of a configuration (a bench strategy spec) on N workers.

``thesis`` is Šlampa's estimator fed with the profile's t_grad and t_comm, with the server formula
each strategy names in its estimator terms (all-reduce, which the thesis does not cover, names the
distributed-server formula: the same 2·t_comm·(N−1)/N per iteration). ``refined`` is
:mod:`scaletrain.estimate.refined` over the whole profile. The configurations to predict are the
strategy registry's predicted specs (:func:`predicted_configurations`); what a strategy declares to
be predicted is in :mod:`scaletrain.parallel.strategies.terms`.

>>> from scaletrain.estimate.profile import Profile
>>> profile = Profile("toy", 32, t_grad=1.0, t_comm=0.1)
>>> round(predicted_speedup("thesis", profile, Configuration.parse("ps-sharded-join"), 2, batches=128), 4)
1.8182
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from scaletrain.errors import ConfigError
from scaletrain.estimate import refined, thesis
from scaletrain.estimate.foreign import ENGINE_SPECS, model_spec
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.queueing import mean_value_throughputs, throughput_bound
from scaletrain.parallel.strategies import ALIASES, STRATEGIES, all_specs, get_strategy, parse_spec
from scaletrain.parallel.strategies.terms import Network

__all__ = [
    "MODELS",
    "Configuration",
    "best_per_workers",
    "check_inputs",
    "predicted_configurations",
    "predicted_speedup",
    "predicted_speedups",
    "thesis_configurations",
]

MODELS = ("thesis", "refined")
#: The thesis's ``--type`` for each update mode (its vocabulary: sync-join, sync-split, async).
THESIS_TYPES = {"join": "sync-join", "split": "sync-split", "async": "async"}


@dataclass(frozen=True)
class Configuration:
    """A strategy, server and sync mode, e.g. ``ps-central-async`` or ``allreduce-split``."""

    strategy: str
    server: str
    sync: str
    #: how asynchronous workers divide the batch (``--async-batches``): ``share``, Downpour's (the thesis's async,
    #: and the mode the validations measure), or ``split``; nothing to a synchronous one
    async_batches: str = field(default="share", repr=False)
    #: the strategy's own options its formulas read (``-S name=value``, e.g. diloco's ``sync_every``), as sorted
    #: pairs; the strategy's defaults for those not given
    options: tuple[tuple[str, Any], ...] = field(default=(), repr=False)

    @property
    def async_split(self) -> bool:
        return self.sync == "async" and self.async_batches == "split"

    @property
    def option_values(self) -> dict[str, Any]:
        """Every option of the strategy: those given, its defaults for the rest.

        >>> Configuration.parse("diloco-split").with_options({"sync_every": "16"}).option_values["sync_every"]
        16
        """
        return get_strategy(self.strategy).option_values(dict(self.options))

    def with_options(self, options: Mapping[str, Any]) -> Configuration:
        """The same configuration with the strategy's options ``options`` (checked as training checks them)."""
        values = get_strategy(self.strategy).option_values(dict(options))
        given = {name: values[name] for name in options}
        return replace(self, options=tuple(sorted(given.items())))

    @classmethod
    def parse(cls, spec: str) -> Configuration:
        """A spec from the registry (:func:`~scaletrain.parallel.strategies.parse_spec`) that the estimators predict.

        >>> Configuration.parse("allreduce-split")
        Configuration(strategy='allreduce', server='', sync='split')
        """
        strategy, server, sync = parse_spec(spec)
        if not get_strategy(strategy).predicted:
            raise ConfigError(
                f"{spec} is not a configuration to predict (one process is the reference, speedup 1); "
                f"choose one of {', '.join(all_specs(predicted_only=True))}"
            )
        return cls(strategy, server, sync)

    @classmethod
    def from_thesis(cls, kind: str, server: str, strategy: str = "ps") -> Configuration:
        """From the thesis's ``--type`` and ``--server`` and a strategy's name (a strategy without servers ignores it).

        >>> Configuration.from_thesis("sync-split", "central", "allreduce").label
        'allreduce-split'
        """
        registered = get_strategy(strategy)
        sync = _sync_of(kind)
        if sync not in registered.syncs:
            kinds = " or ".join(THESIS_TYPES[s] for s in registered.syncs if s in THESIS_TYPES)
            what = "is synchronous" if sync == "async" else f"has no --type {kind}"
            raise ConfigError(f"--strategy {registered.name} {what}; use --type {kinds}")
        return cls.parse(registered.label(server, sync))

    @classmethod
    def from_flags(cls, strategy: str = "ps", kind: str | None = None, server: str | None = None) -> Configuration:
        """From ``--strategy`` (a name, ``ps``, or a whole spec, ``ps-central-join``) and the thesis's flags.

        With a name, ``kind`` and ``server`` are the thesis's ``--type`` and ``--server`` (None: its
        defaults, sync-join and the strategy's first server kind: central for ``ps``); a spec sets all
        three, so a flag that says otherwise is an error that names the fix.

        >>> Configuration.from_flags("ps", "async", "distributed").label
        'ps-sharded-async'
        >>> Configuration.from_flags("ps-central-join", kind="sync-join", server="central").label
        'ps-central-join'
        """
        name = strategy.strip().lower()
        if name in STRATEGIES:
            servers = STRATEGIES[name].servers
            return cls.from_thesis(kind or THESIS_TYPES["join"], server or (servers[0] if servers else ""), name)
        configuration = cls.parse(strategy)
        registered = get_strategy(configuration.strategy)
        sync = configuration.sync if kind is None else _sync_of(kind)
        wanted = configuration.server if server is None else ALIASES.get(server, server)
        conflicts = {}  # flag → the value given
        if sync != configuration.sync:
            conflicts["--type"] = kind
        if server is not None and (not registered.servers or wanted != configuration.server):
            conflicts["--server"] = server
        if conflicts:
            given = " and ".join(f"{flag} {value}" for flag, value in conflicts.items())
            fix = f"drop {' and '.join(conflicts)}"
            alternative = registered.label(wanted, sync)
            if (registered.servers or "--server" not in conflicts) and alternative in all_specs(predicted_only=True):
                fix += f", or use --strategy {alternative}"
            raise ConfigError(f"--strategy {configuration.label} conflicts with {given}: {fix}")
        return configuration

    @property
    def label(self) -> str:
        return get_strategy(self.strategy).label(self.server, self.sync)

    @property
    def described(self) -> str:
        """The label with the strategy options given, as advice names a configuration.

        >>> Configuration.parse("diloco-join").with_options({"sync_every": 16}).described
        'diloco-join, sync_every=16'
        """
        return ", ".join([self.label, *(f"{name}={value}" for name, value in self.options)])

    @property
    def thesis_type(self) -> str:
        self._check_thesis()
        return THESIS_TYPES[self.sync]

    @property
    def thesis_server(self) -> str:
        """The thesis's ``--server`` formula that the strategy's estimator terms name for this server kind."""
        self._check_thesis()
        return self._thesis_server()

    def _thesis_server(self) -> str | None:
        terms = get_strategy(self.strategy).estimator_terms(self.server)
        return None if terms is None else terms.thesis_server

    def _check_thesis(self) -> None:
        if self._thesis_server() is None or self.sync not in THESIS_TYPES:
            raise ConfigError(
                f"{self.label} is not modelled by the estimator: the thesis model has no formula for it "
                f"({self.strategy}'s estimator_terms({self.server!r}) names no thesis_server)"
            )


def _sync_of(kind: str) -> str:
    """The update mode the thesis's ``--type`` names."""
    syncs = {value: key for key, value in THESIS_TYPES.items()}
    if kind not in syncs:
        raise ConfigError(f"unknown --type {kind!r}; choose one of {', '.join(thesis.KINDS)}")
    return syncs[kind]


def thesis_configurations() -> list[Configuration]:
    """The six the thesis estimates: central/distributed server × async, sync-join, sync-split."""
    return [Configuration.parse(f"ps-{server}-{sync}") for server in ("central", "sharded") for sync in THESIS_TYPES]


def predicted_configurations(framework: str = "scaletrain") -> list[Configuration]:
    """Every configuration the estimators predict: the strategy registry's predicted specs, in its order; for a
    foreign ``framework`` those its engine runs (:data:`~scaletrain.estimate.foreign.ENGINE_SPECS`).

    >>> [c.label for c in predicted_configurations()][:3]
    ['allreduce-join', 'allreduce-split', 'ps-central-join']
    >>> [c.label for c in predicted_configurations("tensorflow")]
    ['allreduce-join', 'ps-central-async', 'ps-sharded-async']
    """
    runs = ENGINE_SPECS.get(framework)
    return [Configuration.parse(spec) for spec in all_specs(predicted_only=True) if runs is None or spec in runs]


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
    check_inputs(profile, workers, batches=batches, cores=cores)
    model_spec(profile, configuration.label)  # a foreign profile predicts only the runs its engine has
    if model == "thesis":
        return thesis.speedup(
            t_grad=profile.t_grad,
            t_comm=profile.t_comm,
            kind=configuration.thesis_type,
            server=configuration.thesis_server,
            workers=workers,
            batches=batches,
            case=case,
            split=configuration.async_split,
        )
    if model == "refined":
        return refined.predict(
            profile,
            strategy=configuration.strategy,
            server=configuration.server,
            sync=configuration.sync,
            workers=workers,
            batches=batches,
            cores=cores,
            async_split=configuration.async_split,
            options=configuration.option_values,
        ).speedup
    raise ConfigError(f"unknown --model {model!r}; choose thesis or refined")


def predicted_speedups(
    model: str,
    profile: Profile,
    configurations: Sequence[Configuration],
    max_workers: int,
    *,
    batches: float,
    cores: int | None = None,
    case: str = "mean",
) -> dict[Configuration, list[float]]:
    """:func:`predicted_speedup` of each configuration on 1..``max_workers`` workers, in one pass.

    The same numbers as calling :func:`predicted_speedup` for every worker count, but each of the
    profile's per-worker-count terms is computed once and the refined model's queueing networks are
    solved together, so 10,000 workers take a fraction of a second.

    >>> profile = Profile("toy", 32, t_grad=1.0, t_comm=0.1)
    >>> sharded = Configuration.parse("ps-sharded-join")
    >>> [round(s, 4) for s in predicted_speedups("thesis", profile, [sharded], 2, batches=128)[sharded]]
    [1.0, 1.8182]
    """
    check_inputs(profile, max_workers, batches=batches, cores=cores)
    for configuration in configurations:
        model_spec(profile, configuration.label)  # a foreign profile predicts only the runs its engine has
    workers = range(1, max_workers + 1)
    if model == "thesis":
        return {
            c: thesis.speedups(
                t_grad=profile.t_grad,
                t_comm=profile.t_comm,
                kind=c.thesis_type,
                server=c.thesis_server,
                workers=max_workers,
                batches=batches,
                case=case,
                split=c.async_split,
            )
            for c in configurations
        }
    if model == "refined":
        terms = _terms(profile, cores)
        return {
            c: (
                refined.batches_per_second(
                    terms[c.async_split].using(c.option_values, batches=batches),
                    strategy=c.strategy,
                    server=c.server,
                    sync=c.sync,
                    workers=workers,
                )
                * terms[c.async_split].sequential
            ).tolist()
            for c in configurations
        }
    raise ConfigError(f"unknown --model {model!r}; choose thesis or refined")


def best_per_workers(
    model: str,
    profile: Profile,
    configurations: Sequence[Configuration],
    max_workers: int,
    *,
    batches: float,
    cores: int | None = None,
    case: str = "mean",
) -> list[tuple[float, str]]:
    """For 1..``max_workers`` workers: the highest predicted speedup and its configuration's label.

    The maximum over :func:`predicted_speedups`' curves (on a tie, the label that sorts last). The
    refined model's asynchronous networks are solved only for the worker counts where their
    throughput bound reaches the best configuration solved so far; elsewhere they cannot win.
    """
    if model == "refined":
        check_inputs(profile, max_workers, batches=batches, cores=cores)
        split = _terms(profile, cores)
        terms = split[False]  # a synchronous configuration's terms: no asynchronous update to divide
        workers = np.arange(1, max_workers + 1)
        curves = {
            c: refined.batches_per_second(
                terms.using(c.option_values, batches=batches),
                strategy=c.strategy,
                server=c.server,
                sync=c.sync,
                workers=workers,
            )
            * terms.sequential
            for c in configurations
            if c.sync != "async"
        }
        floor = np.max(list(curves.values()), axis=0) if curves else np.full(max_workers, -np.inf)
        asynchronous = {
            c: refined.asynchronous_networks(
                split[c.async_split], strategy=c.strategy, server=c.server, workers=workers
            )
            for c in configurations
            if c.sync == "async"
        }
        # Small networks first (the central server's): solved first, they often rule the larger ones out.
        for c, networks in sorted(asynchronous.items(), key=lambda item: _queue_count(item[1])):
            # The margin keeps rounding in the bound from ever dropping a network that could win.
            share = split[c.async_split].update_share(workers)  # batches an update trains
            bounds = np.array([throughput_bound(*network) for network in networks]) * share * terms.sequential
            contenders = np.flatnonzero(bounds * (1 + 1e-9) >= floor)
            curve = np.full(max_workers, -np.inf)
            throughputs = mean_value_throughputs([networks[index] for index in contenders.tolist()])
            curve[contenders] = np.array(throughputs) * share[contenders] * terms.sequential
            curves[c] = curve
            floor = np.maximum(floor, curve)
    else:
        curves = {
            c: np.array(curve)
            for c, curve in predicted_speedups(
                model, profile, configurations, max_workers, batches=batches, cores=cores, case=case
            ).items()
        }
    ranked = sorted(curves, key=lambda c: c.described, reverse=True)  # argmax takes the first of equal values
    table = np.array([curves[c] for c in ranked])
    winners = np.argmax(table, axis=0)
    speedups = table[winners, np.arange(max_workers)]
    return [
        (speedup, ranked[winner].described) for speedup, winner in zip(speedups.tolist(), winners.tolist(), strict=True)
    ]


def _terms(profile: Profile, cores: int | None) -> dict[bool, refined.Terms]:
    """The refined model's terms for Downpour's asynchronous updates (False) and split ones (True)."""
    return {split: refined.Terms(profile, cores, async_split=split) for split in (False, True)}


def _queue_count(networks: list[Network]) -> int:
    """How many distinct queues the networks hold in all: the work of solving them."""
    return sum(len(queues) for _, _, queues in networks)


def check_inputs(profile: Profile | None, workers: int, *, batches: float, cores: int | None = None) -> None:
    """Refuse inputs no model can make sense of, naming the flag: a count below 1, a time that is not a number.

    ``profile`` None: check the counts only.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"--workers must be a whole number ≥ 1, got {workers!r}")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise ConfigError(f"--cores must be a whole number ≥ 1, got {cores!r}")
    if not 0 < batches < math.inf:
        raise ConfigError(f"--batches must be a number > 0, got {batches!r}")
    if profile is not None and (not 0 < profile.t_grad < math.inf or not 0 <= profile.t_comm < math.inf):
        raise ConfigError(
            f"--t-grad must be > 0 and --t-comm ≥ 0 seconds (finite), got {profile.t_grad!r} and {profile.t_comm!r}"
        )
