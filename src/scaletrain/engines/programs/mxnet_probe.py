"""MXNet program, probe part: the times ``scaletrain profile --framework mxnet`` measures (lenet).

``mxnet_worker.py`` runs it for role ``worker`` when the spec has a ``probe`` block (the contract is in
:mod:`scaletrain.engines`). Mode ``local``: for each ``n`` of ``probe["parts"]`` the gradient of the first
``batch_size / n`` samples of ``order.npz["w0"][0]`` (the training program's hybridized network: forward under
``autograd.record``, then backward, each ended by ``waitall``; the backward's part is kept as well), then the
optimizer step (MXNet's SGD updater on every key), ``probe["warmup"]`` untimed rounds then ``probe["repeats"]``
timed ones, after a barrier of the ``probe["processes"]`` processes started at once. Mode ``sync``: kvstore
``dist_sync``'s push of this worker's gradient and pull of the sum (every key, as training moves them), and the
same for a one-number key, each timed after a one-number push and pull that absorbs the other workers' lateness.
"""

from __future__ import annotations

import time

import numpy as np


def run(spec: dict, index: int) -> None:
    """Time what the spec's mode asks for and write ``probe-worker-<index>.json``."""
    import mxnet as mx
    import mxnet_worker as worker
    import probe_common  # beside this file, as the program is (imported here: the program's folder is on the path)
    from mxnet import autograd, gluon

    kv, rank = worker.kvstore(mx, spec, index) if spec["mode"] == "sync" else (None, index)  # local: k alone
    data = spec["data"]
    mean, std = float(data["mean"]), float(data["std"])
    images, labels = worker.read_idx(data["train_images"]), worker.read_idx(data["train_labels"]).astype(np.float32)
    with np.load(spec["order"]) as orders:
        batch = orders[f"w{rank if kv is not None else 0}"][0]
    with np.load(spec["init"]) as saved:
        net, params = worker.build_network(mx, dict(saved))
    weights = [param.data() for _, param in params]
    grads = [param.grad() for _, param in params]
    keys = list(range(len(params)))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    probe = spec["probe"]
    rounds = probe["warmup"] + probe["repeats"]

    def gradient(chosen: np.ndarray) -> tuple[float, float]:
        """Seconds of the forward+backward of ``chosen`` and of its backward alone."""
        x, y = mx.nd.array(worker.normalise(images[chosen], mean, std)), mx.nd.array(labels[chosen])
        mx.nd.waitall()
        begin = time.perf_counter()
        with autograd.record():
            loss = loss_fn(net(x), y)
        mx.nd.waitall()
        middle = time.perf_counter()
        loss.backward()
        mx.nd.waitall()
        end = time.perf_counter()
        return end - begin, end - middle

    if kv is not None:
        gradient(batch)
        sums = [mx.nd.zeros(grad.shape) for grad in grads]
        small, small_sum = [mx.nd.ones((1,))], [mx.nd.zeros((1,))]
        kv.init(keys, weights)
        kv.init([len(keys)], small)
        samples = {"exchange": [], "small": []}
        for round_number in range(rounds):
            exchange(mx, kv, [len(keys)], small, small_sum)  # every worker leaves here together
            begin = time.perf_counter()
            exchange(mx, kv, keys, grads, sums)
            middle = time.perf_counter()
            exchange(mx, kv, [len(keys)], small, small_sum)
            if round_number >= probe["warmup"]:
                samples["exchange"].append(middle - begin)
                samples["small"].append(time.perf_counter() - middle)
        probe_common.write_samples(spec, rank, samples)
        mx.nd.waitall()
        del kv  # the kvstore's end: the workers' barrier, then rank 0 stops the servers and the scheduler
        return
    updater = mx.optimizer.get_updater(worker.sgd(mx, spec, len(batch)))
    samples = {"t_grad": {}, "t_update": [], "t_backward": []}
    probe_common.barrier(spec, index)
    for parts in probe["parts"]:
        timed = []
        for round_number in range(rounds):
            whole, backward = gradient(batch[: len(batch) // parts])
            begin = time.perf_counter()
            for key in keys:
                updater(key, grads[key], weights[key])
            mx.nd.waitall()
            if round_number >= probe["warmup"]:
                timed.append(whole)
                if parts == 1:
                    samples["t_update"].append(time.perf_counter() - begin)
                    samples["t_backward"].append(backward)
        samples["t_grad"][str(parts)] = timed
    probe_common.write_samples(spec, index, samples)


def exchange(mx, kv, keys: list, values: list, into: list) -> None:
    """Push ``values`` under ``keys``, pull their sum over the workers into ``into``, and wait for it."""
    kv.push(keys, values)
    kv.pull(keys, out=into)
    mx.nd.waitall()
