"""``--async-batches``: how asynchronous workers divide ``--batch-size``.

**What.** ``split`` (the default): with ``N`` asynchronous workers and ``--batch-size B`` every update is a
batch of ``p = B // N`` samples (each worker a contiguous share of the epoch's batches of ``p``), and the
server applies it at the rate times ``p / B``. A round of ``N`` updates then moves the weights as one step of
``B`` at the full rate would: the per-sample rate is the one-process run's, and with no staleness the run is
one process's at ``B`` (to the order of the updates). ``share`` is Downpour's (Dean et al. 2012; TensorFlow's
``ParameterServerStrategy`` and MXNet's ``dist_async`` do the same): every update a whole ``B`` at the full
rate.

**Why ``split`` is the default.** A gradient ``τ`` updates old misses ``τ`` updates. Under ``share`` each of
them is a whole step of ``B``, so with 3 workers (``τ`` ≈ 2) a gradient lags two full steps behind; under
``split`` each is a third of a step, and the lag is two thirds of one. No rate rule recovers that under
``share``: keeping the rate keeps the lag, and lowering it slows the run per sample (docs/distributed.md has
both). Measured (PTB LSTM, plain SGD lr 1.0, batch 20, 2 epochs, 3 workers; docs/distributed.md):
one process 448; ``share`` 639–708 (central), 671 or diverging (sharded); ``split`` within 10 % of one process.

**When ``share`` is the better choice.** ``split`` exchanges the whole model ``N`` times as often per sample,
so where the exchange, not the gradient, bounds the step (slow links, a large model), ``share`` trains more
samples per second; and each worker's batch is ``B // N``, which uses a device less fully. Its quality at a
given rate is Downpour's.

**Cost.** Per sample, ``N`` times the exchanges; per update, a gradient of ``B // N``. ``--steps`` counts
updates, so a ``split`` run of ``--steps S`` trains ``S · (B // N)`` samples.
"""

from __future__ import annotations

from scaletrain.config import TrainConfig
from scaletrain.parallel.strategies.base import Layout
from scaletrain.parallel.strategies.ps.options import ps_options

__all__ = ["batch_share", "split_over", "splits", "update_batch"]


def splits(config: TrainConfig, layout: Layout) -> bool:
    """Whether this run's asynchronous workers divide each batch (``--async-batches split``, more than one)."""
    return layout.sync == "async" and layout.workers > 1 and ps_options(config)["async_batches"] == "split"


def split_over(config: TrainConfig, layout: Layout) -> int:
    """Over how many workers each batch is divided into updates: N under split, else 1 (``prepare``'s
    ``async_split``)."""
    return layout.workers if splits(config, layout) else 1


def update_batch(config: TrainConfig, layout: Layout, batch_size: int) -> int | None:
    """The batch of one update when the run splits ``batch_size`` over its asynchronous workers, else None.

    >>> split = TrainConfig("x", workers=3, strategy="ps", sync="async", strategy_options={"async_batches": "split"})
    >>> update_batch(split, Layout("ps", 3, sync="async"), 20)
    6
    >>> share = TrainConfig("x", workers=3, strategy="ps", sync="async", strategy_options={"async_batches": "share"})
    >>> update_batch(share, Layout("ps", 3, sync="async"), 20) is None
    True
    """
    return batch_size // layout.workers if splits(config, layout) else None


def batch_share(config: TrainConfig, layout: Layout, batch_size: int) -> float:
    """The factor on the rate of each update: its batch's share of ``batch_size`` (1 unless split).

    >>> split = TrainConfig("x", workers=3, strategy="ps", sync="async", strategy_options={"async_batches": "split"})
    >>> batch_share(split, Layout("ps", 3, sync="async"), 20)
    0.3
    """
    part = update_batch(config, layout, batch_size)
    return 1.0 if part is None else part / batch_size
