"""``--operator kubeflow``: a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``; needs the training operator).

Rank 0 is the ``Master`` replica, the other processes are ``Worker`` replicas; the container is named
``pytorch`` and its port ``pytorchjob-port``, as the operator expects. The operator creates a Service
per pod and injects ``MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``
and the ``PET_*`` variables, which scaletrain reads as torchrun's (nothing is set here).

Restarts: ``OnFailure`` for synchronous strategies, so every process that fails after a loss is
restarted and resumes from the checkpoint (``runPolicy.backoffLimit`` bounds the total). The
operator ends a PyTorchJob when a replica fails for good, so for asynchronous training a lost worker
is not retried (``Never``) and ends the job; rerun it to resume from the volume.
"""

from __future__ import annotations

from typing import Any

from scaletrain.deploy.common import Deployment, container, pod_spec

__all__ = ["render"]


def _replica(run: Deployment, replicas: int, restart: str) -> dict[str, Any]:
    box = container(run, {}, name="pytorch", first_rank=None)
    box["ports"] = [{"name": "pytorchjob-port", "containerPort": run.deploy.port, "protocol": "TCP"}]
    pod = pod_spec(run, [box], restart_policy=restart)
    return {
        "replicas": replicas,
        "restartPolicy": restart,
        "template": {"metadata": {"labels": run.labels("training")}, "spec": pod},
    }


def render(run: Deployment) -> list[dict[str, Any]]:
    """The PyTorchJob of ``run``."""
    world = run.layout.world_size
    restart = "OnFailure" if run.synchronous else "Never"
    replicas = {"Master": _replica(run, 1, restart)}
    if world > 1:
        replicas["Worker"] = _replica(run, world - 1, restart)
    spec = {
        "runPolicy": {"backoffLimit": run.deploy.max_restarts * world, "cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": replicas,
    }
    name = run.deploy.name
    return [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": run.metadata(name, "training"),
            "spec": spec,
        }
    ]
