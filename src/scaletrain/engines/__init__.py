"""Foreign engines: the same workloads trained by TensorFlow and MXNet, measured by scaletrain's meter.

The Jäger thesis (SPEC §3) compares how frameworks scale; this package lets ``bench`` answer that beside
scaletrain's own runs. Each engine is a worker program in ``programs/`` that runs in **its own Python
environment** (``scaletrain engines install NAME``: a venv under the engines folder) and imports nothing of
scaletrain: only the standard library, NumPy and its framework. scaletrain prepares everything the program
reads, starts its processes, and turns what they write into the same ``summary.json`` as its own runs.

The contract between scaletrain and a program (``PROGRAM --spec SPEC --role ROLE --index I``):

``spec.json`` (written by scaletrain)
    ``workload`` (``lenet`` or ``ptb-lstm``), ``mode`` (``local``: one process; ``sync``: all-reduce, a step is
    one batch of ``batch_size`` on every worker, global batch ``workers × batch_size``; ``async``: parameter
    servers, every worker applies its own batches), ``workers``, ``servers``, ``batch_size`` (per worker and
    step: images, or rows of text), ``lr``, ``momentum``, ``weight_decay`` (SGD as torch defines it:
    ``v = μv + g + λw; w -= lr·v``), ``clip_norm`` (the whole gradient's norm clipped to it as torch's
    ``clip_grad_norm_`` does before the update; 0: not clipped), ``steps`` (a list: each worker's steps),
    ``warmup_steps`` (each process's first steps, left out of the meter), ``train_size`` (the training images
    or words), ``steps_per_epoch`` (global batches of an epoch), ``metric`` (the quality the summary names),
    ``threads`` (intra- and inter-op threads, at least 2 inter-op threads for TensorFlow's PS workers),
    ``order`` (``order.npz``), ``init`` (``init.npz``: the initial weights scaletrain's seeded model has,
    under torch's names and layouts), ``out`` (the folder). For ``lenet``: ``data`` (the four Fashion-MNIST
    IDX files, ``.gz`` or raw, and ``mean``/``std``: pixels / 255, then ``(x - mean) / std``) and in
    ``order.npz`` ``w0``, ``w1`` …, int64 of shape ``(steps[i], batch_size)``: the training samples of each
    worker's steps, drawn by scaletrain's sampler. For ``ptb-lstm``
    (:mod:`scaletrain.engines.prepare_text`): ``model`` (``vocab_size``, ``hidden_size``, ``layers``,
    ``num_steps``, ``eval_batch_size``), ``data`` (``tokens``: ``tokens.npz`` with the int32 word ids
    ``train`` and ``test`` as scaletrain's vocabulary encodes them), and in ``order.npz`` ``w<i>``, int64
    ``(steps[i], batch_size)``: where each row's window starts in ``train`` (targets one word later), and
    ``r<i>``, ``(steps[i],)``: 1 where the carried LSTM state starts again from zeros.
Processes (roles)
    TensorFlow: ``worker`` 0..N-1; for ``async`` also ``ps`` 0..P-1 and a ``chief`` (the
    ``ClusterCoordinator``); ``TF_CONFIG`` comes from scaletrain. MXNet: ``worker`` 0..N-1; for ``sync``
    and ``async`` also ``server`` 0..P-1 and a ``scheduler``; the ``DMLC_*`` variables come from scaletrain.
A probe (``scaletrain profile --framework``, :mod:`scaletrain.engines.probe`)
    The spec has a ``probe`` block: ``parts``, ``repeats``, ``warmup``, ``threads``, ``processes``; ``steps`` is
    ``[1]`` per worker. ``local``: ``processes`` programs run at once, each ``worker`` ``i`` alone (no cluster
    variables); after a barrier of files (``probe-ready-<i>`` in ``out``) each times t_grad of the first
    ``batch_size / n`` samples of ``w0[0]`` per ``n`` of ``parts`` and the optimizer step. ``sync``: the layout of
    a synchronous run; each worker times its engine's exchange of the whole gradient (``exchange``) and of one
    number (``small``). Each timing worker writes ``probe-worker-<i>.json`` (seconds per round after ``warmup``:
    ``t_grad`` by ``n``, ``t_update``, MXNet's ``t_backward``; or ``exchange`` and ``small``) and nothing else.
What a program writes in ``out``
    ``stats-<role>-<index>.json`` for each process that measures steps: ``rank``, ``steps``,
    ``measured_steps``, ``measured_seconds`` (the sum of its measured steps' wall time, from asking for
    the batch to the updated weights being ready), ``communication_seconds``, ``wait_seconds``,
    ``data_seconds``, ``batch_fraction`` (1.0), ``first_step_loss``, ``last_step_loss``, ``final_loss``
    (the meter of :class:`scaletrain.train.summary.WorkerStats`); ``final.npz`` (the trained weights,
    torch's names and layouts) and ``quality.json`` (``test_accuracy`` or ``test_perplexity``, and
    ``test_loss``: mean cross-entropy per image or word, over the whole test set) from the process that
    holds the final weights. A program that fails exits non-zero with one line on stderr.
The heartbeat (``programs/progress.py``, read by the launcher)
    Each process that trains (TensorFlow's ``worker`` of ``local``/``sync`` and ``async``'s ``chief``, whose
    steps are the coordinator's closures; MXNet's ``worker``) writes ``progress-<role>-<index>`` in ``out``:
    ``<phase> <count>``, rewritten at most every 0.5 s and only when it changed, from its first step done on.
    Phases: ``train`` (steps done), ``exchange`` (waiting for the others: an all-reduce, a push and pull, a
    barrier), ``evaluate`` (test batches scored), ``done`` (every result written; waiting for the others to
    end). Servers, schedulers and TensorFlow's ``async`` workers and ``ps`` write none: their trainers' progress
    covers them. The launcher stops the run and names a process whose heartbeat has not changed for
    ``--timeout`` seconds (or that has none after the start bound: ``--timeout``, at least 120 s); a probe
    writes none and is not watched so. Fault injection, for the tests of that watchdog only: a spec block
    ``hang`` (``{"role": "worker", "index": 1, "step": 5}``) makes that process wait forever after that step,
    neither ending nor frozen, after one line on stderr.
"""
