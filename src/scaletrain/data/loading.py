"""Reading a map-style ``torch.utils.data.Dataset`` through a ``DataLoader``, with worker processes that
never outlive the process that reads, and waits that end.

A run's reading settings are a :class:`Loading`: how many worker processes read and collate samples
(``--loader-workers``; 0 reads in the training process itself), whether batches go to page-locked memory
(on a GPU, so that the copy to the device can overlap), and how long to wait for a batch (``--timeout``).

The workers are forked: a fork starts in milliseconds and takes the dataset as it is (a lambda, a class
defined in a notebook or test module, an open file), where ``spawn`` or ``forkserver`` would import torch
again in every worker and pickle the dataset to it. The forked process has threads (gloo's, the
heartbeat's), whose locks a child must not need: a worker only reads and collates (a dataset must not touch
CUDA or the process group), and the one C call of its own, ``prctl``, is looked up before the fork. Each
worker gets ``SIGKILL`` when its parent dies (``PR_SET_PDEATHSIG``, as the launcher's processes do), and
:func:`load_batches` shuts the workers down whenever its iteration ends: finished, failed or interrupted.

A batch that does not come within the timeout ends the run with one line, and a note under its traceback says
where each worker was at that moment: its Python stack (every worker dumps it with :mod:`faulthandler` on
``SIGUSR2``), or that it was stopped (``SIGSTOP``, a debugger) or waiting in the kernel and could not answer.

    >>> from torch.utils.data import TensorDataset
    >>> dataset = TensorDataset(torch.arange(6.0), torch.arange(6))
    >>> [labels.tolist() for _, labels in load_batches(dataset, [[0, 1], [4, 5]], Loading(), seed=0)]
    [[0, 1], [4, 5]]
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import functools
import multiprocessing
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from scaletrain.errors import ConfigError, DataError
from scaletrain.processes import process_state

__all__ = ["Loading", "load_batches"]

#: How the loader's workers start: fork where the platform has it (see the module's docstring).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
#: The signal on which a loader worker writes its Python stack (:func:`_worker_stacks`).
STACK_SIGNAL = signal.SIGUSR2
#: libc's ``prctl``, looked up here: a worker forked from a process with threads calls it, and does not ``dlopen``.
_PRCTL = ctypes.CDLL(None, use_errno=True).prctl if sys.platform.startswith("linux") else None


@dataclass(frozen=True)
class Loading:
    """How a run reads its data: ``workers`` loader processes (0: in the training process),
    ``pin_memory`` (page-locked batches for a GPU) and ``timeout`` (seconds a wait for one batch may take).

    >>> Loading(workers=-1)
    Traceback (most recent call last):
    scaletrain.errors.ConfigError: loader_workers must be a whole number ≥ 0 (0 reads in the training process), got -1
    """

    workers: int = 0
    pin_memory: bool = False
    timeout: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.workers, int) or isinstance(self.workers, bool) or self.workers < 0:
            raise ConfigError(
                f"loader_workers must be a whole number ≥ 0 (0 reads in the training process), got {self.workers!r}"
            )
        if not self.timeout > 0:
            raise ConfigError(f"timeout must be > 0 seconds, got {self.timeout!r}")


def load_batches(dataset: Dataset, batch_sampler: Iterable[list[int]], loading: Loading, *, seed: int) -> Iterator[Any]:
    """The collated batches of ``dataset`` at the indices ``batch_sampler`` gives, read as ``loading`` says.

    ``seed`` seeds the workers' random generators (a dataset's random transforms) instead of torch's global
    generator, whose state a run keeps in its checkpoints. A batch not there within the timeout is a
    :class:`~scaletrain.errors.DataError`; the workers are shut down when the iteration ends in any way.
    """
    workers = loading.workers
    # where the forked workers write their stacks when asked (a spawned worker cannot inherit the file)
    asks = workers and START_METHOD == "fork"
    with tempfile.TemporaryFile() if asks else contextlib.nullcontext() as stacks:
        loader = DataLoader(
            dataset,
            batch_sampler=batch_sampler,
            num_workers=workers,
            pin_memory=loading.pin_memory,
            timeout=loading.timeout if workers else 0,
            worker_init_fn=functools.partial(_prepare_worker, os.getpid(), stacks and stacks.fileno())
            if workers
            else None,
            multiprocessing_context=START_METHOD if workers else None,
            generator=torch.Generator().manual_seed(seed),
        )
        iterator = iter(loader)
        try:
            yield from iterator
        except RuntimeError as exc:
            if "timed out" not in str(exc):
                raise
            error = DataError(
                f"the data loader's {workers} worker processes gave no batch within {loading.timeout:g} s "
                "(--timeout); reading one batch takes longer than that, or the dataset hangs: raise --timeout, or "
                "check the dataset's __getitem__ (where each worker was is noted under the traceback)"
            )
            error.add_note(_worker_stacks(getattr(iterator, "_workers", []), stacks))
            raise error from None
        finally:
            shutdown = getattr(iterator, "_shutdown_workers", None)  # now, not when the iterator is collected
            if shutdown is not None:
                shutdown()


def _worker_stacks(processes: list, stacks: Any) -> str:
    """Where each of the loader's worker ``processes`` is: its Python stack, written into ``stacks`` on
    :data:`STACK_SIGNAL`, or why it cannot answer (stopped, waiting in the kernel, gone)."""
    notes = []
    for process in processes:
        pid, state = process.pid, process_state(process.pid)
        if state is None or state in "ZX":
            notes.append(f"loader worker pid {pid}: it has exited")
        elif state in "Tt":
            notes.append(f"loader worker pid {pid}: stopped (state {state}: SIGSTOP, or a debugger); it cannot answer")
        elif stacks is None:
            notes.append(f"loader worker pid {pid}: state {state} (its stack is only asked of forked workers)")
        else:
            notes.append(f"loader worker pid {pid} (state {state}):\n{_stack_of(pid, stacks)}")
    return "\n".join(notes) or "the loader's workers were not found"


def _stack_of(pid: int, stacks: Any, wait: float = 2.0) -> str:
    """What worker ``pid`` writes into ``stacks`` on :data:`STACK_SIGNAL` within ``wait`` seconds."""
    begin = os.fstat(stacks.fileno()).st_size
    try:
        os.kill(pid, STACK_SIGNAL)
    except ProcessLookupError:
        return "  it exited before it could answer"
    deadline, size = time.monotonic() + wait, begin
    while time.monotonic() < deadline:
        time.sleep(0.05)
        grown = os.fstat(stacks.fileno()).st_size
        if grown > begin and grown == size:  # written, and nothing more came in the last 50 ms
            break
        size = grown
    written = os.pread(stacks.fileno(), size - begin, begin).decode("utf-8", errors="replace")
    return written.rstrip() or f"  no stack came within {wait:g} s (state D: waiting in the kernel, or not scheduled)"


def _prepare_worker(parent: int, stacks: int | None, worker_id: int) -> None:
    """In each loader worker (Linux): ``SIGKILL`` when the training process ``parent`` dies, whatever kills it
    (the launcher's ``SIGTERM``, an ``os._exit``), instead of torch's check of the parent every 5 s; and its
    Python stack written to the file ``stacks`` on :data:`STACK_SIGNAL`."""
    if stacks is not None:
        faulthandler.register(STACK_SIGNAL, file=stacks, all_threads=True)
    if _PRCTL is None:
        return
    pr_set_pdeathsig = 1
    _PRCTL(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request: nobody is left to read for
        os._exit(1)
