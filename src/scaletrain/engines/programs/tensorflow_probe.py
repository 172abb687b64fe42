"""TensorFlow program, probe part: the times ``scaletrain profile --framework tensorflow`` measures (lenet).

``tensorflow_worker.py`` runs it for role ``worker`` when the spec has a ``probe`` block (the contract is in
:mod:`scaletrain.engines`). Mode ``local``: the gradient of the first ``batch_size / n`` samples of
``order.npz["w0"][0]`` for each ``n`` of ``probe["parts"]`` (the training program's ``tf.function``: forward,
loss and the tape's gradient, read back), then the optimizer step (its ``sgd_update``), ``probe["warmup"]``
untimed rounds then ``probe["repeats"]`` timed ones, after a barrier of the ``probe["processes"]`` processes
started at once. Mode ``sync``: ``MultiWorkerMirroredStrategy``'s all-reduce of this worker's gradient (the
training program's ``all_reduce``) and of one number, each timed after a one-number all-reduce that absorbs
the other workers' lateness.
"""

from __future__ import annotations

import time

import numpy as np


def run(spec: dict, index: int) -> None:
    """Time what the spec's mode asks for and write ``probe-worker-<index>.json``."""
    import probe_common  # beside this file, as the program is (imported here: the program's folder is on the path)
    import tensorflow_worker as worker

    tf = worker.start_tensorflow(spec["threads"], alone=spec["mode"] == "local")
    strategy, replicas = worker.replicated_strategy(tf, spec)
    images, labels = worker.load_split(spec["data"], "train")
    with np.load(spec["order"]) as orders:
        batch = orders[f"w{index if spec['mode'] == 'sync' else 0}"][0]
    with strategy.scope():
        weights, velocity = worker.make_variables(tf, spec)
    probe = spec["probe"]
    rounds = probe["warmup"] + probe["repeats"]

    def gradient_function(size: int):
        @tf.function
        def gradients(x, y):
            return strategy.run(lambda a, b: worker.batch_loss(tf, weights, a, b, size * replicas), args=(x, y))

        return gradients

    def local(value):
        return strategy.experimental_local_results(value)[0]

    if spec["mode"] == "sync":
        all_reduce = worker.all_reduce_function(tf, strategy)
        grads, _ = gradient_function(len(batch))(tf.constant(images[batch]), tf.constant(labels[batch]))
        one = [tf.constant(np.ones(1, np.float32))]
        samples = {"exchange": [], "small": []}
        for round_number in range(rounds):
            local(all_reduce(one))[-1].numpy()  # both workers leave here together
            begin = time.perf_counter()
            local(all_reduce(grads))[-1].numpy()
            middle = time.perf_counter()
            local(all_reduce(one))[-1].numpy()
            if round_number >= probe["warmup"]:
                samples["exchange"].append(middle - begin)
                samples["small"].append(time.perf_counter() - middle)
        probe_common.write_samples(spec, index, samples)
        return

    @tf.function
    def update(grads):
        worker.sgd_update(tf, weights, velocity, grads, spec)
        with tf.control_dependencies([weight.value() for weight in weights]):
            return tf.identity(weights[-1][0])

    samples = {"t_grad": {}, "t_update": []}
    probe_common.barrier(spec, index)
    for parts in probe["parts"]:
        chosen = batch[: len(batch) // parts]
        x, y = tf.constant(images[chosen]), tf.constant(labels[chosen])
        gradients = gradient_function(len(chosen))
        timed = []
        for round_number in range(rounds):
            begin = time.perf_counter()
            grads, loss = gradients(x, y)
            float(loss)  # reading the loss waits for the gradients
            middle = time.perf_counter()
            update(grads).numpy()
            if round_number >= probe["warmup"]:
                timed.append(middle - begin)
                if parts == 1:
                    samples["t_update"].append(time.perf_counter() - middle)
        samples["t_grad"][str(parts)] = timed
    probe_common.write_samples(spec, index, samples)
