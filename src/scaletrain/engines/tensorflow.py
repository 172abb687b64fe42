"""TensorFlow 2 (CPU): MultiWorkerMirroredStrategy for all-reduce, ParameterServerStrategy for async servers.

The Jäger thesis trained TensorFlow 1.x with one parameter server and asynchronous updates (SPEC §3); in
TensorFlow 2 that is ``ParameterServerStrategy`` with a ``ClusterCoordinator`` (a ``chief`` that dispatches
each step to a free worker). Keras 3's ``model.fit`` does not run under either strategy, so the program
trains with a custom loop. ``TF_CONFIG`` tells each process the cluster and its own task.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from scaletrain.engines.base import Engine, Host, Role

__all__ = ["TensorFlowEngine"]


@dataclass(frozen=True)
class TensorFlowEngine(Engine):
    name: str = "tensorflow"
    packages: tuple[str, ...] = ("tensorflow-cpu==2.21.0",)
    module: str = "tensorflow"
    program: str = "tensorflow_worker.py"
    workloads: tuple[str, ...] = ("lenet", "ptb-lstm", "gpt")
    modes: tuple[tuple[str, str], ...] = (
        ("local", "one process"),
        ("sync", "MultiWorkerMirroredStrategy, ring all-reduce over gRPC"),
        ("async", "ParameterServerStrategy with a ClusterCoordinator chief"),
    )
    # a coordinator's closure runs on whichever worker is free: no worker could carry its rows' LSTM state; the
    # asynchronous closure is LeNet's SGD step, gpt's AdamW on the parameter servers is not written
    workload_modes: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("ptb-lstm", ("local", "sync")),
        ("gpt", ("local", "sync")),
    )
    # the coordinator's closures move the weights inside the step: the chief sees only whole steps
    unsplit: tuple[str, ...] = ("async",)
    noise: tuple[str, ...] = (r"^[IWE]\d{4} ", r"oneDNN custom operations", r"cpu_feature_guard", r"absl::")

    def roles(self, mode: str, workers: int, servers: int) -> list[Role]:
        if mode == "local":
            return [Role("worker", 0, trains=True)]
        if mode == "sync":
            return [Role("worker", i, trains=True) for i in range(workers)]
        # the chief dispatches the steps and measures them; workers and ps serve until they are stopped
        return [
            Role("chief", 0, trains=True),
            *(Role("worker", i, ends_itself=False) for i in range(workers)),
            *(Role("ps", i, ends_itself=False) for i in range(servers)),
        ]

    def environment(self, role: Role, roles: list[Role], hosts: list[Host]) -> dict[str, str]:
        """``TF_CONFIG``: every task's address by kind, and this process's task.

        >>> roles = TensorFlowEngine().roles("sync", 2, 0)
        >>> hosts = [Host("127.0.0.1", port, "lo") for port in (4000, 4001)]
        >>> TensorFlowEngine().environment(roles[1], roles, hosts)["TF_CONFIG"]
        '{"cluster": {"worker": ["127.0.0.1:4000", "127.0.0.1:4001"]}, "task": {"type": "worker", "index": 1}}'
        """
        quiet = {"TF_CPP_MIN_LOG_LEVEL": "2"}  # its C++ INFO and WARNING lines stay out of the logs' last words
        if len(roles) == 1:
            return quiet
        cluster: dict[str, list[str]] = {}
        for other, host in zip(roles, hosts, strict=True):
            cluster.setdefault(other.name, []).append(f"{host.address}:{host.port}")
        task = {"type": role.name, "index": role.index}
        return {**quiet, "TF_CONFIG": json.dumps({"cluster": cluster, "task": task})}
