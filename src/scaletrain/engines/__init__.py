"""Foreign engines: the same workloads trained by TensorFlow and MXNet, measured by scaletrain's meter.

The Jäger thesis (SPEC §3) compares how frameworks scale; this package lets ``bench`` answer that beside
scaletrain's own runs. Each engine is a worker program in ``programs/`` that runs in its own Python environment
(``scaletrain engines install NAME``: a venv under the engines folder) and imports nothing of scaletrain, only the
standard library, NumPy and its framework. scaletrain prepares everything the program reads, starts its processes
and turns what they write into the same ``summary.json`` as its own runs.

The contract between scaletrain and a program, ``PROGRAM --spec SPEC --role ROLE --index I`` (every field and file
in docs/extending.md, "The worker program's contract"):

- ``spec.json``, written by scaletrain: the workload (``lenet``, ``ptb-lstm`` or ``gpt``), the mode (``local``;
  ``sync``: all-reduce over a global batch of ``workers × batch_size``; ``async``: parameter servers), the
  processes, SGD's settings as torch defines them (``gpt``: AdamW's and the rate's schedule), each worker's steps
  and warm-up, the threads, the data, the samples of every step (``order.npz``) and the initial weights
  (``init.npz``, under torch's names and layouts);
- the roles: TensorFlow's ``worker`` (for ``async`` also ``ps`` and a ``chief``) told of the others by
  ``TF_CONFIG``; MXNet's ``worker`` (for ``sync`` and ``async`` also ``server`` and a ``scheduler``) by ``DMLC_*``;
- a ``probe`` block in the spec asks for timings instead of training (``scaletrain profile --framework``,
  :mod:`scaletrain.engines.probe`), written as ``probe-worker-<i>.json``;
- in ``out``: ``stats-<role>-<index>.json`` from each process that measures steps (the meter of
  :class:`scaletrain.train.summary.WorkerStats`), ``final.npz`` and ``quality.json`` from the process that holds the
  final weights; a program that fails exits non-zero with one line on stderr;
- a heartbeat ``progress-<role>-<index>`` (``programs/progress.py``) from each process that trains, by which the
  launcher stops a run that stands still for ``--timeout`` seconds.
"""
