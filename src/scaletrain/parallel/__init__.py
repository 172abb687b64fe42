"""Data-parallel training over processes and machines.

``launch`` starts the processes (local, node file, or a torchrun-style launcher's environment),
``rendezvous`` joins them into a c10d process group, ``plan`` decides which data each worker
computes, and the gradient exchanges (``exchange``: local, all-reduce; ``ps``: central or sharded
parameter server, sync or async) move gradients and weights.
"""
