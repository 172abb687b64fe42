"""What parameter servers write while they serve (progress and metrics, ``checkpoint.pt``, shard files) and
what an owner counts (:class:`ServerStats`).

The central server logs and checkpoints through :class:`ServerObserver`; each owner of a sharded
server saves its master tensors and optimizer state through :class:`ShardCheckpointer`. Both follow
the loop's rule for when a checkpoint is due (:func:`scaletrain.train.loop.checkpoint_due`).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from scaletrain.errors import ConfigError
from scaletrain.parallel.agreement import load_buffers
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.train.checkpoint import CHECKPOINT_NAME, atomic_save, checkpoint_payload, load_checkpoint
from scaletrain.train.logs import MetricsLog, Progress, TensorBoardLog
from scaletrain.train.meter import now
from scaletrain.train.state import Agreement, Prepared, checkpoint_due

__all__ = [
    "SHARDS_DIR",
    "ServerObserver",
    "ServerStats",
    "ShardCheckpointer",
    "restore_shard",
    "save_checkpoint_at",
]

SHARDS_DIR = "shards"


@dataclass
class ServerStats:
    """What an owner observed: updates, staleness of applied gradients, lost peers; with ``--max-staleness``
    each worker's clock (pushes applied), who finished, and the replies held (:mod:`.bound`)."""

    updates: int = 0
    skipped: int = 0  # overflowed gradients not applied (dynamic loss scaling)
    staleness: Counter = field(default_factory=Counter)
    lost: dict[int, str] = field(default_factory=dict)
    batches_done: dict[int, int] = field(default_factory=dict)
    clocks: dict[int, int] = field(default_factory=dict)
    finished: set[int] = field(default_factory=set)
    held: int = 0
    held_seconds: dict[int, float] = field(default_factory=dict)

    def staleness_summary(self) -> dict[str, object]:
        count = sum(self.staleness.values())
        if not count:
            return {"mean": None, "max": None, "histogram": {}}
        mean = sum(value * times for value, times in self.staleness.items()) / count
        return {
            "mean": mean,
            "max": max(self.staleness),
            "histogram": {str(value): self.staleness[value] for value in sorted(self.staleness)},
        }


def save_checkpoint_at(prepared: Prepared, version: int, buffers: dict[str, torch.Tensor] | None = None) -> None:
    """``checkpoint.pt`` from ``prepared``'s model and optimizer after ``version`` updates; ``buffers``
    (the workers' mean) in place of the model's own."""
    position = prepared.schedule.position(version)
    payload = checkpoint_payload(prepared, prepared.model, prepared.optimizer, position, None)
    for name, value in (buffers or {}).items():
        if name in payload["model"] and payload["model"][name].shape == value.shape:
            payload["model"][name] = value
    atomic_save(payload, prepared.config.out / CHECKPOINT_NAME)


class ShardCheckpointer:
    """Each owner of a sharded server saves its master tensors and optimizer state.

    Synchronous owners update in lockstep, so their files share a version; rank 0 also writes
    ``checkpoint.pt`` with the position. Asynchronous owners' files are each their own latest state.
    ``owners``: how many workers own shards (an elastic run's members; the files say it, for a resume).
    """

    def __init__(
        self,
        prepared: Prepared,
        rank: int,
        master: list[nn.Parameter],
        optimizer,
        agreement: Agreement | None = None,
        owners: int | None = None,
    ) -> None:
        self.prepared, self.rank, self.master, self.optimizer = prepared, rank, master, optimizer
        self.owners = owners
        self.agreement = agreement or Agreement()  # the workers' buffers, for checkpoint.pt
        (prepared.config.out / SHARDS_DIR).mkdir(exist_ok=True)

    def __call__(self, version: int) -> None:
        if checkpoint_due(self.prepared, version):
            self.save(version)

    def save(self, version: int) -> None:
        shard = {
            "version": version,
            "master": [p.detach() for p in self.master],
            "optimizer": self.optimizer.state_dict(),
            "owners": self.owners,
        }
        atomic_save(shard, self.prepared.config.out / SHARDS_DIR / f"rank-{self.rank}.pt")
        if self.rank == 0:  # synchronous: this worker's buffers are the workers' mean already
            asynchronous = self.prepared.config.sync == "async"
            save_checkpoint_at(self.prepared, version, self.agreement.worker_buffers(None) if asynchronous else None)


def restore_shard(
    prepared: Prepared,
    rank: int,
    master: list[nn.Parameter],
    optimizer,
    synchronous: bool,
    *,
    owners: int | None = None,
    owned: list[int] | None = None,
    sizes: list[int] | None = None,
) -> int:
    """Load this owner's shard on ``--resume``; returns the version to continue from. ``owners``: how many workers
    own shards now; ``owned``: the indices of this owner's tensors among the model's; ``sizes``: every tensor's
    bytes. When another number of owners wrote the files (an elastic run went on with fewer or more workers:
    rank 0's file, written with every ``checkpoint.pt``, says how many), each tensor and its optimizer state are
    taken from the file of the owner that held it then."""
    folder = prepared.config.out / SHARDS_DIR
    written = load_checkpoint(folder / "rank-0.pt").get("owners") if owners is not None else None
    if owned is None or sizes is None or written in (None, owners):  # planned as now
        shard = _shard_file(folder / f"rank-{rank}.pt", prepared, synchronous)
        with torch.no_grad():
            for parameter, saved in zip(master, shard["master"], strict=True):
                parameter.copy_(saved)
        optimizer.load_state_dict(shard["optimizer"])
        return shard["version"]
    then = assign_greedy(sizes, range(written))
    files: dict[int, dict] = {}
    state = optimizer.state_dict()  # this owner's groups, filled with the states its tensors had
    for position, index in enumerate(owned):
        owner = then[index]
        if owner not in files:
            files[owner] = _shard_file(folder / f"rank-{owner}.pt", prepared, synchronous)
        there = [i for i, o in enumerate(then) if o == owner].index(index)
        with torch.no_grad():
            master[position].copy_(files[owner]["master"][there])
        if there in files[owner]["optimizer"]["state"]:
            state["state"][position] = files[owner]["optimizer"]["state"][there]
    optimizer.load_state_dict(state)
    return next(iter(files.values()))["version"] if files else prepared.position.step


def _shard_file(path: Path, prepared: Prepared, synchronous: bool) -> dict:
    shard = load_checkpoint(path)
    if synchronous and shard["version"] != prepared.position.step:
        raise ConfigError(
            f"shard checkpoint {path} is at update {shard['version']} but checkpoint.pt at "
            f"{prepared.position.step} (a run stopped while writing them); start afresh"
        )
    return shard


class ServerObserver:
    """Called by the central server after every update: logs progress and writes checkpoints.

    A checkpoint is written every ``checkpoint_every`` updates, at each epoch's last update and at
    the end; with asynchronous workers it holds the weights after that many applied gradients.
    """

    def __init__(self, prepared: Prepared, agreement: Agreement | None = None) -> None:
        self.prepared, self.config = prepared, prepared.config
        self.agreement = agreement or Agreement()  # where what only workers compute comes from
        resumed = prepared.resumed_from
        self.metrics = MetricsLog(self.config.out, resume_step=resumed)
        self.tensorboard = TensorBoardLog(self.config.out, enabled=self.config.tensorboard, purge_step=resumed)
        self.progress = Progress(prepared.total_steps, mode=self.config.progress)
        self._window = (now(), prepared.position.step)
        self.version = prepared.position.step  # the last update made

    def __call__(self, version: int) -> None:
        self.version = version
        prepared, config = self.prepared, self.config
        epoch = prepared.schedule.position(max(version - 1, 0)).epoch  # of the update just made (version counts them)
        periodic = version % config.log_every == 0 or version == prepared.total_steps
        if periodic:
            began, first = self._window
            rate = (version - first) / max(now() - began, 1e-9)
            self._window = (now(), version)
            lr, momentum = (prepared.optimizer.param_groups[0].get(key) for key in ("lr", "momentum"))
            record = {"kind": "step", "step": version, "epoch": epoch, "lr": lr, "momentum": momentum}
            record["updates_per_second"] = rate
            self.metrics.write({**record, "time": time.time()})
            self.tensorboard.scalars({"throughput/updates_per_second": rate}, version)
        self.progress.update(version, epoch, None, None, periodic=periodic)
        if checkpoint_due(prepared, version):
            self.save(version)

    def save(self, version: int) -> None:
        """A checkpoint after update ``version``, with the workers' buffers and technique state."""
        self.take_shared(version)
        save_checkpoint_at(self.prepared, version)

    def take_shared(self, version: int) -> None:
        """What only workers compute, into this process's model, which trains nothing: the mean of the
        workers' module buffers at ``version`` (asynchronous: of what each published last), and the
        technique state and first losses (the divergence bound's) the deciding worker shared last."""
        synchronous = self.prepared.config.sync != "async"
        load_buffers(self.prepared.model, self.agreement.worker_buffers(version if synchronous else None))
        shared = self.agreement.shared() or {}
        technique = self.prepared.technique
        if technique is not None and shared.get("technique") is not None:
            technique.load_state_dict(shared["technique"])
        if shared.get("first_losses"):  # what the divergence bound measures from, for a resumed run's workers
            self.prepared.first_losses[:] = shared["first_losses"]

    def message(self, text: str) -> None:
        self.progress.message(text)

    def close(self) -> None:
        self.progress.close()
        self.metrics.close()
        self.tensorboard.close()
