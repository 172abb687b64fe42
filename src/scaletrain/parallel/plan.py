"""Who does what: the processes of a strategy and the data each worker computes.

Vocabulary of Šlampa (2017, §6.1): ``join`` — each worker computes a whole batch of ``--batch-size``
and one update joins N batches (= one worker with batch N·b); ``split`` — one batch of
``--batch-size`` is split over the N workers (= sequential training); ``async`` (Downpour SGD) —
each worker trains its own share of the epoch's batches and the server applies every gradient as it
arrives. Which strategies take which modes comes from the registry
(:mod:`scaletrain.parallel.strategies`).
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies import ALIASES, Strategy, get_strategy
from scaletrain.train.plan import WorkerPlan

__all__ = ["SERVER", "WORKER", "Layout"]

SERVER, WORKER = "server", "worker"


@dataclass(frozen=True)
class Layout:
    """A strategy's processes: N workers, plus any extra processes of the strategy (a central
    parameter server) at the first ranks. ``server`` is ``""`` for a strategy without servers.

    >>> layout = Layout("ps", workers=2, server="central", sync="async")
    >>> layout.world_size, layout.role(0), layout.worker_index(2), layout.label
    (3, 'server', 1, 'ps-central-async')
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
