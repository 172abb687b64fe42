"""Parameter servers on c10d point-to-point: central (one server process) or sharded (every worker
owns a share of the tensors), synchronous or asynchronous (Downpour SGD, Dean et al. 2012).

Every worker–owner pair talks over its own two-process group, so a worker that dies breaks only its own links (an
asynchronous central server carries on with the others). An owner serves each peer from a thread of its own; the
threads meet in :class:`~scaletrain.parallel.ps.server.ShardServer`, which applies updates under a lock. Messages,
the two directions of a pair kept apart by tags:

- ``REQUEST`` (worker → owner): header ``[kind, version, batches_done, layout_id, numel]``, then a body: for a
  gradient the owner's share, flat; one value for done and reconfigure (a step boundary where the network changes,
  ``version`` then holding the epoch). ``batches_done`` is the clock of ``--max-staleness`` (:mod:`.bound`);
- ``REPLY`` (owner → worker): header ``[version, layout_id, numel, skipped, payload bytes, generation]``, then the
  owner's flat weights, or none when the layouts differ (both sides then stop, naming both layouts). ``skipped`` is 1
  when the update was not made because the gradient overflowed (``skip_nonfinite``, dynamic loss scaling), 2 when an
  elastic central server asks for the step again with the membership of ``generation`` (:mod:`.membership`);
- ``GRANT`` (owner → worker): with ``--ps-admission exclusive``, leave to send (Šlampa 2017 §7.2);
- ``FINAL_SHARD`` (owner → rank 0): a sharded owner's final master tensors, for evaluation and ``model.pt``.

Each side posts the receives of a header and its body before it waits for either: gloo holds a message's bytes
until its receive is posted, so a later receive costs one more trip over the link (docs/benchmarks.md). Only a
worker's first reply from an owner, and the first after a reconfiguration, is received header first: only that
header tells how many weights follow when the networks differ. Modules: ``protocol``, ``server``, ``exchange``
(a worker's side), ``records`` (checkpoints, metrics, the model), ``staleness``, ``bound`` and ``membership``.
"""
