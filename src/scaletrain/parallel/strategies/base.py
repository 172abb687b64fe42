"""The small interface every strategy implements, and the steps all strategies' processes share.

A strategy says which process layouts it accepts (server kinds, update modes, worker counts), how
many extra processes it starts and whether they outlive a lost worker, what each process of a run
does (:meth:`Strategy.run`), and how the estimators predict it (:meth:`Strategy.estimator_terms`).
The registry in :mod:`scaletrain.parallel.strategies` derives from these every place that names a
strategy: the CLI's choices, the bench's specs, labels, validation, the launcher's watch, the
deployment's restart policy, the estimator's list and its formulas.

:class:`Layout` says who does what in a run: the processes of a strategy and the data each worker
computes. Vocabulary of Šlampa (2017, §6.1): ``join`` — each worker computes a whole batch of
``--batch-size`` and one update joins N batches (= one worker with batch N·b); ``split`` — one batch
of ``--batch-size`` is split over the N workers (= sequential training); ``async`` (Downpour SGD) —
each worker trains its own share of the epoch's batches and the server applies every gradient as it
arrives.
"""

from __future__ import annotations

import datetime
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import torch.distributed as dist

from scaletrain.config import TrainConfig
from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.terms import EstimatorTerms
from scaletrain.train.loop import Trainer
from scaletrain.train.plan import WorkerPlan
from scaletrain.train.state import Prepared, Role
from scaletrain.train.statistics import refresh_batch_norm
from scaletrain.train.summary import WorkerStats

__all__ = [
    "ALIASES",
    "SERVER",
    "STRATEGIES",
    "WORKER",
    "Layout",
    "Strategy",
    "StrategyOption",
    "collect_stats",
    "get_strategy",
    "layout_fields",
    "read_options",
    "run_label",
    "train_worker",
]

SERVER, WORKER = "server", "worker"

#: The thesis's words for the same things (Šlampa 2017): ``distributed`` server, ``none`` sync.
ALIASES = {"distributed": "sharded", "none": "async"}


@dataclass(frozen=True)
class StrategyOption:
    """An option of a strategy, declared once on its class: ``-S name=value`` on ``train``, the key ``name`` in the
    ``[strategy_options]`` table of a config file and of ``scaletrain.train(strategy_options=...)``; with ``flag``
    also the flag ``--flag-with-dashes`` and the API keyword ``flag``. ``type`` reads the command line's text
    (``bool``: a switch); ``choices`` limits the values.

    >>> StrategyOption("chunks", "pieces per gather", 1, type=int, flag="gather_chunks").flag_name
    '--gather-chunks'
    """

    name: str
    help: str
    default: Any
    type: Callable[[str], Any] = str
    choices: tuple[Any, ...] | None = None
    flag: str | None = None
    metavar: str | None = None

    @property
    def flag_name(self) -> str | None:
        return None if self.flag is None else "--" + self.flag.replace("_", "-")

    def value(self, strategy: str, given: Any) -> Any:
        """``given`` read as this option's type (text from the command line), refused in one line if it is not one."""
        value = given
        if isinstance(given, str) and self.type is not str:
            try:
                value = _switch(given) if self.type is bool else self.type(given)
            except ValueError:
                kinds = {int: "a whole number", float: "a number", bool: "true or false"}
                kind = kinds.get(self.type, f"a {getattr(self.type, '__name__', 'value')}")
                raise ConfigError(f"--strategy {strategy}: option {self.name} must be {kind}, got {given!r}") from None
        if self.choices is not None and value not in self.choices:
            shown = ", ".join(map(str, self.choices))
            raise ConfigError(f"--strategy {strategy}: option {self.name} must be one of {shown}, got {given!r}")
        return value


def _switch(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def read_options(strategy: str, options: tuple[StrategyOption, ...], given: Mapping[str, Any]) -> dict[str, Any]:
    """Every one of ``options``' values: ``given`` read as each option's type, defaults for the rest; an option
    ``strategy`` does not have is refused naming those it has."""
    declared = {option.name: option for option in options}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        offered = ", ".join(f"-S {name}=…" for name in declared) or "none"
        raise ConfigError(
            f"--strategy {strategy} has no option {', '.join(unknown)}; its options: {offered} "
            "(an option of another strategy needs that strategy)"
        )
    values = {name: option.default for name, option in declared.items()}
    values.update({name: declared[name].value(strategy, value) for name, value in given.items()})
    return values


class Strategy(ABC):
    """One way to turn N workers' gradients into weights.

    ``servers``: the server kinds it takes (empty: none); ``syncs``: its update modes (the Šlampa
    vocabulary: ``join``, ``split``, ``async``). Its spec (label) is the name, then the server kind if
    it takes one, then the update mode if it has more than one: ``local``, ``allreduce-join``,
    ``ps-central-async``. ``options``: its own settings (:class:`StrategyOption`), which it checks in
    :meth:`check_options`; the capability flags below are what the rest of scaletrain asks of it,
    never its name.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    servers: ClassVar[tuple[str, ...]] = ()
    syncs: ClassVar[tuple[str, ...]] = ("join",)
    max_workers: ClassVar[int | None] = None
    #: Whether the speedup estimators model it (a one-process strategy has nothing to predict).
    predicted: ClassVar[bool] = True
    #: Whether ``estimate --recommend`` weighs it unasked. False where its speed hangs on an option whose cost in
    #: quality no estimator predicts (diloco's H): it is weighed when the user gives one of its options.
    recommended_unasked: ClassVar[bool] = True
    #: The options under which its synchronous modes train as one process does (the tests of that equality run it
    #: with them; ``{}``: its defaults do); None: no setting does.
    one_process_options: ClassVar[dict[str, Any] | None] = {}
    #: Whether its collectives carry tensors on the workers' device (then NCCL on a GPU), or only
    #: host buffers (gloo).
    device_collectives: ClassVar[bool] = False
    #: Its own options (``-S name=value``); :meth:`option_values` reads them, :meth:`check_options` judges them.
    options: ClassVar[tuple[StrategyOption, ...]] = ()
    #: The wire codecs (``--wire``) it sends gradients with; None: every codec it can sum (below).
    wires: ClassVar[tuple[str, ...] | None] = None
    #: Whether it sums gradients in an all-reduce, so that it carries codecs whose parts add up only there
    #: (PowerSGD's factors).
    all_reduce_codecs: ClassVar[bool] = False
    #: Whether it reduces gradients in buckets while backward runs (``--overlap``, ``--bucket-mb``).
    overlaps: ClassVar[bool] = False
    #: What overlaps its communication instead of ``--overlap``: told to a run that asks for that flag.
    overlap_instead: ClassVar[str | None] = None

    def label(self, server: str, sync: str) -> str:
        parts = [self.name, *([server] if self.servers else []), *([sync] if len(self.syncs) > 1 else [])]
        return "-".join(parts)

    def specs(self) -> list[str]:
        """Every label this strategy answers to."""
        return [self.label(server, sync) for server in self.servers or ("",) for sync in self.syncs]

    def extra_processes(self, layout: Layout) -> int:
        """Processes besides the workers (a central parameter server); they take the first ranks."""
        return 0

    def estimator_terms(self, server: str) -> EstimatorTerms | None:
        """How the estimators predict it with ``server`` (``""`` for a strategy without servers): pure
        functions over the profile's numbers (:mod:`~scaletrain.parallel.strategies.terms`), read by
        :mod:`scaletrain.estimate` through the registry. None: a predicted strategy is listed but
        refused as "not modelled by the estimator"."""
        return None

    def outlives_lost_workers(self, layout: Layout) -> bool:
        """Whether a run goes on without a worker that dies or stops answering: its server process (one
        of :meth:`extra_processes`) counts the worker as lost and finishes with the others. False: a lost
        process stops the run (the launcher stops every other one; a deployment restarts them all)."""
        return False

    def carries(self, wire: str, all_reduce_only: bool) -> bool:
        """Whether it sends gradients with codec ``wire`` (one whose parts add up only in an all-reduce when
        ``all_reduce_only``)."""
        return (self.wires is None or wire in self.wires) and (self.all_reduce_codecs or not all_reduce_only)

    def elastic(self, layout: Layout) -> bool:
        """Whether a run with ``layout`` goes on without lost workers while ``--min-workers`` remain."""
        return False

    def admits_joiners(self, layout: Layout) -> bool:
        """Whether workers started later join a run with ``layout`` (``--join``, ``--max-workers``)."""
        return False

    def option_values(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """Every option's value: ``given`` (``strategy_options``) read as each option's type, defaults for the
        rest (:func:`read_options`).

        >>> STRATEGIES["allreduce"].option_values({})
        {}
        """
        return read_options(self.name, self.options, given)

    def check_options(  # noqa: B027 - optional hook
        self, values: Mapping[str, Any], layout: Layout, config: TrainConfig
    ) -> None:
        """Refuse option values it cannot run with ``layout`` and the rest of ``config`` by raising
        :class:`ConfigError` with one line that names the fix. Called with :meth:`option_values`' result in the
        process that builds the run's settings, before any process starts, and again in each process as it
        starts; it must not start anything itself. The default refuses nothing."""

    def batch_split(self, config: TrainConfig, layout: Layout) -> int:
        """Over how many workers each batch of ``--batch-size`` is divided into updates (the schedule's steps are
        batches of ``batch_size // batch_split``); 1: every update is a whole batch."""
        return 1

    def check(self, layout: Layout) -> None:
        """Refuse a layout this strategy cannot run, naming the fix (server and sync are checked already)."""
        if self.max_workers is not None and layout.workers > self.max_workers:
            raise ConfigError(
                f"--strategy {self.name} trains in {self.max_workers} process; for {layout.workers} workers use "
                "--strategy allreduce or --strategy ps"
            )

    @abstractmethod
    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        """This process's part of the run; the coordinator (rank 0) returns the summary, the others ``None``.

        Called once in every process of the run (each of ``layout.world_size``), after the process group is up
        (``store`` is the run's; at world size 1 a store of this process alone) and the model, optimizer and
        data are built (``prepared``); every process must call the same collectives in the same order, and a
        worker's training loop is :func:`train_worker`'s."""


#: Every strategy by name. Filled in one place, :mod:`scaletrain.parallel.strategies` (one line per
#: strategy); kept here so that :class:`Layout` and the strategies' own modules need no import of it.
STRATEGIES: dict[str, Strategy] = {}


def get_strategy(name: str) -> Strategy:
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ConfigError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None


@dataclass(frozen=True)
class Layout:
    """Who does what: a strategy's processes: N workers, plus any extra processes of the strategy (a central
    parameter server) at the first ranks. ``server`` is ``""`` for a strategy without servers.

    >>> layout = Layout("ps", workers=2, server="central", sync="async")
    >>> layout.world_size, layout.role(0), layout.worker_index(2), layout.label
    (3, 'server', 1, 'ps-central-async')
    >>> layout.outlives_lost_workers, Layout("ps", 2, server="sharded", sync="async").outlives_lost_workers
    (True, False)
    >>> Layout("allreduce", 2, server="central").label  # a server kind means nothing to all-reduce
    'allreduce-join'
    """

    strategy: str
    workers: int = 1
    server: str = "central"
    sync: str = "join"

    def __post_init__(self) -> None:
        strategy = get_strategy(self.strategy)
        server = ALIASES.get(self.server, self.server) if strategy.servers else ""
        sync = ALIASES.get(self.sync, self.sync)
        object.__setattr__(self, "server", server)
        object.__setattr__(self, "sync", sync)
        if strategy.servers and server not in strategy.servers:
            raise ConfigError(
                f"unknown server {self.server!r}; choose {' or '.join(strategy.servers)} (alias distributed)"
            )
        if sync not in strategy.syncs:
            if sync == "async":
                raise ConfigError(
                    f"{strategy.name} is synchronous (--sync {' or '.join(strategy.syncs)}); for asynchronous "
                    "updates use --strategy ps --sync async"
                )
            if sync in ("join", "split"):
                raise ConfigError(f"{strategy.name} takes --sync {' or '.join(strategy.syncs)}, not {sync}")
            raise ConfigError(f"unknown sync mode {self.sync!r}; choose join, split or async (alias none)")
        if self.workers < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {self.workers}")
        strategy.check(self)

    @property
    def plugin(self) -> Strategy:
        return get_strategy(self.strategy)

    @property
    def has_server_process(self) -> bool:
        return self.extra_processes > 0

    @property
    def extra_processes(self) -> int:
        return self.plugin.extra_processes(self)

    @property
    def outlives_lost_workers(self) -> bool:
        """The strategy's :meth:`Strategy.outlives_lost_workers` for this layout."""
        return self.plugin.outlives_lost_workers(self)

    @property
    def world_size(self) -> int:
        return self.workers + self.extra_processes

    def role(self, rank: int) -> str:
        return SERVER if rank < self.extra_processes else WORKER

    def worker_index(self, rank: int) -> int:
        """0..N−1 for the workers."""
        return rank - self.extra_processes

    def worker_ranks(self) -> list[int]:
        first = self.extra_processes
        return list(range(first, first + self.workers))

    def worker_plan(self, rank: int) -> WorkerPlan:
        """The data worker ``rank`` computes: its part of each global batch, or its async chunk."""
        if self.workers == 1:
            return WorkerPlan()
        index = Part(self.worker_index(rank), self.workers)
        if self.sync == "async":
            return WorkerPlan(chunk=index)
        if self.sync == "join":
            return WorkerPlan(global_batch_factor=self.workers, part=index)
        return WorkerPlan(part=index, batch_fraction=1 / self.workers)

    @property
    def label(self) -> str:
        """``local``, ``allreduce-join``, ``ps-central-async`` … (the bench's strategy specs)."""
        return self.plugin.label(self.server, self.sync)


def run_label(strategy: str, server: str, sync: str, workers: int) -> str:
    """``allreduce-join, 2 workers`` — the strategy as the bench, the summary and checkpoints name it."""
    label = Layout(strategy, workers, server, sync).label
    return f"{label}, {workers} worker{'s' if workers != 1 else ''}"


def train_worker(prepared: Prepared, role: Role, store: dist.Store) -> Trainer:
    """Run the training loop as a worker, then hand its measurements to rank 0 through the store."""
    trainer = Trainer(prepared, role)
    try:
        trainer.train()
        trainer.count_owed(role.exchange.conclude(prepared.model, lambda n: refresh_batch_norm(trainer, n)))
        # Measurements go to the store before the exchange's goodbye, so rank 0 finds them.
        store.set(f"stats/{role.rank}", json.dumps(asdict(trainer.stats())))
        role.exchange.finish(prepared.model)
    finally:
        trainer.close()
    return trainer


def collect_stats(store: dist.Store, ranks: list[int], lost: set[int], timeout: float) -> list[WorkerStats]:
    """The workers' measurements from the store; a lost worker's are left out."""
    stats = []
    for rank in ranks:
        if rank in lost:
            continue
        key = f"stats/{rank}"
        try:
            store.wait([key], datetime.timedelta(seconds=timeout))
        except RuntimeError:
            continue  # a worker that vanished after its last update: counted as lost by the server
        stats.append(WorkerStats(**json.loads(store.get(key))))
    return stats


def layout_fields(layout: Layout, config: TrainConfig) -> dict[str, Any]:
    """The strategy as ``summary.json`` names it, with its options' values."""
    return {
        "strategy": layout.strategy,
        "server": layout.server or None,
        "sync": layout.sync,
        "workers": layout.workers,
        "strategy_label": layout.label,
        "strategy_options": layout.plugin.option_values(config.strategy_options),
    }
