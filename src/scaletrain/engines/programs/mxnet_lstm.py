"""MXNet 1.9 (Gluon) program, ``ptb-lstm`` part: scaletrain's LSTM language model, trained as scaletrain prepared it.

``mxnet_worker.py`` runs it when the spec's workload is ``ptb-lstm`` (the contract is in
:mod:`scaletrain.engines`, the windows in :mod:`scaletrain.engines.prepare_text`); like that program it needs
only the standard library, NumPy and MXNet. The model is Gluon's ``Embedding``, the fused ``rnn.LSTM``
(layout ``NTC``) and a ``Dense`` over the vocabulary. Its weights keep torch's layouts and gate order
(``i, f, g, o``, as cuDNN and MXNet's RNN operator have them): ``lstm.weight_ih_l<k>`` is ``l<k>_i2h_weight``,
``lstm.weight_hh_l<k>`` ``l<k>_h2h_weight`` and torch's two biases MXNet's two, ``l<k>_i2h_bias`` and
``l<k>_h2h_bias`` (kept apart: folded into one, their sum would move by one step per update, not by two as in
torch). The objective is scaletrain's: the per-word cross-entropy summed over the window and averaged over
the rows (of the global batch in ``sync``); the whole gradient's norm is clipped to ``clip_norm`` as torch's
``clip_grad_norm_`` does (``g · min(1, clip / (‖g‖ + 1e-6))``), then MXNet's SGD (torch's, see
:func:`mxnet_worker.sgd`).

Modes, as for LeNet (``mxnet_worker.py``): ``local``; ``sync`` (``dist_sync``: each worker carries the state
of its slice of the rows, pushes the gradient of its summed loss and pulls the sum over all workers, then
divides it by the global rows, clips and applies it); ``async`` (``dist_async``: each worker carries the state
of its own windows, divides its gradient by its rows and clips it, as scaletrain's parameter server clips each
worker's gradient, then pushes it to the servers' SGD and pulls the weights back).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np


def weight_names(layers: int) -> list[str]:
    """torch's state_dict names of the language model, in the order of the parameters here.

    >>> weight_names(2)[-4:]
    ['lstm.bias_ih_l1', 'lstm.bias_hh_l1', 'decoder.weight', 'decoder.bias']
    """
    per_layer = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    lstm = [f"lstm.{kind}_l{k}" for k in range(layers) for kind in per_layer]
    return ["embedding.weight", *lstm, "decoder.weight", "decoder.bias"]


def build_network(mx: Any, model: dict, init: dict[str, np.ndarray]) -> tuple[Any, list[tuple[str, Any]]]:
    """The language model with the weights of ``init.npz``; the network and its parameters in the order of
    :func:`weight_names`, each with its torch name."""
    from mxnet import gluon
    from mxnet.gluon import nn, rnn

    vocabulary, hidden, layers = model["vocab_size"], model["hidden_size"], model["layers"]

    class LanguageModel(gluon.Block):
        def __init__(self) -> None:
            super().__init__()
            with self.name_scope():
                self.embedding = nn.Embedding(vocabulary, hidden)
                self.lstm = rnn.LSTM(hidden, layers, layout="NTC", input_size=hidden)
                self.decoder = nn.Dense(vocabulary, flatten=False, in_units=hidden)

        def forward(self, words: Any, state: list) -> tuple[Any, list]:
            output, state = self.lstm(self.embedding(words), state)
            return self.decoder(output), state

    net = LanguageModel()
    net.initialize(mx.init.Zero())
    kinds = {"weight_ih": "i2h_weight", "weight_hh": "h2h_weight", "bias_ih": "i2h_bias", "bias_hh": "h2h_bias"}
    params = []
    for name in weight_names(layers):
        if name.startswith("lstm."):
            kind, layer = name.removeprefix("lstm.").rsplit("_l", 1)
            param = getattr(net.lstm, f"l{layer}_{kinds[kind]}")
        else:
            block, kind = name.split(".")
            param = getattr(getattr(net, block), kind)
        if name not in init:
            raise ValueError(f"init.npz lacks {name}: not the LSTM model of the spec")
        if tuple(init[name].shape) != tuple(param.shape):
            raise ValueError(f"init.npz: {name} has shape {init[name].shape}, the spec's model {param.shape}")
        param.set_data(mx.nd.array(init[name], dtype="float32"))
        params.append((name, param))
    return net, params


def zero_state(mx: Any, model: dict, rows: int) -> list:
    """``h`` and ``c`` of every layer, zeros, as the fused LSTM takes them: ``layers × rows × H`` each."""
    return [mx.nd.zeros((model["layers"], rows, model["hidden_size"])) for _ in range(2)]


def word_losses(mx: Any, net: Any, words: np.ndarray, targets: np.ndarray, state: list) -> tuple[Any, list]:
    """The negative log-likelihood of every target word ``(rows, T)`` and the state after the window."""
    logits, state = net(mx.nd.array(words), state)
    return -mx.nd.pick(mx.nd.log_softmax(logits, axis=-1), mx.nd.array(targets), axis=-1), state


def clip(mx: Any, grads: list, max_norm: float) -> None:
    """torch's ``clip_grad_norm_`` on the whole gradient, in place; nothing when ``max_norm`` is 0."""
    if not max_norm:
        return
    norm = mx.nd.sqrt(mx.nd.add_n(*[mx.nd.sum(grad * grad) for grad in grads]))
    scale = mx.nd.minimum(max_norm / (norm + 1e-6), mx.nd.ones((1,)))
    for grad in grads:
        grad[:] = mx.nd.broadcast_mul(grad, scale)


def perplexity(mx: Any, net: Any, test: np.ndarray, model: dict, beat: Any) -> dict[str, float]:
    """Test perplexity as scaletrain measures it: ``eval_batch_size`` rows, windows of ``num_steps`` (the
    last one shorter), the state carried from zeros; e^(mean negative log-likelihood per word). Each window
    scored is told to the heartbeat ``beat``."""
    rows, steps = model["eval_batch_size"], model["num_steps"]
    length = len(test) // rows
    streams = test[: rows * length].reshape(rows, length)
    state = zero_state(mx, model, rows)
    total, count = 0.0, 0
    for begin in range(0, length - 1, steps):
        targets = streams[:, begin + 1 : begin + 1 + steps]
        losses, state = word_losses(mx, net, streams[:, begin : begin + targets.shape[1]], targets, state)
        total += float(losses.astype("float64").sum().asscalar())
        count += targets.size
        beat.evaluate(begin // steps + 1)
    return {"test_perplexity": math.exp(total / count), "test_loss": total / count}


def train(spec: dict[str, Any], index: int, beat: Any) -> None:
    """Train as worker ``index`` (the kvstore's rank where it differs) and write this worker's outputs; each step
    is told to the heartbeat ``beat`` (a ``progress.Progress``)."""
    import mxnet as mx
    import mxnet_worker as common  # the program beside this file (imported here: the doctests import this)
    from mxnet import autograd

    mode, workers, rows, model = spec["mode"], spec["workers"], spec["batch_size"], spec["model"]
    kv, rank = common.kvstore(mx, spec, index)
    with np.load(spec["data"]["tokens"]) as tokens:
        train_words, test = tokens["train"], tokens["test"]
    with np.load(spec["order"]) as orders:
        order, resets = orders[f"w{rank}"], orders[f"r{rank}"]
    if len(order) != spec["steps"][rank] or (len(order) and order.shape[1] != rows):
        raise ValueError(f"order.npz w{rank} has shape {order.shape}, the spec {spec['steps'][rank]} steps")
    with np.load(spec["init"]) as saved:
        net, params = build_network(mx, model, dict(saved))
    weights = [param.data() for _, param in params]
    grads = [param.grad() for _, param in params]
    keys = list(range(len(params)))
    global_rows = rows * (workers if mode == "sync" else 1)
    optimizer = common.sgd(mx, spec, 1)  # the gradient is divided by the rows before it is clipped
    updater = None
    if mode == "async":
        kv.set_optimizer(optimizer)  # pickled to the servers before any push
    else:
        updater = mx.optimizer.get_updater(optimizer)
    if kv is not None:
        kv.init(keys, weights)  # rank 0's values; a barrier of all workers
        kv.pull(keys, out=weights)
    meter = common.Meter(spec["warmup_steps"])
    window, state = np.arange(model["num_steps"]), None
    mx.nd.waitall()
    for step, starts in enumerate(order):
        begin = time.perf_counter()
        positions = starts[:, None] + window
        words, targets = train_words[positions], train_words[positions + 1]
        if resets[step] or state is None:
            state = zero_state(mx, model, rows)
        fetched = time.perf_counter()
        with autograd.record():
            losses, state = word_losses(mx, net, words, targets, state)
            total = losses.sum()
        total.backward()  # the gradient of the summed loss; divided by the rows below
        state = [part.detach() for part in state]  # truncated back-propagation: the next window starts here
        mean_loss = losses.mean()
        if mode == "async":
            for grad in grads:
                grad[:] = grad / global_rows
            clip(mx, grads, spec["clip_norm"])
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
                grad[:] = grad / global_rows
            clip(mx, grads, spec["clip_norm"])
            for key in keys:
                updater(key, grads[key], weights[key])
            mx.nd.waitall()
        seconds = time.perf_counter() - begin
        value = float(mean_loss.asscalar())
        if not math.isfinite(value):
            raise FloatingPointError(f"the training loss became {value} at step {step + 1}")
        meter.add(seconds, communication, fetched - begin, value)
        beat.step(step + 1)
    common.finish(mx, spec, kv, rank, keys, weights, meter, lambda: _results(mx, spec, net, params, test, beat), beat)


def _results(mx: Any, spec: dict[str, Any], net: Any, params: list, test: np.ndarray, beat: Any) -> dict[str, float]:
    """Rank 0's ``final.npz``; the test perplexity for ``quality.json`` (each window told to ``beat``)."""
    np.savez(Path(spec["out"]) / "final.npz", **{name: param.data().asnumpy() for name, param in params})
    return perplexity(mx, net, test, spec["model"], beat)
