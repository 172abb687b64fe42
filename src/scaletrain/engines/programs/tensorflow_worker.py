"""TensorFlow 2 worker program: LeNet-5 on Fashion-MNIST as scaletrain prepared it (``ptb-lstm``, ``gpt``: beside it).

``python tensorflow_worker.py --spec SPEC --role ROLE --index I`` (the contract is in :mod:`scaletrain.engines`).
Only the standard library and NumPy are imported at module level, TensorFlow inside the functions. The model is
``tf.nn`` ops on plain variables (no Keras), NHWC inside, with torch's names and layouts in ``init.npz`` and
``final.npz``; training is SGD as torch defines it (``v = μv + g + λw; w -= lr·v``) on a batch's mean softmax
cross-entropy, in a loop of ``tf.function`` calls.

* ``local`` (role ``worker`` 0, no ``TF_CONFIG``) and ``sync``: step ``s`` of worker ``i`` trains on the samples
  ``order.npz["w<i>"][s]``.
* ``sync``: workers 0..N-1 under ``MultiWorkerMirroredStrategy`` (ring all-reduce over gRPC). A step is three
  calls: the gradients of the worker's batch (loss summed, divided by the global batch ``N × batch_size``), their
  all-reduce (timed as ``communication_seconds``, the wait for the slower worker included) and the update, so the
  weights equal a ``local`` run's with the global batch. Worker 0 writes ``final.npz`` and ``quality.json``.
* ``async``: ``ParameterServerStrategy``. ``ps`` and ``worker`` only run a ``tf.distribute.Server``; the ``chief``'s
  ``ClusterCoordinator`` hands every batch, as a closure that reads the weights from the parameter servers and
  updates them and the one shared momentum buffer there without locks, to whichever worker is free, so each batch
  of ``order.npz`` runs once, interleaved ``w0[0], w1[0], …, w0[1], …``. The chief writes ``stats-chief-0.json``
  for the whole cluster (the closures after the first ``warmup_steps × workers``; ``communication_seconds`` 0: the
  traffic is inside the closures), ``final.npz``, ``quality.json`` and, however it ends, ``chief-done``, on which
  ``ps`` and ``worker`` processes that share the folder exit with status 0.

A measured step runs from asking for the batch to the updated weights being ready, past each process's
``warmup_steps``. A failure: one line on stderr, the traceback in ``out/error-<role>-<index>.log``, exit status 1.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
import traceback
from pathlib import Path

import numpy as np

#: torch's state_dict names of LeNet5's weighted layers and weights, in the order of the variables here
LAYERS = ("features.0", "features.3", "classifier.1", "classifier.3")
NAMES = tuple(f"{layer}.{kind}" for layer in LAYERS for kind in ("weight", "bias"))
#: their shapes in torch
SHAPES = ((20, 1, 5, 5), (20,), (50, 20, 5, 5), (50,), (500, 800), (500,), (10, 500), (10,))
#: for row ``r`` of the first dense kernel (NHWC flattening, ``h·200 + w·50 + c``): torch's column ``c·16 + h·4 + w``
FLATTEN_ORDER = np.arange(800).reshape(50, 4, 4).transpose(1, 2, 0).reshape(-1)
DONE_MARK = "chief-done"
LANGUAGE_MODELS = {"ptb-lstm": "tensorflow_lstm", "gpt": "tensorflow_gpt"}  # workload: the program's part beside it


def read_idx(path: str, header: int) -> np.ndarray:
    """The unsigned bytes of an IDX file (gzip-compressed or raw) after its ``header`` bytes."""
    data = Path(path).read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return np.frombuffer(data, np.uint8, offset=header)


def load_split(data: dict, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images (``n × 28 × 28 × 1`` float32, normalised as the spec says) and int32 labels of one split."""
    labels = read_idx(data[f"{prefix}_labels"], 8).astype(np.int32)
    images = read_idx(data[f"{prefix}_images"], 16).reshape(len(labels), 28, 28, 1).astype(np.float32)
    images /= 255.0
    images -= data["mean"]
    images /= data["std"]
    return images, labels


def torch_to_tf(state: dict) -> list[np.ndarray]:
    """torch's tensors (conv ``out,in,kh,kw``; dense ``out,in``, C·H·W flattening) in TF layouts."""
    conv1, conv2 = (state[f"features.{i}.weight"].transpose(2, 3, 1, 0) for i in (0, 3))
    dense1 = state["classifier.1.weight"].T[FLATTEN_ORDER]
    dense2 = state["classifier.3.weight"].T
    kernels = {0: conv1, 2: conv2, 4: dense1, 6: dense2}
    return [np.ascontiguousarray(kernels.get(i, state[name]), np.float32) for i, name in enumerate(NAMES)]


def tf_to_torch(values: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The inverse of :func:`torch_to_tf`: TF's arrays under torch's names and layouts.

    >>> state = {name: np.random.default_rng(0).random(shape, np.float32) for name, shape in zip(NAMES, SHAPES)}
    >>> [value.shape for value in torch_to_tf(state)][::2]
    [(5, 5, 1, 20), (5, 5, 20, 50), (800, 500), (500, 10)]
    >>> all(np.array_equal(tf_to_torch(torch_to_tf(state))[name], state[name]) for name in NAMES)
    True
    """
    dense1 = np.empty_like(values[4])
    dense1[FLATTEN_ORDER] = values[4]
    torch_kernels = {
        0: values[0].transpose(3, 2, 0, 1),
        2: values[2].transpose(3, 2, 0, 1),
        4: dense1.T,
        6: values[6].T,
    }
    return {name: np.ascontiguousarray(torch_kernels.get(i, values[i])) for i, name in enumerate(NAMES)}


def forward(tf, weights, images):
    """LeNet-5's logits for NHWC ``images``: two conv-tanh-maxpool blocks, dense 500 with tanh, dense 10."""
    hidden = images
    for kernel, bias in ((weights[0], weights[1]), (weights[2], weights[3])):
        hidden = tf.nn.max_pool2d(tf.tanh(tf.nn.conv2d(hidden, kernel, 1, "VALID") + bias), 2, 2, "VALID")
    hidden = tf.tanh(tf.matmul(tf.reshape(hidden, [-1, 800]), weights[4]) + weights[5])
    return tf.matmul(hidden, weights[6]) + weights[7]


def sgd_update(tf, weights, velocity, grads, spec: dict) -> None:
    """Torch's SGD step on every variable: ``v = μv + g + λw; w -= lr·v``."""
    for weight, moment, grad in zip(weights, velocity, grads, strict=True):
        if spec["weight_decay"]:
            grad = grad + spec["weight_decay"] * weight
        new_moment = spec["momentum"] * moment + grad
        moment.assign(new_moment)
        weight.assign_sub(spec["lr"] * new_moment)


def make_variables(tf, spec: dict) -> tuple[list, list]:
    """The model's variables from ``init.npz`` and a zero momentum buffer for each."""
    with np.load(spec["init"]) as saved:
        state = {name: saved[name] for name in NAMES}
    for name, shape in zip(NAMES, SHAPES, strict=True):
        if state[name].shape != shape:
            raise ValueError(f"{spec['init']}: {name} has shape {state[name].shape}, LeNet-5's is {shape}")
    initial = torch_to_tf(state)
    weights = [tf.Variable(value, name=name.replace(".", "_")) for value, name in zip(initial, NAMES, strict=True)]
    velocity = [tf.Variable(np.zeros_like(value), trainable=False) for value in initial]
    return weights, velocity


def batch_loss(tf, weights, images, labels, global_batch: int):
    """Gradients of the batch's summed cross-entropy divided by ``global_batch``, and the batch's mean loss."""
    with tf.GradientTape() as tape:
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, forward(tf, weights, images))
        loss = tf.reduce_sum(losses) / global_batch
    return tape.gradient(loss, weights), tf.reduce_mean(losses)


def evaluate(tf, values: list[np.ndarray], images: np.ndarray, labels: np.ndarray, beat) -> dict[str, float]:
    """Test accuracy and mean cross-entropy of the weights ``values`` (TF layouts) over the split (told to ``beat``)."""
    weights = [tf.constant(value) for value in values]

    @tf.function
    def score(x, y):
        logits = forward(tf, weights, x)
        loss = tf.reduce_sum(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, 1, output_type=tf.int32), y), tf.int32))
        return loss, correct

    total_loss, total_correct = 0.0, 0
    for start in range(0, len(labels), 1000):
        loss, correct = score(images[start : start + 1000], labels[start : start + 1000])
        total_loss += float(loss)
        total_correct += int(correct)
        beat.evaluate(start // 1000 + 1)
    return {"test_accuracy": total_correct / len(labels), "test_loss": total_loss / len(labels)}


def write_results(tf, spec: dict, values: list[np.ndarray], beat) -> None:
    """``final.npz`` (torch names and layouts) and ``quality.json`` over the test set (told to ``beat``)."""
    out = Path(spec["out"])
    np.savez(out / "final.npz", **tf_to_torch(values))
    quality = evaluate(tf, values, *load_split(spec["data"], "test"), beat)
    (out / "quality.json").write_text(json.dumps(quality, indent=2) + "\n", encoding="utf-8")


def write_stats(spec: dict, role: str, index: int, losses: list[float], **fields) -> None:
    """``stats-<role>-<index>.json`` with the meter's fields (``rank`` is the index) and the first and last of the
    steps' ``losses`` (None where there were none)."""
    first, last = (losses[0], losses[-1]) if losses else (None, None)
    stats = {"rank": index, "batch_fraction": 1.0, "wait_seconds": 0.0, **fields}
    stats |= {"first_step_loss": first, "last_step_loss": last, "final_loss": last}
    path = Path(spec["out"]) / f"stats-{role}-{index}.json"
    path.write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")


def start_tensorflow(threads: int, *, alone: bool = False):
    """Import TensorFlow and set its thread pools before any op runs; the module. A process of a cluster
    needs 2 inter-op threads at least (collectives and remote calls wait in one); one ``alone`` gets ``threads``,
    like every other engine's process."""
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads if alone else max(2, threads))
    return tf


def replicated_strategy(tf, spec: dict) -> tuple:
    """The strategy and its replicas: ``sync``, a ring all-reduce ``MultiWorkerMirroredStrategy``; else the default."""
    if spec["mode"] != "sync":
        return tf.distribute.get_strategy(), 1
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if strategy.num_replicas_in_sync != spec["workers"]:
        raise RuntimeError(f"TF_CONFIG gives {strategy.num_replicas_in_sync} workers, the spec {spec['workers']}")
    return strategy, strategy.num_replicas_in_sync


def all_reduce_function(tf, strategy):
    """A ``tf.function`` that sums each replica's list of gradients over all replicas."""

    @tf.function
    def all_reduce(grads):
        def replica(local):
            with tf.device(strategy.extended.worker_devices[0]):  # a function's inputs have lost their device
                local = [tf.identity(grad) for grad in local]
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)

        return strategy.run(replica, args=(grads,))

    return all_reduce


def train_replicated(spec: dict, index: int, beat) -> None:
    """``local`` and ``sync``: train worker ``index``'s batches (told to ``beat``); worker 0 writes the results."""
    tf = start_tensorflow(spec["threads"], alone=spec["mode"] == "local")
    strategy, replicas = replicated_strategy(tf, spec)
    images, labels = load_split(spec["data"], "train")
    with np.load(spec["order"]) as orders:
        order = orders[f"w{index}"]
    with strategy.scope():
        weights, velocity = make_variables(tf, spec)
    global_batch = spec["batch_size"] * replicas

    @tf.function
    def gradients(x, y):
        return strategy.run(lambda a, b: batch_loss(tf, weights, a, b, global_batch), args=(x, y))

    all_reduce = all_reduce_function(tf, strategy)

    @tf.function
    def update(grads):
        def replica(local):
            sgd_update(tf, weights, velocity, local, spec)
            with tf.control_dependencies([weight.value() for weight in weights]):
                return tf.identity(weights[-1][0])

        return strategy.run(replica, args=(grads,))

    def local(value):
        return strategy.experimental_local_results(value)[0]

    meter = {"measured_steps": 0, "measured_seconds": 0.0, "communication_seconds": 0.0, "data_seconds": 0.0}
    losses = []
    for step, indices in enumerate(order):
        start = time.perf_counter()
        x, y = tf.constant(images[indices]), tf.constant(labels[indices])
        fetched = time.perf_counter()
        grads, loss = gradients(x, y)
        losses.append(float(local(loss)))  # reading the loss waits for the gradients
        computed = reduced = time.perf_counter()
        if replicas > 1:
            beat.exchange()
            grads = all_reduce(grads)
            local(grads)[-1].numpy()
            reduced = time.perf_counter()
        local(update(grads)).numpy()
        if step >= spec["warmup_steps"]:
            meter["measured_steps"] += 1
            meter["measured_seconds"] += time.perf_counter() - start
            meter["data_seconds"] += fetched - start
            meter["communication_seconds"] += reduced - computed
        beat.step(step + 1)
    write_stats(spec, "worker", index, losses, steps=len(order), **meter)
    if index == 0:
        write_results(tf, spec, [weight.numpy() for weight in weights], beat)
    beat.done()


def interleaved(orders: list[np.ndarray]) -> list[np.ndarray]:
    """Every worker's batches once, step by step: ``w0[0], w1[0], …, w0[1], w1[1], …``.

    >>> [batch.tolist() for batch in interleaved([np.array([[0], [1], [2]]), np.array([[5]])])]
    [[0], [5], [1], [2]]
    """
    longest = max((len(order) for order in orders), default=0)
    return [order[step] for step in range(longest) for order in orders if step < len(order)]


def run_chief(spec: dict, beat) -> None:
    """``async``: schedule every batch on the workers through a ``ClusterCoordinator``; write the results. Each
    closure's loss is fetched in order as it finishes: the steps of the heartbeat ``beat`` (the join raises errors)."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    tf = start_tensorflow(spec["threads"])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    images, labels = load_split(spec["data"], "train")
    with np.load(spec["order"]) as orders:
        batches = interleaved([orders[f"w{i}"] for i in range(spec["workers"])])
    with strategy.scope():
        weights, velocity = make_variables(tf, spec)

    @tf.function
    def train_step(x, y):
        def replica(a, b):
            grads, loss = batch_loss(tf, weights, a, b, spec["batch_size"])
            sgd_update(tf, weights, velocity, grads, spec)
            return loss

        return strategy.run(replica, args=(x, y))

    def train(chosen: list[np.ndarray], before: int) -> list:
        results = [coordinator.schedule(train_step, args=(images[i], labels[i])) for i in chosen]
        for done, result in enumerate(results, before + 1):
            result.fetch()
            beat.step(done)
        coordinator.join()
        return results

    warmup = min(spec["warmup_steps"] * spec["workers"], len(batches))
    results = train(batches[:warmup], 0)
    start = time.perf_counter()
    results += train(batches[warmup:], warmup)
    seconds = time.perf_counter() - start
    losses = [float(result.fetch()) for result in results]
    measured = len(batches) - warmup
    write_stats(
        spec,
        "chief",
        0,
        losses,
        steps=len(batches),
        measured_steps=measured,
        measured_seconds=seconds if measured else 0.0,
        communication_seconds=0.0,
        data_seconds=0.0,
    )
    write_results(tf, spec, [weight.numpy() for weight in weights], beat)


def run_server(spec: dict, role: str, index: int) -> None:
    """``async`` ``ps`` or ``worker``: serve the chief until ``chief-done`` appears in the output folder."""
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if (resolver.task_type, resolver.task_id) != (role, index):
        raise RuntimeError(f"TF_CONFIG names task {resolver.task_type} {resolver.task_id}, not {role} {index}")
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=spec["threads"], inter_op_parallelism_threads=max(2, spec["threads"])
    )
    started = time.time()
    tf.distribute.Server(resolver.cluster_spec(), job_name=role, task_index=index, protocol="grpc", config=config)
    done = Path(spec["out"]) / DONE_MARK
    while not (done.exists() and done.stat().st_mtime >= started):  # an older run's mark does not count
        time.sleep(0.2)


def run(spec: dict, role: str, index: int) -> None:
    """Check that the role fits the mode and run it; a process that trains has a heartbeat (``progress.py``)."""
    progress = __import__("progress")  # beside this file: the heartbeat (the program's folder is on the path)
    mode = spec["mode"]
    if spec.get("probe") and spec["workload"] == "lenet" and role == "worker" and mode in ("local", "sync"):
        __import__("tensorflow_probe").run(spec, index)  # beside this file: what profile --framework measures
    elif spec["workload"] in LANGUAGE_MODELS and role == "worker" and 0 <= index < spec["workers"]:
        part = __import__(LANGUAGE_MODELS[spec["workload"]])  # beside this file: that model's part of the program
        part.train_replicated(spec, index, progress.Progress(spec, role, index))
    elif spec["workload"] != "lenet":
        models = " and ".join(LANGUAGE_MODELS)
        raise ValueError(f"{spec['workload']} as {role} {index}: this program trains lenet, and {models} on workers")
    elif role == "worker" and mode in ("local", "sync") and 0 <= index < spec["workers"]:
        train_replicated(spec, index, progress.Progress(spec, role, index))
    elif mode == "async" and role == "chief" and index == 0:
        try:
            run_chief(spec, progress.Progress(spec, role, index))
        finally:
            (Path(spec["out"]) / DONE_MARK).write_text("", encoding="utf-8")
    elif mode == "async" and role in ("worker", "ps"):
        run_server(spec, role, index)
    else:
        raise ValueError(f"no role {role} {index} in mode {mode} with {spec['workers']} workers")


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments and run the role; on failure, one line on stderr and the traceback in a log."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, type=Path, help="spec.json written by scaletrain")
    parser.add_argument("--role", required=True, choices=("worker", "ps", "chief"))
    parser.add_argument("--index", required=True, type=int)
    args = parser.parse_args(argv)
    try:
        spec = json.loads(args.spec.read_text(encoding="utf-8"))
        run(spec, args.role, args.index)
    except Exception as error:
        what = " ".join(str(error).split())[:500] or type(error).__name__
        log = Path(spec["out"] if "spec" in locals() else args.spec.parent) / f"error-{args.role}-{args.index}.log"
        try:
            log.write_text(traceback.format_exc(), encoding="utf-8")
            what += f" (traceback in {log})"
        except OSError:
            pass
        print(f"tensorflow {args.role} {args.index}: {what}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
