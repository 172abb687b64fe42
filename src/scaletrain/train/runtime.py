"""How every scaletrain process sets itself up before its first step: torch threads and the C allocator.

One process alone, a worker or a server of a distributed run, a profile probe and a bench child all
call :func:`configure_process`, so that a step costs the same whichever way the process was started.
Two settings differ between processes unless one place decides them:

- **Threads.** Unless the user names a count, a process takes the cores it may run on divided by
  the processes of its job on this machine (at least 1), so that the processes do not oversubscribe
  the cores between them.
- **The C allocator (glibc only).** glibc returns freed multi-megabyte blocks to the kernel: blocks
  above the mmap threshold are unmapped on ``free``, and free memory at the top of the heap above the
  trim threshold is trimmed. A training step allocates and frees the same activation and gradient
  buffers every step, so each step faults all of them in again. Measured on LeNet-5 at batch 512 with
  1 thread: 7.5k–32k minor page faults per step instead of 1.2k–1.7k, and a step 12–26 % slower. Two
  ``mallopt`` calls at start keep those buffers in the process (see :data:`MMAP_THRESHOLD_BYTES` and
  :data:`TRIM_THRESHOLD_BYTES`).

A user's own ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` (or the same glibc tunables in
``GLIBC_TUNABLES``) wins: we then set nothing and record ``"user"``. ``SCALETRAIN_MALLOC=off`` leaves
glibc's defaults (the "before" side of ``benchmarks/process_behaviour.py``). This module reads those
environment variables and nothing else does.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import torch

from scaletrain.errors import ConfigError

__all__ = [
    "ENV_GLIBC_TUNABLES",
    "ENV_MALLOC",
    "ENV_MALLOC_MMAP_THRESHOLD",
    "ENV_MALLOC_TRIM_THRESHOLD",
    "MMAP_THRESHOLD_BYTES",
    "TRIM_THRESHOLD_BYTES",
    "Allocator",
    "ProcessSettings",
    "available_cores",
    "configure_process",
    "default_threads",
    "tune_allocator",
]

#: ``off`` leaves glibc's allocator as it is; ``on`` (or unset) tunes it.
ENV_MALLOC = "SCALETRAIN_MALLOC"
#: glibc's own variables (note the trailing underscore); a user who sets them keeps them.
ENV_MALLOC_MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_"
ENV_MALLOC_TRIM_THRESHOLD = "MALLOC_TRIM_THRESHOLD_"
ENV_GLIBC_TUNABLES = "GLIBC_TUNABLES"
_USER_TUNABLES = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")

#: Blocks below this come from the heap and are reused rather than unmapped on ``free``. 32 MiB is
#: the largest value 64-bit glibc accepts (``HEAP_MAX_SIZE / 2``; larger is refused), the ceiling its
#: own dynamic threshold climbs to; fixing it from the start spares the first steps' unmaps too.
#: Blocks above it are still unmapped: a single buffer over 32 MiB keeps faulting every step.
MMAP_THRESHOLD_BYTES = 32 * 2**20
#: glibc gives the free top of the heap back to the kernel once it exceeds this. A step's activations
#: and gradients are freed at its end and needed again by the next step; for the thesis workloads at
#: the batch sizes of the bench they are tens to hundreds of MB, more than glibc's dynamic 64 MiB.
#: 1 GiB keeps them; a process whose free heap grows past it (a one-off peak) still gives it back.
TRIM_THRESHOLD_BYTES = 2**30

_M_TRIM_THRESHOLD = -1  # from glibc's <malloc.h>
_M_MMAP_THRESHOLD = -3

#: ``tuned``: our two mallopt calls succeeded; ``user``: the user's own environment decides;
#: ``off``: ``SCALETRAIN_MALLOC=off``; ``unavailable``: not glibc, or mallopt refused.
Allocator = Literal["tuned", "user", "off", "unavailable"]


@dataclass(frozen=True)
class ProcessSettings:
    """What :func:`configure_process` set, for ``summary.json``."""

    threads: int
    allocator: Allocator


def configure_process(
    threads: int | None,
    *,
    processes_on_host: int = 1,
    environ: Mapping[str, str] | None = None,
) -> ProcessSettings:
    """Set torch's intra-op threads and tune glibc's allocator; call once at the start of a process.

    ``threads=None`` takes :func:`default_threads` for ``processes_on_host`` processes of this job on
    this machine. Calling it again with the same arguments changes nothing.

    >>> settings = configure_process(1)
    >>> settings.threads, torch.get_num_threads()
    (1, 1)
    """
    threads = threads if threads is not None else default_threads(processes_on_host)
    torch.set_num_threads(threads)
    return ProcessSettings(threads=threads, allocator=tune_allocator(environ))


def default_threads(processes_on_host: int = 1, cores: int | None = None) -> int:
    """The cores this process may use shared by the processes of its job on this machine, at least 1.

    >>> default_threads(processes_on_host=3, cores=16), default_threads(processes_on_host=4, cores=2)
    (5, 1)
    """
    return max(1, (cores or available_cores()) // max(1, processes_on_host))


def available_cores() -> int:
    """The cores this process may run on: its affinity mask (a cpuset, ``taskset``), else all of them."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0)) or 1
    return os.cpu_count() or 1


def tune_allocator(environ: Mapping[str, str] | None = None) -> Allocator:
    """Keep a step's freed buffers in the process (see the module docstring); says what it did.

    >>> tune_allocator({"SCALETRAIN_MALLOC": "off"})
    'off'
    """
    env = os.environ if environ is None else environ
    switch = env.get(ENV_MALLOC, "").strip().lower()
    if switch not in ("", "on", "off"):
        raise ConfigError(f"{ENV_MALLOC}={env[ENV_MALLOC]!r} is not understood; set it to 'on' or 'off'")
    if switch == "off":
        return "off"
    tunables = env.get(ENV_GLIBC_TUNABLES, "")
    user_variables = (ENV_MALLOC_MMAP_THRESHOLD, ENV_MALLOC_TRIM_THRESHOLD)
    if any(name in env for name in user_variables) or any(tunable in tunables for tunable in _USER_TUNABLES):
        return "user"  # glibc read them at start-up; a mallopt now would override the user's choice
    mallopt = _glibc_mallopt()
    # The mmap threshold first: it is the one glibc may refuse, and then nothing has changed.
    if mallopt is None or not mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES):
        return "unavailable"
    if not mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES):
        return "unavailable"
    return "tuned"


def _glibc_mallopt() -> Callable[[int, int], int] | None:
    """glibc's ``mallopt``; ``None`` for other C libraries, whose mallopt (musl's) may be a stub or
    take other parameter numbers."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 — only glibc has it
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return mallopt
