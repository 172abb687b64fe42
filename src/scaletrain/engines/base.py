"""What scaletrain knows of a foreign engine: its pinned packages, its program, its workloads, its processes.

One engine is one module with one :class:`Engine` (``tensorflow.py``, ``mxnet.py``) and one line in
:mod:`scaletrain.engines.registry`. The engine says which processes a layout has (:meth:`Engine.roles`) and
what each is told of the others (:meth:`Engine.environment`); the launcher does the rest alike for all.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Engine", "Host", "Role", "program_path"]

PROGRAMS = Path(__file__).resolve().parent / "programs"


@dataclass(frozen=True)
class Role:
    """One process of a foreign run: ``worker`` 0, ``ps`` 1, ``scheduler`` 0 …

    ``trains``: it computes batches (a worker). ``ends_itself``: it exits when training is over; the
    others (servers that serve until they are stopped) the launcher stops once those that do have ended.
    """

    name: str
    index: int
    trains: bool = False
    ends_itself: bool = True

    @property
    def label(self) -> str:
        return f"{self.name} {self.index}"


@dataclass(frozen=True)
class Host:
    """Where one process of a foreign run listens: its address, port and network interface."""

    address: str
    port: int
    interface: str


@dataclass(frozen=True)
class Engine:
    """A foreign framework scaletrain can run: override :meth:`roles` and :meth:`environment`."""

    name: str
    #: pip requirements of its environment, pinned
    packages: tuple[str, ...]
    #: the module its environment imports (to check the install and read the version)
    module: str
    #: the worker program's file name in ``programs/``
    program: str
    #: the workloads its program implements
    workloads: tuple[str, ...]
    #: each mode it runs (``local``, ``sync``, ``async``) and what carries it
    modes: tuple[tuple[str, str], ...]
    #: the workloads that run in some of the modes only, with those modes (the others run in every mode)
    workload_modes: tuple[tuple[str, tuple[str, ...]], ...] = ()
    #: modes whose step time cannot be split into compute, communication and waiting (shown as unmeasured)
    unsplit: tuple[str, ...] = ()
    #: lines of its own start-up noise that its processes print whatever the log level (left out of messages)
    noise: tuple[str, ...] = ()

    def roles(self, mode: str, workers: int, servers: int) -> list[Role]:
        raise NotImplementedError

    def environment(self, role: Role, roles: list[Role], hosts: list[Host]) -> dict[str, str]:
        """The variables ``role`` starts with; ``hosts[i]`` is where ``roles[i]`` listens."""
        raise NotImplementedError

    def describe_modes(self) -> str:
        return ", ".join(f"{mode} ({how})" for mode, how in self.modes)

    def is_noise(self, line: str) -> bool:
        return any(re.search(pattern, line) for pattern in self.noise)


def program_path(engine: Engine) -> Path:
    return PROGRAMS / engine.program
