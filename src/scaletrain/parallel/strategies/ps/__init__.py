"""Parameter servers on c10d point-to-point: central (one server process) or sharded (every worker
owns a share of the tensors), synchronous or asynchronous (Downpour SGD, Dean et al. 2012).

Every worker–owner pair talks over its own two-process group, so a worker that dies breaks only its own links (an
asynchronous central server carries on with the others). An owner serves each peer from a thread of its own; the
threads meet in :class:`~.server.ShardServer`, which applies updates under a lock. A worker sends requests (a
gradient, done, reconfigure), an owner replies (its weights), grants (``--ps-admission exclusive``,
Šlampa 2017 §7.2) and, sharded, its ``FINAL_SHARD`` to rank 0; :mod:`.protocol` lays them out. Each side posts the
receives of a header and its body before it waits for either: gloo holds a message's bytes until its receive is
posted, so a later receive costs one more trip over the link (docs/benchmarks.md).

Its parts: ``strategy`` (the registered :class:`~.strategy.ParameterServer` and the processes of a run) with
``options`` (its own settings); ``protocol`` (tags, headers, the pair groups); ``server`` (an owner's master
tensors) with ``losses`` (a lost peer) and ``bound`` (``--max-staleness``); ``exchange`` (a worker's side);
``shards`` and ``elastic_sharded`` (the sharded server, fixed and elastic); ``membership`` (the elastic central
server); ``staleness`` and ``async_batches`` (asynchronous updates); ``records`` (checkpoints, metrics, the model);
``summary`` (its ``summary.json`` fields); ``terms`` (its estimator terms).
"""
