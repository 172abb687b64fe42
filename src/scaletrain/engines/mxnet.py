"""Apache MXNet 1.9 (Gluon): the KVStore ``dist_sync`` and ``dist_async`` on ps-lite servers.

MXNet was retired to the Apache Attic (repository archived in November 2023); it is here because the Jäger
thesis measured it. Its wheel needs ``numpy<1.24`` (it uses ``numpy.bool``), one reason each engine has an
environment of its own. ps-lite finds its peers through the ``DMLC_*`` variables: a scheduler, the
servers and the workers; without ``DMLC_NODE_HOST`` and ``DMLC_INTERFACE`` it binds to another interface.
"""

from __future__ import annotations

from dataclasses import dataclass

from scaletrain.engines.base import Engine, Host, Role

__all__ = ["MXNetEngine"]


@dataclass(frozen=True)
class MXNetEngine(Engine):
    name: str = "mxnet"
    packages: tuple[str, ...] = ("mxnet==1.9.1", "numpy<1.24")
    module: str = "mxnet"
    program: str = "mxnet_worker.py"
    workloads: tuple[str, ...] = ("lenet", "ptb-lstm", "gpt")
    modes: tuple[tuple[str, str], ...] = (
        ("local", "one process"),
        ("sync", "KVStore dist_sync on ps-lite servers"),
        ("async", "KVStore dist_async on ps-lite servers"),
    )

    def roles(self, mode: str, workers: int, servers: int) -> list[Role]:
        """A scheduler, the servers and the workers; ``dist_sync`` has servers too: as many as workers unless
        given (the default of MXNet's own launcher, ``tools/launch.py``).

        >>> [role.label for role in MXNetEngine().roles("sync", 2, 0)]
        ['scheduler 0', 'server 0', 'server 1', 'worker 0', 'worker 1']
        """
        if mode == "local":
            return [Role("worker", 0, trains=True)]
        servers = servers or workers
        return [
            Role("scheduler", 0),
            *(Role("server", i) for i in range(servers)),
            *(Role("worker", i, trains=True) for i in range(workers)),
        ]

    def environment(self, role: Role, roles: list[Role], hosts: list[Host]) -> dict[str, str]:
        """The ``DMLC_*`` variables: the scheduler's address, how many servers and workers, this process's
        role, address and interface (ps-lite listens on a port of its own choice: only the scheduler's is
        given)."""
        if len(roles) == 1:
            return {}
        mine = hosts[roles.index(role)]
        scheduler = hosts[next(i for i, other in enumerate(roles) if other.name == "scheduler")]
        return {
            "DMLC_ROLE": role.name,
            "DMLC_PS_ROOT_URI": scheduler.address,
            "DMLC_PS_ROOT_PORT": str(scheduler.port),
            "DMLC_NUM_SERVER": str(sum(other.name == "server" for other in roles)),
            "DMLC_NUM_WORKER": str(sum(other.name == "worker" for other in roles)),
            "DMLC_NODE_HOST": mine.address,
            "DMLC_INTERFACE": mine.interface,
        }
