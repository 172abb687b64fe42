"""TensorFlow 2 program, ``ptb-lstm`` part: scaletrain's LSTM language model, trained as scaletrain prepared it.

``tensorflow_worker.py`` runs it when the spec's workload is ``ptb-lstm`` (the contract is in
:mod:`scaletrain.engines`, the windows in :mod:`scaletrain.engines.prepare_text`); like that program it needs
only the standard library, NumPy and TensorFlow. The model is written with ``tf`` ops on plain variables that
keep torch's names and layouts (``embedding.weight``; per layer ``lstm.weight_ih_l<k>`` ``(4H, in)``,
``lstm.weight_hh_l<k>`` ``(4H, H)`` and both biases ``lstm.bias_ih_l<k>`` and ``lstm.bias_hh_l<k>``;
``decoder.weight`` ``(V, H)`` and ``decoder.bias``), its gates in torch's order ``i, f, g, o``. Both biases
stay variables of their own: folded into one, their sum would move by one step per update, not by two as in
torch. The objective is scaletrain's: the per-word cross-entropy summed over the window and averaged over
the rows (of the global batch in ``sync``); the whole gradient's norm is clipped to ``clip_norm`` as torch's
``clip_grad_norm_`` does (``g · min(1, clip / (‖g‖ + 1e-6))``), then SGD (:func:`tensorflow_worker.sgd_update`).

Modes: ``local`` and ``sync`` (``MultiWorkerMirroredStrategy``: each worker holds the state of its rows,
the gradients are summed by a ring all-reduce, then clipped and applied by every worker alike). ``async``
is refused: the ``ClusterCoordinator`` hands a step to whichever worker is free, so no worker could carry
its rows' state from one window to the next.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np


def weight_names(layers: int) -> list[str]:
    """torch's state_dict names of the language model, in the order of the variables here.

    >>> weight_names(1)[1:5]
    ['lstm.weight_ih_l0', 'lstm.weight_hh_l0', 'lstm.bias_ih_l0', 'lstm.bias_hh_l0']
    """
    per_layer = ("weight_ih", "weight_hh", "bias_ih", "bias_hh")
    lstm = [f"lstm.{kind}_l{k}" for k in range(layers) for kind in per_layer]
    return ["embedding.weight", *lstm, "decoder.weight", "decoder.bias"]


def weight_shapes(model: dict) -> list[tuple[int, ...]]:
    """Their shapes in torch for the spec's ``model`` (vocabulary V, hidden size H, layers)."""
    v, h = model["vocab_size"], model["hidden_size"]
    return [(v, h), *((4 * h, h), (4 * h, h), (4 * h,), (4 * h,)) * model["layers"], (v, h), (v,)]


def load_init(spec: dict) -> list[np.ndarray]:
    """``init.npz``'s arrays in the order of :func:`weight_names`, their shapes checked."""
    names = weight_names(spec["model"]["layers"])
    with np.load(spec["init"]) as saved:
        missing = sorted(set(names) - set(saved.files))
        if missing:
            raise ValueError(f"{spec['init']} lacks {', '.join(missing)}: not the LSTM model of the spec")
        values = [saved[name].astype(np.float32) for name in names]
    for name, value, shape in zip(names, values, weight_shapes(spec["model"]), strict=True):
        if value.shape != shape:
            raise ValueError(f"{spec['init']}: {name} has shape {value.shape}, the spec's model {shape}")
    return values


def zero_state(rows: int, model: dict) -> tuple[np.ndarray, ...]:
    """``h`` and ``c`` of every layer, zeros: ``(h0, c0, h1, c1, …)``, each ``rows × H``."""
    return tuple(np.zeros((rows, model["hidden_size"]), np.float32) for _ in range(2 * model["layers"]))


def forward(tf, weights, words, state, layers: int):
    """Logits ``(rows · T, V)`` of the words ``(rows, T)`` and the state after the window."""
    steps = words.shape[1]
    inputs = tf.gather(weights[0], words)  # rows, T, H
    sequence = [inputs[:, t] for t in range(steps)]
    carried = []
    for k in range(layers):
        w_ih, w_hh, b_ih, b_hh = weights[1 + 4 * k : 5 + 4 * k]
        h, c = state[2 * k], state[2 * k + 1]
        projected = tf.matmul(tf.concat(sequence, 0), w_ih, transpose_b=True) + b_ih  # T·rows, 4H
        projected = tf.split(projected, steps, 0)
        sequence = []
        for t in range(steps):
            gates = projected[t] + tf.matmul(h, w_hh, transpose_b=True) + b_hh
            i, f, g, o = tf.split(gates, 4, axis=1)
            c = tf.sigmoid(f) * c + tf.sigmoid(i) * tf.tanh(g)
            h = tf.sigmoid(o) * tf.tanh(c)
            sequence.append(h)
        carried += [h, c]
    hidden = tf.reshape(tf.stack(sequence, 1), [-1, weights[0].shape[1]])
    return tf.matmul(hidden, weights[-2], transpose_b=True) + weights[-1], tuple(carried)


def clip(tf, grads, max_norm: float):
    """torch's ``clip_grad_norm_`` on the whole gradient; ``grads`` unchanged when ``max_norm`` is 0."""
    if not max_norm:
        return grads
    norm = tf.sqrt(tf.add_n([tf.reduce_sum(tf.square(grad)) for grad in grads]))
    scale = tf.minimum(max_norm / (norm + 1e-6), 1.0)
    return [grad * scale for grad in grads]


def perplexity(tf, values: list[np.ndarray], test: np.ndarray, model: dict, beat) -> dict[str, float]:
    """Test perplexity as scaletrain measures it: ``eval_batch_size`` rows, windows of ``num_steps`` (the
    last one shorter), the state carried from zeros; e^(mean negative log-likelihood per word). Each window
    scored is told to the heartbeat ``beat``."""
    weights = [tf.constant(value) for value in values]
    rows, steps = model["eval_batch_size"], model["num_steps"]
    length = len(test) // rows
    streams = test[: rows * length].reshape(rows, length)

    @tf.function  # traced twice: for the full windows, and the last, shorter one
    def score(x, y, state):
        logits, state = forward(tf, weights, x, state, model["layers"])
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(y, [-1]), logits)), state

    state = zero_state(rows, model)
    total, count = 0.0, 0
    for begin in range(0, length - 1, steps):
        targets = streams[:, begin + 1 : begin + 1 + steps]
        loss, state = score(streams[:, begin : begin + targets.shape[1]], targets, state)
        total += float(loss)
        count += targets.size
        beat.evaluate(begin // steps + 1)
    return {"test_perplexity": math.exp(total / count), "test_loss": total / count}


def train_replicated(spec: dict, index: int, beat) -> None:
    """``local`` and ``sync``: train this worker's windows, each step told to the heartbeat ``beat`` (a
    ``progress.Progress``); worker 0 writes the weights and their perplexity."""
    import tensorflow_worker as common  # the program beside this file (imported here: the doctests import this)

    if spec["mode"] not in ("local", "sync"):
        raise ValueError(f"mode {spec['mode']}: this program trains ptb-lstm in local and sync mode only")
    tf = common.start_tensorflow(spec["threads"], alone=spec["mode"] == "local")
    strategy, replicas = common.replicated_strategy(tf, spec)
    model, layers, steps = spec["model"], spec["model"]["layers"], spec["model"]["num_steps"]
    with np.load(spec["data"]["tokens"]) as tokens:
        train, test = tokens["train"], tokens["test"]
    with np.load(spec["order"]) as orders:
        order, resets = orders[f"w{index}"], orders[f"r{index}"]
    initial = load_init(spec)
    with strategy.scope():
        names = weight_names(layers)
        weights = [tf.Variable(value, name=name.replace(".", "_")) for value, name in zip(initial, names, strict=True)]
        velocity = [tf.Variable(np.zeros_like(value), trainable=False) for value in initial]
    global_rows = spec["batch_size"] * replicas

    def replica_gradients(x, y, state):
        with tf.GradientTape() as tape:
            logits, state = forward(tf, weights, x, state, layers)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(y, [-1]), logits)
            objective = tf.reduce_sum(losses) / global_rows
        grads = [tf.convert_to_tensor(grad) for grad in tape.gradient(objective, weights)]  # dense embedding
        return grads, tf.reduce_mean(losses), state

    @tf.function
    def gradients(x, y, state):
        return strategy.run(replica_gradients, args=(x, y, state))

    all_reduce = common.all_reduce_function(tf, strategy)

    @tf.function
    def update(grads):
        def replica(local):
            common.sgd_update(tf, weights, velocity, clip(tf, local, spec["clip_norm"]), spec)
            with tf.control_dependencies([weight.value() for weight in weights]):
                return tf.identity(weights[-1][0])

        return strategy.run(replica, args=(grads,))

    def local(value):
        return strategy.experimental_local_results(value)[0]

    meter = {"measured_steps": 0, "measured_seconds": 0.0, "communication_seconds": 0.0, "data_seconds": 0.0}
    losses, state, window = [], None, np.arange(steps)
    for step, starts in enumerate(order):
        begin = time.perf_counter()
        positions = starts[:, None] + window
        x, y = tf.constant(train[positions]), tf.constant(train[positions + 1])
        if resets[step] or state is None:
            state = tuple(tf.constant(part) for part in zero_state(len(starts), model))
        fetched = time.perf_counter()
        grads, loss, state = gradients(x, y, state)
        losses.append(float(local(loss)))  # reading the loss waits for the gradients
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the training loss became {losses[-1]} at step {step + 1}")
        state = local(state)
        computed = reduced = time.perf_counter()
        if replicas > 1:
            beat.exchange()
            grads = all_reduce(grads)
            local(grads)[-1].numpy()
            reduced = time.perf_counter()
        local(update(grads)).numpy()
        if step >= spec["warmup_steps"]:
            meter["measured_steps"] += 1
            meter["measured_seconds"] += time.perf_counter() - begin
            meter["data_seconds"] += fetched - begin
            meter["communication_seconds"] += reduced - computed
        beat.step(step + 1)
    common.write_stats(spec, "worker", index, losses, steps=len(order), **meter)
    if index == 0:
        values = [weight.numpy() for weight in weights]
        out = Path(spec["out"])
        np.savez(out / "final.npz", **dict(zip(names, values, strict=True)))
        quality = perplexity(tf, values, test, model, beat)
        (out / "quality.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
    beat.done()
