"""Who does what: the processes of a strategy and the data each worker computes.

Vocabulary of Šlampa (2017, §6.1): ``join`` — each worker computes a whole batch of ``--batch-size``
and one update joins N batches (= one worker with batch N·b); ``split`` — one batch of
``--batch-size`` is split over the N workers (= sequential training); ``async`` (Downpour SGD) —
each worker trains its own share of the epoch's batches and the server applies every gradient as it
arrives.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.errors import ConfigError
from scaletrain.train.plan import WorkerPlan
from scaletrain.workloads.base import Part

__all__ = ["SERVER", "STRATEGIES", "SYNC_MODES", "WORKER", "Layout"]

STRATEGIES = ("local", "allreduce", "ps")
SERVERS = ("central", "sharded")
SYNC_MODES = ("join", "split", "async")
ALIASES = {"distributed": "sharded", "none": "async"}
SERVER, WORKER = "server", "worker"


@dataclass(frozen=True)
class Layout:
    """A strategy's processes: N workers, plus a parameter-server process at rank 0 for ``ps central``.

    >>> layout = Layout("ps", workers=2, server="central", sync="async")
    >>> layout.world_size, layout.role(0), layout.worker_index(2)
    (3, 'server', 1)
    """

    strategy: str
    workers: int = 1
    server: str = "central"
    sync: str = "join"

    def __post_init__(self) -> None:
        object.__setattr__(self, "server", ALIASES.get(self.server, self.server))
        object.__setattr__(self, "sync", ALIASES.get(self.sync, self.sync))
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"unknown strategy {self.strategy!r}; choose one of {', '.join(STRATEGIES)}")
        if self.server not in SERVERS:
            raise ConfigError(f"unknown server {self.server!r}; choose central or sharded (alias distributed)")
        if self.sync not in SYNC_MODES:
            raise ConfigError(f"unknown sync mode {self.sync!r}; choose join, split or async (alias none)")
        if self.workers < 1:
            raise ConfigError(f"--workers must be ≥ 1, got {self.workers}")
        if self.strategy == "local" and self.workers > 1:
            raise ConfigError(
                f"--strategy local trains in one process; for {self.workers} workers use "
                "--strategy allreduce or --strategy ps"
            )
        if self.strategy == "allreduce" and self.sync == "async":
            raise ConfigError("all-reduce is synchronous; for asynchronous updates use --strategy ps --sync async")

    @property
    def has_server_process(self) -> bool:
        return self.strategy == "ps" and self.server == "central"

    @property
    def world_size(self) -> int:
        return self.workers + (1 if self.has_server_process else 0)

    def role(self, rank: int) -> str:
        return SERVER if self.has_server_process and rank == 0 else WORKER

    def worker_index(self, rank: int) -> int:
        """0..N−1 for the workers."""
        return rank - 1 if self.has_server_process else rank

    def worker_ranks(self) -> list[int]:
        first = 1 if self.has_server_process else 0
        return list(range(first, first + self.workers))

    def worker_plan(self, rank: int) -> WorkerPlan:
        """The data worker ``rank`` computes: its part of each global batch, or its async chunk."""
        if self.strategy == "local":
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
        if self.strategy == "local":
            return "local"
        if self.strategy == "allreduce":
            return f"allreduce-{self.sync}"
        return f"ps-{self.server}-{self.sync}"
