"""Parameter servers on c10d point-to-point: central (one server process) or sharded (every worker
owns a share of the tensors), synchronous or asynchronous (Downpour SGD, Dean et al. 2012).

Every worker–owner pair talks over its own two-process group, so a worker that dies breaks only
its own links: an asynchronous central server carries on with the others. An owner serves each
peer from its own thread; the threads meet in :class:`ShardServer`, which applies updates under a
lock. Messages (tags keep the two directions of a pair apart):

- worker → owner, ``REQUEST``: header ``[kind, version, batches_done, layout_id, numel]`` (``batches_done``:
  the worker's clock, by which ``--max-staleness`` holds replies: :mod:`.bound`) then, for
  a gradient, the flat gradient of the owner's tensors (kinds: gradient, done, reconfigure — the
  worker is at a step boundary where the network changes; ``version`` then holds the epoch);
- owner → worker, ``REPLY``: header ``[version, layout_id, numel, skipped, payload bytes, generation]``
  then the owner's flat weights (no weights when the layouts differ: both sides then stop with both layouts named);
  ``skipped`` is 1 when the update this reply answers was not made because the gradient overflowed
  (with ``skip_nonfinite``, under dynamic loss scaling), and 2 when an elastic central server asks the
  worker to do the step again with the membership of ``generation`` (:mod:`.membership`);
- owner → worker, ``GRANT``: with ``--ps-admission exclusive``, permission to send (Šlampa 2017
  §7.2: one transfer at a time into the server, one out).
- owner → rank 0, ``FINAL_SHARD``: once training has ended, a sharded owner's final master tensors
  (for rank 0's evaluation and ``model.pt``).

Every request is a header and a body (a one-value stand-in for done and reconfigure), and each side
posts the receives of both before it waits for either: gloo holds back a message's bytes until its
receive is posted, so a body whose receive is posted only after its header arrives costs one more
trip over the link (measured with LeNet's 1.7 MB at 1 thread: 1.27 ms against 0.95 ms per round trip).
A worker's first reply from an owner (and the first after a reconfiguration) is received header
first, since only that header tells how many weights follow when the two networks differ.

Modules: ``protocol`` (tags, headers, the pair groups, sending and receiving a message), ``server``
(:class:`~scaletrain.parallel.ps.server.ShardServer`, an owner's side), ``exchange``
(:class:`~scaletrain.parallel.ps.exchange.PSExchange`, a worker's side), ``records`` (what a server
writes: checkpoints, metrics, the model), ``staleness`` (how an asynchronous server compensates
for stale gradients), ``bound`` (bounded staleness: a fast worker's reply held for the slowest) and
``membership`` (an elastic central server's survivors going on without a lost worker).
"""
