"""The Brno thesis's speedup estimator (Šlampa 2017, ch. 4; SPEC §2), formula for formula.

Inputs are two measured times: ``t_grad``, the gradient of one batch on one worker, and ``t_comm``, the transfer
of all weights once between a worker and the server. Weight updates, set-up and finish are neglected. Speedup
S = D·t_grad / t_train (eq. 4.23). Synchronous training runs in iterations, t_train = I·t_iter (4.2), with
I = D/N for ``sync-join`` and I = D for ``sync-split``:

- central server, best case (4.4–4.6): t_iter = (N+1)·t_comm + t_grad
- central server, worst case (4.7–4.9): t_iter = 2N·t_comm + t_grad
- central server, estimate (4.11): the mean of the two
- distributed (sharded) server (4.12): t_iter = 2·t_comm·(N−1)/N + t_grad

Asynchronous training (each worker trains D/N batches):

- central best (4.13–4.15): t_train = max((D+1)·t_comm + t_grad, (N−1)·t_comm + (D/N)(2·t_comm + t_grad))
- central worst (4.16–4.18): t_train = (D/N)(2N·t_comm + t_grad)
- central estimate (4.20): the mean of the two
- distributed server (4.21): t_train = (D/N)(2·t_comm·(N−1)/N + t_grad)

``sync-split`` feeds the same iteration formulas with the gradient time of 1/N of a batch; given one ``t_grad``
(the interface of the thesis's ``estimate.py``), that is t_grad/N.

>>> round(speedup(t_grad=0.758, t_comm=0.033, kind="sync-join", server="distributed", workers=8, batches=128), 2)
7.43
"""

from __future__ import annotations

import math

import numpy as np

from scaletrain.errors import ConfigError

__all__ = ["CASES", "KINDS", "SERVERS", "speedup", "speedups", "train_time"]

KINDS = ("async", "sync-join", "sync-split")
SERVERS = ("central", "distributed")
SERVER_ALIASES = {"sharded": "distributed"}
CASES = ("best", "worst", "mean")


def check(kind: str, server: str, case: str, workers: int, batches: float, t_grad: float, t_comm: float) -> str:
    """Validate the inputs; returns the server name with aliases resolved."""
    server = SERVER_ALIASES.get(server, server)
    if kind not in KINDS:
        raise ConfigError(f"unknown --type {kind!r}; choose one of {', '.join(KINDS)}")
    if server not in SERVERS:
        raise ConfigError(f"unknown --server {server!r}; choose central or distributed (alias sharded)")
    if case not in CASES:
        raise ConfigError(f"unknown --case {case!r}; choose best, worst or mean")
    if workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}")
    if not 0 < batches < math.inf:
        raise ConfigError(f"--batches must be a number > 0, got {batches}")
    if not 0 < t_grad < math.inf or not 0 <= t_comm < math.inf:
        raise ConfigError(f"--t-grad must be > 0 and --t-comm ≥ 0 seconds (finite), got {t_grad} and {t_comm}")
    return server


def train_time(
    *, t_grad: float, t_comm: float, kind: str, server: str, workers: int, batches: float, case: str = "mean"
) -> float:
    """t_train of D = ``batches`` batches on N = ``workers`` workers (seconds).

    >>> train_time(t_grad=1.0, t_comm=0.5, kind="sync-join", server="central", workers=2, batches=4, case="best")
    5.0
    """
    server = check(kind, server, case, workers, batches, t_grad, t_comm)
    return float(_train_time(t_grad, t_comm, kind, server, np.array(workers), batches, case))


def _train_time(
    t_grad: float,
    t_comm: float,
    kind: str,
    server: str,
    workers: np.ndarray,
    batches: float,
    case: str,
    split: bool = False,
) -> np.ndarray:
    """:func:`train_time` of inputs :func:`check` has passed, for an array of worker counts at once.

    ``split`` (async, ``--async-batches split``): the D batches are N·D updates of a gradient of t_grad / N,
    the thesis's formulas applied to those updates."""
    n, d = workers, batches
    if kind == "async" and split:
        t_grad, d = t_grad / n, d * n
    if kind == "async":
        if server == "distributed":
            return (d / n) * (2 * t_comm * (n - 1) / n + t_grad)  # 4.21
        best = np.maximum((d + 1) * t_comm + t_grad, (n - 1) * t_comm + (d / n) * (2 * t_comm + t_grad))  # 4.15
        worst = (d / n) * (2 * n * t_comm + t_grad)  # 4.18
        return _pick(best, worst, case)
    iterations = d / n if kind == "sync-join" else d  # 4.2
    gradient = t_grad if kind == "sync-join" else t_grad / n
    if server == "distributed":
        return iterations * (2 * t_comm * (n - 1) / n + gradient)  # 4.12
    best = (n + 1) * t_comm + gradient  # 4.6
    worst = 2 * n * t_comm + gradient  # 4.9
    return iterations * _pick(best, worst, case)  # 4.11


def _pick(best: np.ndarray, worst: np.ndarray, case: str) -> np.ndarray:
    return {"best": best, "worst": worst, "mean": (best + worst) / 2}[case]


def speedup(
    *,
    t_grad: float,
    t_comm: float,
    kind: str,
    server: str,
    workers: int,
    batches: float,
    case: str = "mean",
    split: bool = False,
) -> float:
    """S = D·t_grad / t_train (eq. 4.23); ``split``: see :func:`_train_time`."""
    server = check(kind, server, case, workers, batches, t_grad, t_comm)
    time = float(_train_time(t_grad, t_comm, kind, server, np.array(workers), batches, case, split))
    return batches * t_grad / time


def speedups(
    *,
    t_grad: float,
    t_comm: float,
    kind: str,
    server: str,
    workers: int,
    batches: float,
    case: str = "mean",
    split: bool = False,
) -> list[float]:
    """Speedups for 1..N workers (what ``--output csv`` prints); ``split``: see :func:`_train_time`.

    >>> [round(s, 3) for s in speedups(t_grad=1, t_comm=0, kind="async", server="central", workers=3, batches=6)]
    [1.0, 2.0, 3.0]
    >>> [round(s, 3) for s in speedups(t_grad=1, t_comm=0.1, kind="async", server="distributed", workers=2,
    ...                                batches=6, split=True)]
    [1.0, 1.667]
    """
    server = check(kind, server, case, workers, batches, t_grad, t_comm)
    times = _train_time(t_grad, t_comm, kind, server, np.arange(1, workers + 1), batches, case, split)
    return (batches * t_grad / times).tolist()
