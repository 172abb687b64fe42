"""Reading a map-style ``torch.utils.data.Dataset`` through a ``DataLoader``, with worker processes that
never outlive the process that reads, and waits that end.

A run's reading settings are a :class:`Loading`: how many worker processes read and collate samples
(``--loader-workers``; 0 reads in the training process itself), whether batches go to page-locked memory
(on a GPU, so that the copy to the device can overlap), and how long to wait for a batch (``--timeout``).

The workers are forked: a fork starts in milliseconds and takes the dataset as it is (a lambda, a class
defined in a notebook or test module, an open file), where ``spawn`` or ``forkserver`` would import torch
again in every worker and pickle the dataset to it. A worker computes nothing with gloo or CUDA, so the
threads of a training process's process group do not matter to it (a dataset must not touch CUDA). Each
worker gets ``SIGKILL`` when its parent dies (``PR_SET_PDEATHSIG``, as the launcher's processes do), and
:func:`load_batches` shuts the workers down whenever its iteration ends: finished, failed or interrupted.

    >>> from torch.utils.data import TensorDataset
    >>> dataset = TensorDataset(torch.arange(6.0), torch.arange(6))
    >>> [labels.tolist() for _, labels in load_batches(dataset, [[0, 1], [4, 5]], Loading(), seed=0)]
    [[0, 1], [4, 5]]
"""

from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from scaletrain.errors import ConfigError, DataError

__all__ = ["Loading", "load_batches"]

#: How the loader's workers start: fork where the platform has it (see the module's docstring).
START_METHOD = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"


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
    loader = DataLoader(
        dataset,
        batch_sampler=batch_sampler,
        num_workers=workers,
        pin_memory=loading.pin_memory,
        timeout=loading.timeout if workers else 0,
        worker_init_fn=functools.partial(_die_with_parent, os.getpid()) if workers else None,
        multiprocessing_context=START_METHOD if workers else None,
        generator=torch.Generator().manual_seed(seed),
    )
    iterator = iter(loader)
    try:
        yield from iterator
    except RuntimeError as exc:
        if "timed out" not in str(exc):
            raise
        raise DataError(
            f"the data loader's {workers} worker processes gave no batch within {loading.timeout:g} s (--timeout); "
            "reading one batch takes longer than that, or the dataset hangs: raise --timeout, or check the "
            "dataset's __getitem__"
        ) from None
    finally:
        shutdown = getattr(iterator, "_shutdown_workers", None)  # now, not when the iterator is collected
        if shutdown is not None:
            shutdown()


def _die_with_parent(parent: int, worker_id: int) -> None:
    """In each loader worker (Linux): ``SIGKILL`` when the training process ``parent`` dies, whatever kills it
    (the launcher's ``SIGTERM``, an ``os._exit``), instead of torch's check of the parent every 5 s."""
    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # it died before the request: nobody is left to read for
        os._exit(1)
