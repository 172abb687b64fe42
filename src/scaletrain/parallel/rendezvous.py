"""Finding the other processes: torchrun-style environment or a node file, then a c10d group.

Environment variables are read here only. The torchrun contract is honoured (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``, ``LOCAL_RANK``), so any launcher that sets them
works. A node file (Šlampa 2017, ``dist.py --nodefile --index``) lists one ``host:port`` per line,
one line per process; the first line is where rank 0 listens for the rendezvous.
"""

from __future__ import annotations

import datetime
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch.distributed as dist

from scaletrain.errors import ConfigError

__all__ = [
    "ENV_LOCAL_RANK",
    "ENV_LOCAL_WORLD_SIZE",
    "ENV_MASTER_ADDR",
    "ENV_MASTER_PORT",
    "ENV_RANK",
    "ENV_RESTART_COUNT",
    "ENV_USE_AGENT_STORE",
    "ENV_WORLD_SIZE",
    "Rendezvous",
    "connect",
    "own_keys",
]

ENV_RANK = "RANK"
ENV_WORLD_SIZE = "WORLD_SIZE"
ENV_MASTER_ADDR = "MASTER_ADDR"
ENV_MASTER_PORT = "MASTER_PORT"
ENV_LOCAL_RANK = "LOCAL_RANK"
ENV_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
#: Set by torchrun's agent, which already serves a store at MASTER_ADDR:MASTER_PORT for its workers.
ENV_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"
ENV_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"


@dataclass(frozen=True)
class Rendezvous:
    """Where this process stands in the job and where to meet the others."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    local_rank: int = 0
    local_world_size: int = 1  # processes of this job on this machine
    agent_store: bool = False  # torchrun's agent hosts the store: every rank connects as a client
    restart_count: int = 0  # torchrun's restarts so far; keys of each attempt are kept apart

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside a world of {self.world_size} processes")
        if self.world_size > 1 and not 0 < self.master_port < 65536:
            raise ConfigError(f"port {self.master_port} is not a valid TCP port")

    @classmethod
    def alone(cls) -> Rendezvous:
        """A world of one process: it meets nobody, so it has no address to meet at."""
        return cls(rank=0, world_size=1, master_addr="", master_port=0)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Rendezvous:
        """Read the torchrun variables.

        >>> env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
        >>> Rendezvous.from_env(env).rank
        1
        """
        env = os.environ if environ is None else environ
        missing = [name for name in (ENV_RANK, ENV_WORLD_SIZE, ENV_MASTER_ADDR, ENV_MASTER_PORT) if name not in env]
        if missing:
            raise ConfigError(
                f"environment variables {', '.join(missing)} are not set; start the processes with torchrun "
                "(or another launcher that sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), "
                "or use --nodefile"
            )
        try:
            return cls(
                rank=int(env[ENV_RANK]),
                world_size=int(env[ENV_WORLD_SIZE]),
                master_addr=env[ENV_MASTER_ADDR],
                master_port=int(env[ENV_MASTER_PORT]),
                local_rank=int(env.get(ENV_LOCAL_RANK, "0")),
                local_world_size=int(env.get(ENV_LOCAL_WORLD_SIZE, "1")),
                agent_store=env.get(ENV_USE_AGENT_STORE) == "True",
                restart_count=int(env.get(ENV_RESTART_COUNT, "0")),
            )
        except ValueError as exc:
            raise ConfigError(f"a torchrun variable is not a whole number: {exc}") from None

    @classmethod
    def from_nodefile(cls, path: Path, index: int) -> Rendezvous:
        """Rank ``index`` of the processes listed in ``path`` (``host:port`` per line, ``#`` comments)."""
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"cannot read node file {path}: {exc.strerror}") from None
        nodes = [line.split("#", 1)[0].strip() for line in lines]
        nodes = [node for node in nodes if node]
        if not nodes:
            raise ConfigError(f"node file {path} lists no processes; write one host:port per line")
        if not 0 <= index < len(nodes):
            raise ConfigError(f"--index {index} is outside node file {path}, which lists {len(nodes)} processes")
        host, sep, port = nodes[0].rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"node file {path}: first line {nodes[0]!r} must look like host:port")
        hosts = [node.rpartition(":")[0] for node in nodes]
        local_rank = hosts[:index].count(hosts[index])
        return cls(
            rank=index,
            world_size=len(nodes),
            master_addr=host,
            master_port=int(port),
            local_rank=local_rank,
            local_world_size=hosts.count(hosts[index]),
        )


def connect(rendezvous: Rendezvous, *, timeout: float, backend: str = "gloo") -> dist.Store:
    """Join the process group; rank 0 hosts the TCP store. Returns the store (used for small records).

    ``timeout`` bounds every wait: the others arriving (a master address that does not resolve yet, or
    refuses connections, is retried until then), and each collective or transfer afterwards.
    """
    limit = datetime.timedelta(seconds=timeout)
    try:
        store = dist.TCPStore(
            rendezvous.master_addr,
            rendezvous.master_port,
            rendezvous.world_size,
            # Under torchrun the agent already listens on the port (as torch's env:// rendezvous knows).
            is_master=rendezvous.rank == 0 and not rendezvous.agent_store,
            timeout=limit,
            wait_for_workers=False,
        )
        store = own_keys(store, rendezvous)
        dist.init_process_group(
            backend, store=store, rank=rendezvous.rank, world_size=rendezvous.world_size, timeout=limit
        )
    except (RuntimeError, OSError) as exc:
        where = f"{rendezvous.master_addr}:{rendezvous.master_port}"
        reason = str(exc).splitlines()[0]
        if not _resolves(rendezvous.master_addr):
            # torch retries a name that does not resolve until the timeout, as for a refused connection:
            # on a cluster, pod 0's DNS record appears only once its pod has an address.
            reason = f"host not found: the name {rendezvous.master_addr} never resolved"
        raise RendezvousError(
            f"rank {rendezvous.rank} could not join the other {rendezvous.world_size - 1} processes "
            f"at {where} "
            f"within {timeout:.0f} s ({reason}); check that every process was started, "
            "that the address is reachable and that the port is free"
        ) from None
    return store


def own_keys(store: dist.Store, rendezvous: Rendezvous) -> dist.Store:
    """``store`` as this run sees it: under torchrun's agent store, its keys live under their own prefix."""
    if rendezvous.agent_store:
        return dist.PrefixStore(f"/scaletrain/attempt_{rendezvous.restart_count}", store)
    return store


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
    except (OSError, UnicodeError):
        return False
    return True


class RendezvousError(ConfigError):
    """The processes did not find each other."""
