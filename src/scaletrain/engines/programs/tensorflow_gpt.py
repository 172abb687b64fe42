"""TensorFlow 2 program, ``gpt`` part: scaletrain's small GPT, trained as scaletrain prepared it.

``tensorflow_worker.py`` runs it when the spec's workload is ``gpt`` (the contract is in :mod:`scaletrain.engines`,
the windows in :mod:`scaletrain.engines.prepare_text`, the weights' names in ``gpt_common.py``); like that program it
needs only the standard library, NumPy and TensorFlow. As the other programs it writes the model in ``tf`` ops on
plain variables with torch's names and layouts: pre-norm blocks (LayerNorm ε 1e-5; causal multi-head attention,
softmax of ``q·kᵀ/√d`` with the later words masked; a GELU MLP four times as wide, erf's GELU as torch's), dropout
on the embeddings, the attention weights and each residual branch, learned positions, the output layer the
embedding's transpose. The objective is scaletrain's: the mean cross-entropy over every word of the (global) batch;
the whole gradient's norm is clipped as torch's ``clip_grad_norm_`` does, then AdamW is applied as torch defines
it (``w ← w·(1 − lr·λ)``; the moments; ``w ← w − lr/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)``) at the rate of scaletrain's
schedule (warm-up, then cosine; ``gpt_common.learning_rate``).

Modes: ``local`` and ``sync`` (``MultiWorkerMirroredStrategy``: the gradients summed by a ring all-reduce, then
clipped and applied by every worker alike). ``async`` is not built: the asynchronous program's coordinator closure
is LeNet's SGD step, and AdamW's moments and step count on the parameter servers are not written.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import numpy as np

LAYER_NORM_EPS = 1e-5  # torch's LayerNorm default
MASKED = -1e30  # added to a later word's score: its softmax weight is exactly 0


def layer_norm(tf, x, weight, bias):
    """LayerNorm over the last axis (biased variance, as torch's)."""
    mean, variance = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(variance + LAYER_NORM_EPS) * weight + bias


def linear(tf, x, weight, bias):
    """torch's ``Linear`` on rows ``x`` ``(n, in)``: ``x·Wᵀ + b``, ``W`` ``(out, in)``."""
    return tf.matmul(x, weight, transpose_b=True) + bias


def forward(tf, weights, words, model: dict, training: bool):
    """Logits ``(rows · T, V)`` of the words ``(rows, T)``; dropout only when ``training``."""
    rows, steps = words.shape
    width, heads, rate = model["width"], model["heads"], model["dropout"]
    size = width // heads

    def drop(x):
        return tf.nn.dropout(x, rate) if training and rate else x

    x = drop(tf.gather(weights[0], words) + weights[1][:steps])  # rows, T, W
    x = tf.reshape(x, [rows * steps, width])
    later = 1.0 - tf.linalg.band_part(tf.ones([steps, steps]), -1, 0)  # 1 above the diagonal
    for k in range(model["layers"]):
        n1w, n1b, aw, pw, pb, n2w, n2b, m0w, m0b, m2w, m2b = weights[2 + 11 * k : 13 + 11 * k]
        qkv = tf.matmul(layer_norm(tf, x, n1w, n1b), aw, transpose_b=True)  # no bias, as torch's
        q, key, value = (
            tf.transpose(tf.reshape(t, [rows, steps, heads, size]), [0, 2, 1, 3]) for t in tf.split(qkv, 3, 1)
        )
        scores = tf.matmul(q, key, transpose_b=True) / math.sqrt(size) + later * MASKED
        attended = tf.matmul(drop(tf.nn.softmax(scores, axis=-1)), value)  # rows, heads, T, size
        attended = tf.reshape(tf.transpose(attended, [0, 2, 1, 3]), [rows * steps, width])
        x = x + drop(linear(tf, attended, pw, pb))
        hidden = tf.nn.gelu(linear(tf, layer_norm(tf, x, n2w, n2b), m0w, m0b), approximate=False)
        x = x + drop(linear(tf, hidden, m2w, m2b))
    x = layer_norm(tf, x, weights[-2], weights[-1])
    return tf.matmul(x, weights[0], transpose_b=True)


def adamw_update(tf, weights, moments, grads, decay, step_size, correction2) -> None:
    """torch's AdamW step: ``decay`` is ``1 − lr·λ``, ``step_size`` ``lr/(1−β₁ᵗ)``, ``correction2`` ``√(1−β₂ᵗ)``;
    β and ε are bound to ``moments`` (:func:`make_moments`)."""
    (beta1, beta2, eps), pairs = moments
    for weight, (mean, square), grad in zip(weights, pairs, grads, strict=True):
        weight.assign(weight * decay)
        mean.assign(beta1 * mean + (1.0 - beta1) * grad)
        square.assign(beta2 * square + (1.0 - beta2) * tf.square(grad))
        weight.assign_sub(step_size * mean / (tf.sqrt(square) / correction2 + eps))


def make_moments(tf, initial: list[np.ndarray], optimizer: dict):
    """AdamW's settings and a zero first and second moment for each weight."""
    pairs = [tuple(tf.Variable(np.zeros_like(value), trainable=False) for _ in range(2)) for value in initial]
    return (*optimizer["betas"], optimizer["eps"]), pairs


def step_settings(spec: dict, step: int) -> tuple[float, float, float]:
    """``(1 − lr·λ, lr/(1−β₁ᵗ), √(1−β₂ᵗ))`` of update ``step`` (0-based; torch counts it ``t = step + 1``)."""
    import gpt_common  # beside this file

    optimizer, lr = spec["optimizer"], gpt_common.learning_rate(spec, step)
    beta1, beta2 = optimizer["betas"]
    return 1.0 - lr * optimizer["weight_decay"], lr / (1.0 - beta1 ** (step + 1)), math.sqrt(1.0 - beta2 ** (step + 1))


def perplexity(tf, values: list[np.ndarray], test: np.ndarray, model: dict, beat) -> dict[str, float]:
    """Test perplexity as scaletrain measures it: windows of ``context`` words without overlap, scored 64 at a time,
    no dropout; e^(mean negative log-likelihood per word). Each chunk scored is told to the heartbeat ``beat``."""
    import gpt_common  # beside this file

    weights = [tf.constant(value) for value in values]

    @tf.function  # traced twice at most: for full chunks, and the last, smaller one
    def score(x, y):
        logits = forward(tf, weights, x, model, training=False)
        return tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(y, [-1]), logits))

    total, count = 0.0, 0
    for number, (inputs, targets) in enumerate(gpt_common.evaluation_chunks(test, model["context"]), 1):
        total += float(score(tf.constant(inputs), tf.constant(targets)))
        count += targets.size
        beat.evaluate(number)
    return {"test_perplexity": math.exp(total / count), "test_loss": total / count}


def train_replicated(spec: dict, index: int, beat) -> None:
    """``local`` and ``sync``: train this worker's windows, each step told to the heartbeat ``beat`` (a
    ``progress.Progress``); worker 0 writes the weights, their perplexity and its count of them."""
    import gpt_common  # beside this file
    import tensorflow_lstm  # beside this file: torch's gradient clipping
    import tensorflow_worker as common  # the program beside this file (imported here: the doctests import this)

    if spec["mode"] not in ("local", "sync"):
        raise ValueError(f"mode {spec['mode']}: this program trains gpt in local and sync mode only")
    tf = common.start_tensorflow(spec["threads"], alone=spec["mode"] == "local")
    strategy, replicas = common.replicated_strategy(tf, spec)
    model, context = spec["model"], spec["model"]["context"]
    with np.load(spec["data"]["tokens"]) as tokens:
        train, test = tokens["train"], tokens["test"]
    with np.load(spec["order"]) as orders:
        order = orders[f"w{index}"]
    initial = gpt_common.load_init(spec)
    names = gpt_common.weight_names(model["layers"])
    with strategy.scope():
        weights = [tf.Variable(value, name=name.replace(".", "_")) for value, name in zip(initial, names, strict=True)]
        moments = make_moments(tf, initial, spec["optimizer"])
    global_words = spec["batch_size"] * replicas * context

    def replica_gradients(x, y):
        with tf.GradientTape() as tape:
            logits = forward(tf, weights, x, model, training=True)
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(tf.reshape(y, [-1]), logits)
            objective = tf.reduce_sum(losses) / global_words
        grads = [tf.convert_to_tensor(grad) for grad in tape.gradient(objective, weights)]  # dense embedding
        return grads, tf.reduce_mean(losses)

    @tf.function
    def gradients(x, y):
        return strategy.run(replica_gradients, args=(x, y))

    all_reduce = common.all_reduce_function(tf, strategy)

    @tf.function
    def update(grads, decay, step_size, correction2):
        def replica(local, *settings):
            adamw_update(tf, weights, moments, tensorflow_lstm.clip(tf, local, spec["clip_norm"]), *settings)
            with tf.control_dependencies([weight.value() for weight in weights]):
                return tf.identity(weights[-1][0])

        return strategy.run(replica, args=(grads, decay, step_size, correction2))

    def local(value):
        return strategy.experimental_local_results(value)[0]

    meter = {"measured_steps": 0, "measured_seconds": 0.0, "communication_seconds": 0.0, "data_seconds": 0.0}
    losses = []
    for step, numbers in enumerate(order):
        begin = time.perf_counter()
        inputs, targets = gpt_common.windows(train, numbers, context)
        x, y = tf.constant(inputs), tf.constant(targets)
        fetched = time.perf_counter()
        grads, loss = gradients(x, y)
        losses.append(float(local(loss)))  # reading the loss waits for the gradients
        if not math.isfinite(losses[-1]):
            raise FloatingPointError(f"the training loss became {losses[-1]} at step {step + 1}")
        computed = reduced = time.perf_counter()
        if replicas > 1:
            beat.exchange()
            grads = all_reduce(grads)
            local(grads)[-1].numpy()
            reduced = time.perf_counter()
        settings = [tf.constant(value, tf.float32) for value in step_settings(spec, step)]
        local(update(grads, *settings)).numpy()
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
        np.savez(out / "final.npz", **gpt_common.final_weights(names, values))
        quality = perplexity(tf, values, test, model, beat) | {"parameters": sum(value.size for value in values)}
        (out / "quality.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")
    beat.done()
