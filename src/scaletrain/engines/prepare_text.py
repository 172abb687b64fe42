"""What a foreign engine reads for ``ptb-lstm`` and ``gpt``: the texts as word ids, and each worker's windows of them.

scaletrain's own vocabulary code encodes the texts (:func:`scaletrain.data.ptb.load_ptb`, through the
workload), so the programs need no tokenizer: ``tokens.npz`` holds ``train`` and ``test``, 1-D int32 word
ids. The windows are those of :meth:`scaletrain.workloads.ptb_lstm.PTBLSTMWorkload.train_batches`: the
training text cut into ``global batch`` parallel rows of ``L`` words each (Zaremba's layout), window ``n`` of
row ``r`` being the words ``r·L + n·num_steps …`` and its targets one word later; a worker of a synchronous
run reads its slice of the rows (``Part``), an asynchronous one its chunk of each epoch's windows. In
``order.npz`` ``w<i>[s, k]`` is where, in ``train``, the window of worker ``i``'s row ``k`` at its step ``s``
starts, and ``r<i>[s]`` is 1 where the carried state starts again from zeros (the first window a worker
reads in an epoch, as scaletrain's loop drops the state at each epoch's end).

``gpt`` reads the same ``tokens.npz``; its samples are :meth:`scaletrain.workloads.gpt.GPTWorkload.train_batches`'
windows of ``context + 1`` words cut without overlap, window ``n`` starting at word ``n·context``, drawn by
scaletrain's sampler (:func:`scaletrain.engines.orders.worker_orders`): ``w<i>[s, k]`` is the number of worker
``i``'s ``k``-th window at step ``s``. Its spec also carries torch's AdamW settings and the rate's schedule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from scaletrain.engines.orders import worker_orders
from scaletrain.errors import ConfigError
from scaletrain.train.plan import WorkerPlan
from scaletrain.workloads import create_workload

__all__ = ["FOLLOWED_OPTIONS", "TOKENS_NAME", "prepare_text", "text_orders"]

TOKENS_NAME = "tokens.npz"
ORDER_NAME = "order.npz"
#: the workload options (``-o``) the engines' programs follow, by workload; any other one they refuse
FOLLOWED_OPTIONS: dict[str, tuple[str, ...]] = {
    "ptb-lstm": ("num_steps", "hidden_size", "layers", "vocab_size", "train_split", "eval_batch_size"),
    "gpt": ("layers", "heads", "width", "context", "dropout", "vocab_size", "train_split"),
}


def text_orders(
    plans: list[WorkerPlan], words: int, *, batch_size: int, num_steps: int, epochs: int | None, steps: int | None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each worker's window starts ``(steps, rows)`` and state resets ``(steps,)`` over a text of ``words``.

    >>> from scaletrain.data.sampler import Part
    >>> two = [WorkerPlan(global_batch_factor=2, part=Part(i, 2)) for i in range(2)]
    >>> (first, reset), (second, _) = text_orders(two, 45, batch_size=2, num_steps=2, epochs=1, steps=None)
    >>> first.tolist(), second.tolist(), reset.tolist()  # 4 rows of 11 words: (11 - 1) // 2 = 5 windows
    ([[0, 11], [2, 13], [4, 15], [6, 17], [8, 19]], [[22, 33], [24, 35], [26, 37], [28, 39], [30, 41]], [1, 0, 0, 0, 0])
    """
    orders = []
    for plan in plans:
        rows = batch_size * plan.global_batch_factor
        length = words // rows
        per_epoch = (length - 1) // num_steps
        mine = np.arange(rows)[plan.part.slice(rows)] * length
        numbers = plan.numbers(0, per_epoch)
        count = epochs if epochs is not None else -(-steps // max(len(numbers), 1))
        starts = [mine + number * num_steps for _ in range(count) for number in numbers]
        resets = [number == numbers.start for _ in range(count) for number in numbers]
        if steps is not None:
            starts, resets = starts[:steps], resets[:steps]
        shape = (0, len(mine))
        orders.append(
            (np.stack(starts).astype(np.int64) if starts else np.zeros(shape, np.int64), np.array(resets, np.uint8))
        )
    return orders


def prepare_text(run: Any, plans: list[WorkerPlan], out: Path) -> tuple[dict[str, Any], list[np.ndarray]]:
    """Write ``tokens.npz`` and ``order.npz`` for ``run`` (an :class:`~scaletrain.engines.prepare.EngineRun`);
    the spec's fields of the workload and each worker's windows."""
    unfollowed = sorted({key.replace("-", "_") for key in run.options} - set(FOLLOWED_OPTIONS.get(run.workload, ())))
    if unfollowed:
        raise ConfigError(
            f"workload option {', '.join(unfollowed)}: the engines follow only "
            f"{', '.join(FOLLOWED_OPTIONS.get(run.workload, ())) or 'none'} for {run.workload}"
        )
    workload = create_workload(run.workload, run.options)
    options = workload.options
    data = workload.load_data(run.data_dir, download=False)
    train, test = data.train.numpy(), data.test.numpy()
    if max(int(train.max()), int(test.max())) >= options.vocab_size:
        raise ConfigError(f"the text has {len(data.vocabulary)} words, more than vocab_size {options.vocab_size}")
    global_batch = run.batch_size * plans[0].global_batch_factor
    data_fields = {"tokens": str(out / TOKENS_NAME), "train_split": options.train_split}
    common = {"steps_per_epoch": workload.batches_per_epoch(data, global_batch), "metric": workload.metric}
    if run.workload == "gpt":
        fields, orders = _prepare_windows(run, workload, train, test, global_batch, out)
        return {**fields, "data": data_fields, **common}, orders
    if (len(train) // global_batch - 1) // options.num_steps < 1:
        raise ConfigError(
            f"the training text ({len(train)} words) has no window of {options.num_steps} words for {global_batch} rows"
        )
    np.savez(out / TOKENS_NAME, train=train.astype(np.int32), test=test.astype(np.int32))
    orders = text_orders(
        plans, len(train), batch_size=run.batch_size, num_steps=options.num_steps, epochs=run.epochs, steps=run.steps
    )
    saved = {f"w{i}": starts for i, (starts, _) in enumerate(orders)}
    saved |= {f"r{i}": resets for i, (_, resets) in enumerate(orders)}
    np.savez(out / ORDER_NAME, **saved)
    fields = {
        "model": {
            "vocab_size": options.vocab_size,
            "hidden_size": options.hidden_size,
            "layers": options.layers,
            "num_steps": options.num_steps,
            "eval_batch_size": options.eval_batch_size,
        },
        "data": data_fields,
        "train_size": len(train),
        **common,
    }
    return fields, [starts for starts, _ in orders]


def _prepare_windows(
    run: Any, workload: Any, train: np.ndarray, test: np.ndarray, global_batch: int, out: Path
) -> tuple[dict[str, Any], list[np.ndarray]]:
    """``gpt``: ``tokens.npz``, each worker's window numbers in ``order.npz``, and the spec's fields of the model,
    the optimizer (torch's AdamW defaults, its weight decay where ``--weight-decay`` leaves it, as scaletrain's run
    does) and the schedule (the workload's warm-up unless the run gives one, then cosine to 0 over the run's
    updates: every worker's in ``async``, where each batch is an update)."""
    options = workload.options
    windows = (len(train) - 1) // options.context
    if windows < global_batch:
        raise ConfigError(
            f"the training text ({len(train)} words) has {windows} windows of {options.context} words, "
            f"fewer than a global batch of {global_batch}"
        )
    np.savez(out / TOKENS_NAME, train=train.astype(np.int32), test=test.astype(np.int32))
    orders = worker_orders(run, windows)
    np.savez(out / ORDER_NAME, **{f"w{i}": order for i, order in enumerate(orders)})
    adamw = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults
    steps = [len(order) for order in orders]
    warmup = workload.defaults.lr_warmup if run.lr_warmup is None else run.lr_warmup
    fields = {
        "model": {name: getattr(options, name) for name in ("vocab_size", "width", "heads", "layers", "context")}
        | {"dropout": options.dropout},
        "train_size": windows,
        "optimizer": {
            "name": "adamw",
            "betas": list(adamw["betas"]),
            "eps": adamw["eps"],
            "weight_decay": run.weight_decay or adamw["weight_decay"],
        },
        "schedule": {"kind": "cosine", "warmup": warmup, "updates": sum(steps) if run.mode == "async" else steps[0]},
    }
    return fields, orders
