"""MXNet 1.9 (Gluon) program, ``gpt`` part: scaletrain's small GPT, trained as scaletrain prepared it.

``mxnet_worker.py`` runs it when the spec's workload is ``gpt`` (the contract is in :mod:`scaletrain.engines`, the
windows in :mod:`scaletrain.engines.prepare_text`, the weights' names in ``gpt_common.py``); like that program it
needs only the standard library, NumPy and MXNet. The model is a Gluon ``Block`` of Gluon layers that keep torch's
layouts (``Embedding``, ``Dense`` with ``flatten=False``, ``LayerNorm`` ε 1e-5, whose ``gamma`` and ``beta`` are
torch's ``weight`` and ``bias``) and a ``positions`` parameter: pre-norm blocks of causal multi-head attention
(softmax of ``q·kᵀ/√d``, the later words masked) and a GELU MLP four times as wide (erf's GELU, as torch's), dropout
on the embeddings, the attention weights and each residual branch (active only under ``autograd.record``), the
output layer the embedding's transpose (``FullyConnected`` on the embedding's own weight). The objective is
scaletrain's mean cross-entropy over every word of the (global) batch; the whole gradient's norm is clipped as torch's
``clip_grad_norm_`` does (``mxnet_lstm.clip``), then torch's AdamW at scaletrain's schedule (``mxnet_adamw.py``: MXNet
1.9 has an AdamW operator but no optimizer).

Modes, as for the LSTM (``mxnet_lstm.py``): ``local``; ``sync`` (``dist_sync``: each worker pushes the gradient of
its summed loss and pulls the sum over all workers, then divides it by the global batch's words, clips it and applies
AdamW itself); ``async`` (``dist_async``: each worker divides its gradient by its own batch's words and clips it, as
scaletrain's parameter server clips each worker's gradient, then pushes it to the servers' AdamW, which counts every
worker's push as an update, and pulls the weights back).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np

MASKED = -1e30  # added to a later word's score: its softmax weight is exactly 0


def build_network(mx: Any, model: dict, values: list[np.ndarray]) -> tuple[Any, list[tuple[str, Any]]]:
    """The GPT with the weights ``values`` (``gpt_common.load_init``); the network and its parameters in the order of
    ``gpt_common.weight_names``, each with its torch name."""
    import gpt_common  # beside this file
    from mxnet import gluon
    from mxnet.gluon import nn

    vocabulary, width, heads, rate = model["vocab_size"], model["width"], model["heads"], model["dropout"]
    size = width // heads

    def drop(x: Any) -> Any:
        return mx.nd.Dropout(x, p=rate) if rate else x  # Dropout acts only while autograd records for training

    class Block(gluon.Block):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            with self.name_scope():
                self.norm1, self.norm2 = nn.LayerNorm(in_channels=width), nn.LayerNorm(in_channels=width)
                self.attention = nn.Dense(3 * width, use_bias=False, flatten=False, in_units=width)
                self.projection = nn.Dense(width, flatten=False, in_units=width)
                self.mlp0 = nn.Dense(4 * width, flatten=False, in_units=width)
                self.mlp2 = nn.Dense(width, flatten=False, in_units=4 * width)

        def forward(self, x: Any) -> Any:
            rows, steps, _ = x.shape
            q, key, value = (
                part.reshape((rows, steps, heads, size)).transpose((0, 2, 1, 3)).reshape((rows * heads, steps, size))
                for part in mx.nd.split(self.attention(self.norm1(x)), num_outputs=3, axis=2)
            )
            later = mx.nd.array(np.triu(np.full((1, steps, steps), MASKED, np.float32), 1))
            scores = mx.nd.broadcast_add(mx.nd.batch_dot(q, key, transpose_b=True) / math.sqrt(size), later)
            attended = mx.nd.batch_dot(drop(mx.nd.softmax(scores, axis=-1)), value)
            attended = (
                attended.reshape((rows, heads, steps, size)).transpose((0, 2, 1, 3)).reshape((rows, steps, width))
            )
            x = x + drop(self.projection(attended))
            hidden = self.mlp0(self.norm2(x))
            hidden = 0.5 * hidden * (1.0 + mx.nd.erf(hidden / math.sqrt(2.0)))
            return x + drop(self.mlp2(hidden))

    class GPT(gluon.Block):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            with self.name_scope():
                self.embedding = nn.Embedding(vocabulary, width)
                self.positions = self.params.get("positions", shape=(model["context"], width))
                self.blocks = nn.Sequential()
                for _ in range(model["layers"]):
                    self.blocks.add(Block())
                self.norm = nn.LayerNorm(in_channels=width)

        def forward(self, words: Any) -> Any:
            positions = mx.nd.slice_axis(self.positions.data(), axis=0, begin=0, end=words.shape[1])
            x = drop(mx.nd.broadcast_add(self.embedding(words), positions.expand_dims(0)))
            x = self.norm(self.blocks(x))
            table = self.embedding.weight.data()
            return mx.nd.FullyConnected(x, table, no_bias=True, num_hidden=vocabulary, flatten=False)

    net = GPT()
    net.initialize(mx.init.Zero())
    params = []
    for name, value in zip(gpt_common.weight_names(model["layers"]), values, strict=True):
        if name in ("positions", "embedding.weight"):
            param = net.positions if name == "positions" else net.embedding.weight
        elif name.startswith("blocks."):
            _, k, rest = name.split(".", 2)
            layer, kind = rest.rsplit(".", 1)
            param = getattr(getattr(net.blocks[int(k)], layer.replace(".", "")), _gluon_kind(layer, kind))
        else:
            param = getattr(net.norm, _gluon_kind("norm", name.split(".")[1]))
        if tuple(param.shape) != value.shape:
            raise ValueError(f"init.npz: {name} has shape {value.shape}, this network's {tuple(param.shape)}")
        param.set_data(mx.nd.array(value, dtype="float32"))
        params.append((name, param))
    return net, params


def _gluon_kind(layer: str, kind: str) -> str:
    """Gluon's name of a block layer's weight: a LayerNorm's ``gamma`` and ``beta``, a Dense's ``weight`` and ``bias``.

    >>> _gluon_kind("norm1", "weight"), _gluon_kind("mlp.0", "bias")
    ('gamma', 'bias')
    """
    if layer.startswith("norm"):
        return {"weight": "gamma", "bias": "beta"}[kind]
    return kind


def word_losses(mx: Any, net: Any, inputs: np.ndarray, targets: np.ndarray) -> Any:
    """The negative log-likelihood of every target word ``(rows, T)``."""
    logits = net(mx.nd.array(inputs))
    return -mx.nd.pick(mx.nd.log_softmax(logits, axis=-1), mx.nd.array(targets), axis=-1)


def perplexity(mx: Any, net: Any, test: np.ndarray, model: dict, beat: Any) -> dict[str, float]:
    """Test perplexity as scaletrain measures it: windows of ``context`` words without overlap, scored 64 at a time,
    no dropout; e^(mean negative log-likelihood per word). Each chunk scored is told to the heartbeat ``beat``."""
    import gpt_common  # beside this file

    total, count = 0.0, 0
    for number, (inputs, targets) in enumerate(gpt_common.evaluation_chunks(test, model["context"]), 1):
        total += float(word_losses(mx, net, inputs, targets).astype("float64").sum().asscalar())
        count += targets.size
        beat.evaluate(number)
    return {"test_perplexity": math.exp(total / count), "test_loss": total / count}


def train(spec: dict[str, Any], index: int, beat: Any) -> None:
    """Train as worker ``index`` (the kvstore's rank where it differs) and write this worker's outputs; each step
    is told to the heartbeat ``beat`` (a ``progress.Progress``)."""
    import gpt_common  # beside this file
    import mxnet as mx
    import mxnet_adamw  # beside this file: imports MXNet, so only now that the threads are set
    import mxnet_lstm  # beside this file: torch's gradient clipping
    import mxnet_worker as common  # the program beside this file (imported here: the doctests import this)
    from mxnet import autograd

    mode, workers, rows, model = spec["mode"], spec["workers"], spec["batch_size"], spec["model"]
    kv, rank = common.kvstore(mx, spec, index)
    with np.load(spec["data"]["tokens"]) as tokens:
        train_words, test = tokens["train"], tokens["test"]
    with np.load(spec["order"]) as orders:
        order = orders[f"w{rank}"]
    if len(order) != spec["steps"][rank] or (len(order) and order.shape[1] != rows):
        raise ValueError(f"order.npz w{rank} has shape {order.shape}, the spec {spec['steps'][rank]} steps")
    names = gpt_common.weight_names(model["layers"])
    net, params = build_network(mx, model, gpt_common.load_init(spec))
    weights = [param.data() for _, param in params]
    grads = [param.grad() for _, param in params]
    keys = list(range(len(params)))
    global_words = rows * model["context"] * (workers if mode == "sync" else 1)
    optimizer = mxnet_adamw.optimizer(spec)  # the gradient is divided by the words before it is clipped
    updater = None
    if mode == "async":
        kv.set_optimizer(optimizer)  # pickled to the servers before any push
    else:
        updater = mx.optimizer.get_updater(optimizer)
    if kv is not None:
        kv.init(keys, weights)  # rank 0's values; a barrier of all workers
        kv.pull(keys, out=weights)
    meter = common.Meter(spec["warmup_steps"])
    mx.nd.waitall()
    for step, numbers in enumerate(order):
        begin = time.perf_counter()
        inputs, targets = gpt_common.windows(train_words, numbers, model["context"])
        fetched = time.perf_counter()
        with autograd.record():
            losses = word_losses(mx, net, inputs, targets)
            total = losses.sum()
        total.backward()  # the gradient of the summed loss; divided by the words below
        mean_loss = losses.mean()
        if mode == "async":
            for grad in grads:
                grad[:] = grad / global_words
            mxnet_lstm.clip(mx, grads, spec["clip_norm"])
        mx.nd.waitall()
        exchange = time.perf_counter()
        if kv is not None:
            beat.exchange()
        if mode == "sync":
            kv.push(keys, grads)
            kv.pull(keys, out=grads)  # the sum over all workers
        elif mode == "async":
            kv.push(keys, grads)
            kv.pull(keys, out=weights)  # updated on the servers
        mx.nd.waitall()
        communication = time.perf_counter() - exchange if kv is not None else 0.0
        if updater is not None:
            for grad in grads:
                grad[:] = grad / global_words
            mxnet_lstm.clip(mx, grads, spec["clip_norm"])
            for key in keys:
                updater(key, grads[key], weights[key])
            mx.nd.waitall()
        seconds = time.perf_counter() - begin
        value = float(mean_loss.asscalar())
        if not math.isfinite(value):
            raise FloatingPointError(f"the training loss became {value} at step {step + 1}")
        meter.add(seconds, communication, fetched - begin, value)
        beat.step(step + 1)

    def results() -> dict[str, float]:
        values = [param.data().asnumpy() for _, param in params]
        np.savez(Path(spec["out"]) / "final.npz", **gpt_common.final_weights(names, values))
        return perplexity(mx, net, test, model, beat) | {"parameters": sum(value.size for value in values)}

    common.finish(mx, spec, kv, rank, keys, weights, meter, results, beat)
