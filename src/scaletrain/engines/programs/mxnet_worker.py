"""MXNet 1.9 (Gluon) worker program: scaletrain's ``lenet`` in MXNet (``ptb-lstm``, ``gpt``: the modules beside it).

scaletrain's launcher starts it as ``python mxnet_worker.py --spec SPEC.json --role ROLE --index I`` in MXNet's own
environment; it reads the files :mod:`scaletrain.engines.prepare` writes and writes what the contract in
:mod:`scaletrain.engines` asks for. Only the standard library and NumPy are imported at the top; MXNet is imported
inside functions, once the thread settings are in the environment.

- ``worker`` trains. ``local``: one process, no kvstore, SGD in the process. ``sync`` (kvstore ``dist_sync``): each
  step a worker pushes its batch's gradients (summed over its samples), pulls their sum over all workers and applies
  SGD itself with it divided by the global batch ``workers × batch_size`` (two workers at batch b follow a local run
  at 2b). ``async`` (``dist_async``): the servers run the optimizer; a worker pushes its batch's gradients divided by
  ``batch_size`` and pulls the weights back; at the end the workers meet at a barrier and rank 0 pulls the weights.
- ``server`` and ``scheduler`` are ps-lite processes: with ``DMLC_ROLE`` set, ``import mxnet`` serves until the
  workers end the job, then exits the process with status 0.
- A distributed worker's rank is ``kv.rank``, which ps-lite gives in the order the workers registered, not
  ``--index``: it trains ``order.npz['w<rank>']`` and writes ``stats-worker-<rank>.json``, with one line on stderr
  when the two differ.
- The meter: a step runs from asking for the batch to ``mx.nd.waitall()`` after the update; the first
  ``warmup_steps`` are left out. ``data_seconds``: indexing, normalising and copying the batch into NDArrays.
  ``communication_seconds``: from the ``waitall`` that ends the backward pass, the push and the pull (in ``async``
  with the servers' update), 0 for ``local``; in ``sync`` it includes waiting for the slowest worker, which MXNet
  does not let us tell apart, so ``wait_seconds`` is 0.
- Rank 0 writes ``final.npz`` and ``quality.json``. A failure is one line on stderr (``mxnet worker 1: ...``), the
  traceback in ``out/error-<role>-<index>.log`` and exit status 1, without waiting for the other processes.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

DISTRIBUTED_MODES = ("sync", "async")
ROLES = ("worker", "server", "scheduler")
# The weighted layers of scaletrain's LeNet5, by their torch state_dict prefix.
TORCH_LAYERS = ("features.0", "features.3", "classifier.1", "classifier.3")
EVAL_BATCH = 1000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line: ``--spec``, ``--role`` and ``--index``."""
    parser = argparse.ArgumentParser(description="Train scaletrain's lenet run with MXNet (Gluon).")
    parser.add_argument("--spec", required=True, type=Path, help="spec.json written by scaletrain")
    parser.add_argument("--role", required=True, choices=ROLES, help="this process's role")
    parser.add_argument("--index", required=True, type=int, help="this process's number within its role")
    return parser.parse_args(argv)


def set_threads(threads: int) -> None:
    """Put the spec's thread count in the environment MXNet reads when it is imported: OpenMP threads
    inside an operator and the CPU engine's worker threads running operators side by side."""
    count = str(max(int(threads), 1))
    os.environ["OMP_NUM_THREADS"] = count
    os.environ["MXNET_CPU_WORKER_NTHREADS"] = count


def check_role(spec: dict[str, Any], role: str) -> None:
    """Fail unless ``role`` fits the mode and, for the distributed modes, agrees with ``DMLC_ROLE``."""
    mode = spec["mode"]
    if mode not in ("local", *DISTRIBUTED_MODES):
        raise ValueError(f"unknown mode {mode!r} (local, sync or async)")
    if mode == "local" and role != "worker":
        raise ValueError(f"mode local has only a worker, not a {role}")
    if mode in DISTRIBUTED_MODES and os.environ.get("DMLC_ROLE") != role:
        raise ValueError(f"DMLC_ROLE is {os.environ.get('DMLC_ROLE')!r}, expected {role!r} for mode {mode}")


def serve(role: str) -> None:
    """Run a ps-lite server or scheduler: MXNet starts it while being imported and exits the process
    (status 0) when the workers end the job, so this returns only if MXNet did not start it."""
    import mxnet  # noqa: F401  (the import itself serves)

    raise RuntimeError(f"importing mxnet as DMLC_ROLE={role} returned instead of serving")


def read_idx(path: str) -> np.ndarray:
    """An IDX file of unsigned bytes (``.gz`` or raw) as an array of the shape its header gives."""
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    if raw[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path}: not an IDX file of unsigned bytes")
    dims = np.frombuffer(raw, ">u4", count=raw[3], offset=4).astype(np.int64)
    return np.frombuffer(raw, np.uint8, offset=4 + 4 * raw[3]).reshape(tuple(dims))


def normalise(pixels: np.ndarray, mean: float, std: float) -> np.ndarray:
    """Bytes to float32 NCHW images: ``/ 255``, then ``(x - mean) / std``, as scaletrain does it.

    >>> normalise(np.array([[[0, 255]]], np.uint8), 0.5, 0.5).tolist()
    [[[[-1.0, 1.0]]]]
    """
    images = pixels.astype(np.float32)[:, None]
    images /= 255.0
    images -= mean
    images /= std
    return images


def build_network(mx: Any, init: dict[str, np.ndarray]) -> tuple[Any, list[tuple[str, Any]]]:
    """scaletrain's LeNet5 in Gluon with the weights of ``init.npz``; the network and its parameters in
    torch's order, each with its torch name (Conv2D and Dense keep torch's layouts)."""
    from mxnet.gluon import nn

    weighted = [
        nn.Conv2D(20, kernel_size=5, in_channels=1),
        nn.Conv2D(50, kernel_size=5, in_channels=20),
        nn.Dense(500, in_units=800),
        nn.Dense(10, in_units=500),
    ]
    net = nn.HybridSequential()
    net.add(weighted[0], nn.Activation("tanh"), nn.MaxPool2D(2, 2))
    net.add(weighted[1], nn.Activation("tanh"), nn.MaxPool2D(2, 2))
    net.add(nn.Flatten(), weighted[2], nn.Activation("tanh"), weighted[3])
    net.initialize(mx.init.Zero())
    expected = {f"{prefix}.{kind}" for prefix in TORCH_LAYERS for kind in ("weight", "bias")}
    if set(init) != expected:
        raise ValueError(f"init.npz holds {sorted(init)}, expected LeNet5's {sorted(expected)}")
    params = []
    for prefix, block in zip(TORCH_LAYERS, weighted, strict=True):
        for kind, param in (("weight", block.weight), ("bias", block.bias)):
            name = f"{prefix}.{kind}"
            if tuple(init[name].shape) != tuple(param.shape):
                raise ValueError(f"init.npz: {name} has shape {init[name].shape}, expected {param.shape}")
            param.set_data(mx.nd.array(init[name], dtype="float32"))
            params.append((name, param))
    net.hybridize()
    return net, params


def sgd(mx: Any, spec: dict[str, Any], batch: int) -> Any:
    """MXNet's SGD with the spec's settings, the summed gradient divided by ``batch``.

    MXNet's ``m = μm - lr(g + λw); w += m`` is torch's ``v = μv + g + λw; w -= lr·v`` with ``m = -lr·v``
    while lr stays constant, as it does here.
    """
    return mx.optimizer.SGD(
        learning_rate=spec["lr"], momentum=spec["momentum"], wd=spec["weight_decay"], rescale_grad=1.0 / batch
    )


def evaluate(mx: Any, net: Any, images: np.ndarray, labels: np.ndarray, mean: float, std: float, beat: Any) -> dict:
    """Accuracy and mean softmax cross-entropy of ``net`` over the whole test set, each batch told to ``beat``."""
    correct, total_loss = 0, 0.0
    for start in range(0, len(labels), EVAL_BATCH):
        x = mx.nd.array(normalise(images[start : start + EVAL_BATCH], mean, std))
        logits = net(x).asnumpy().astype(np.float64)
        truth = labels[start : start + EVAL_BATCH].astype(np.int64)
        shifted = logits - logits.max(axis=1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
        total_loss -= float(log_probs[np.arange(len(truth)), truth].sum())
        correct += int((logits.argmax(axis=1) == truth).sum())
        beat.evaluate(start // EVAL_BATCH + 1)
    return {"test_accuracy": correct / len(labels), "test_loss": total_loss / len(labels)}


class Meter:
    """One worker's step times, split as the contract asks, over the steps after the warm-up."""

    def __init__(self, warmup_steps: int) -> None:
        self.warmup_steps = warmup_steps
        self.steps = self.measured_steps = 0
        self.measured = self.communication = self.data = 0.0
        self.first_loss: float | None = None
        self.last_loss: float | None = None

    def add(self, seconds: float, communication: float, data: float, loss: float) -> None:
        """Record one step: its wall time, its communication and data parts and its training loss."""
        self.steps += 1
        if self.first_loss is None:
            self.first_loss = loss
        self.last_loss = loss
        if self.steps > self.warmup_steps:
            self.measured_steps += 1
            self.measured += seconds
            self.communication += communication
            self.data += data

    def stats(self, rank: int) -> dict[str, Any]:
        """The fields of scaletrain's ``WorkerStats`` that this program measures."""
        return {
            "rank": rank,
            "steps": self.steps,
            "measured_steps": self.measured_steps,
            "measured_seconds": self.measured,
            "communication_seconds": self.communication,
            "wait_seconds": 0.0,
            "data_seconds": self.data,
            "batch_fraction": 1.0,
            "first_step_loss": self.first_loss,
            "last_step_loss": self.last_loss,
            "final_loss": self.last_loss,
        }


def train(spec: dict[str, Any], index: int, beat: Any) -> None:
    """Train as worker ``index`` (the kvstore's rank where it differs) and write this worker's outputs; each step
    is told to the heartbeat ``beat`` (a ``progress.Progress``)."""
    import mxnet as mx
    from mxnet import autograd, gluon

    mode, workers, batch_size = spec["mode"], spec["workers"], spec["batch_size"]
    kv, rank = kvstore(mx, spec, index)
    data = spec["data"]
    mean, std = float(data["mean"]), float(data["std"])
    images, labels = read_idx(data["train_images"]), read_idx(data["train_labels"]).astype(np.float32)
    with np.load(spec["order"]) as orders:
        order = orders[f"w{rank}"]
    if len(order) != spec["steps"][rank] or (len(order) and order.shape[1] != batch_size):
        raise ValueError(f"order.npz w{rank} has shape {order.shape}, the spec {spec['steps'][rank]} steps")
    with np.load(spec["init"]) as saved:
        net, params = build_network(mx, dict(saved))
    weights = [param.data() for _, param in params]
    grads = [param.grad() for _, param in params]
    keys = list(range(len(params)))
    updater = None
    if mode == "async":
        kv.set_optimizer(sgd(mx, spec, batch_size))  # pickled to the servers before any push
    else:
        updater = mx.optimizer.get_updater(sgd(mx, spec, batch_size * (workers if mode == "sync" else 1)))
    if kv is not None:
        kv.init(keys, weights)  # rank 0's values; a barrier of all workers
        kv.pull(keys, out=weights)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    meter = Meter(spec["warmup_steps"])
    mx.nd.waitall()
    for step, indices in enumerate(order):
        begin = time.perf_counter()
        x = mx.nd.array(normalise(images[indices], mean, std))
        y = mx.nd.array(labels[indices])
        fetched = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        loss.backward()  # the gradient of the batch's summed loss; the optimizer divides it
        mean_loss = loss.mean()
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
        np.savez(Path(spec["out"]) / "final.npz", **{name: param.data().asnumpy() for name, param in params})
        test_images, test_labels = read_idx(data["test_images"]), read_idx(data["test_labels"])
        return evaluate(mx, net, test_images, test_labels, mean, std, beat)

    finish(mx, spec, kv, rank, keys, weights, meter, results, beat)


def kvstore(mx: Any, spec: dict[str, Any], index: int) -> tuple[Any, int]:
    """The distributed modes' kvstore (None for ``local``) and this worker's rank, checked against the spec."""
    if spec["mode"] not in DISTRIBUTED_MODES:
        if index != 0:
            raise ValueError(f"mode local has only worker 0, not worker {index}")
        return None, 0
    kv = mx.kv.create(f"dist_{spec['mode']}")  # waits until every worker and server has reached the scheduler
    if kv.num_workers != spec["workers"]:
        raise ValueError(f"the kvstore has {kv.num_workers} workers, the spec {spec['workers']}")
    if kv.rank != index:
        print(f"mxnet worker {index}: ps-lite gave rank {kv.rank}, so this process trains w{kv.rank}", file=sys.stderr)
    return kv, kv.rank


def finish(
    mx: Any, spec: dict[str, Any], kv: Any, rank: int, keys: list, weights: list, meter: Meter, results, beat: Any
) -> None:
    """After the last step: the final weights on rank 0 (pulled from the servers in ``async``), this worker's
    stats, rank 0's ``quality.json`` from ``results()`` (which writes ``final.npz``), the kvstore's end; the
    heartbeat ``beat`` waits at the barrier, then is done before the kvstore's end waits for the others."""
    out = Path(spec["out"])
    if spec["mode"] == "async":
        beat.exchange()
        kv._barrier()  # every worker's last update is on the servers
        if rank == 0:
            kv.pull(keys, out=weights)
            mx.nd.waitall()
    write_json(out / f"stats-worker-{rank}.json", meter.stats(rank))
    if rank == 0:
        write_json(out / "quality.json", results())
    mx.nd.waitall()
    beat.done()
    del kv  # a dist kvstore's end: a barrier of the workers, then rank 0 stops the servers and scheduler


def write_json(path: Path, value: dict[str, Any]) -> None:
    """Write ``value`` as JSON, through a temporary file so that a reader never sees half of it."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)


def fail(args: argparse.Namespace, out: Path, error: BaseException) -> None:
    """Report ``error``: one line on stderr and the traceback in ``out/error-<role>-<index>.log``."""
    what = " ".join(f"{type(error).__name__}: {error}".split())
    if len(what) > 400:  # MXNetError carries the C++ stack; its cause comes last
        what = "…" + what[-400:]
    print(f"mxnet {args.role} {args.index}: {what}", file=sys.stderr, flush=True)
    if out.is_dir():
        with contextlib.suppress(OSError):
            (out / f"error-{args.role}-{args.index}.log").write_text(traceback.format_exc(), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Run one process of the job; 0 when its part is done, 1 after a failure (reported by :func:`fail`)."""
    args = parse_args(argv)
    out = args.spec.parent
    try:
        spec = json.loads(args.spec.read_text(encoding="utf-8"))
        out = Path(spec.get("out", out))
        if spec.get("workload") not in ("lenet", "ptb-lstm", "gpt"):
            raise ValueError(f"workload {spec.get('workload')!r}: this program trains lenet, ptb-lstm and gpt")
        set_threads(spec["threads"])
        check_role(spec, args.role)
        import progress  # beside this file: the heartbeat of a process that trains (the folder is on the path)

        if args.role == "worker" and spec.get("probe"):
            import mxnet_probe  # beside this file: the times scaletrain profile --framework mxnet measures

            mxnet_probe.run(spec, args.index)
        elif args.role == "worker" and spec["workload"] == "ptb-lstm":
            import mxnet_lstm  # beside this file: the LSTM language model's part of the program

            mxnet_lstm.train(spec, args.index, progress.Progress(spec, args.role, args.index))
        elif args.role == "worker" and spec["workload"] == "gpt":
            import mxnet_gpt  # beside this file: the transformer language model's part of the program

            mxnet_gpt.train(spec, args.index, progress.Progress(spec, args.role, args.index))
        elif args.role == "worker":
            train(spec, args.index, progress.Progress(spec, args.role, args.index))
        else:
            serve(args.role)
    except Exception as error:
        fail(args, out, error)
        return 1
    return 0


if __name__ == "__main__":
    status = main()
    if status:  # a failed worker leaves without the kvstore's closing barrier, which could wait forever
        sys.stdout.flush()
        os._exit(status)
    sys.exit(status)
