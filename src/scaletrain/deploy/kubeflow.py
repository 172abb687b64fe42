"""``--operator kubeflow``: a Kubeflow ``PyTorchJob`` (``kubeflow.org/v1``; needs the training operator).

Rank 0 is the ``Master`` replica, the other processes are ``Worker`` replicas; the container is named
``pytorch`` and its port ``pytorchjob-port``, as the operator expects. The operator creates a Service
per pod and injects ``MASTER_ADDR`` (``<job>-master-0``), ``MASTER_PORT``, ``WORLD_SIZE``, ``RANK``
(which scaletrain reads) and ``PET_*`` variables for torchrun (nothing is set here).

Elastic (``--min-workers``, ``--max-workers``): only ``Worker`` replicas, one pod per process, and an
``elasticPolicy`` with torchrun's ``c10d`` rendezvous, ``minReplicas``/``maxReplicas`` (the bounds
plus the central server's pod, if any) and ``maxRestarts`` (``--max-restarts``). The v1 operator
(``pkg/controller.v1/pytorch/elastic.go``, ``envvar.go`` of v1.9.0) then sets no ``RANK`` or
``WORLD_SIZE`` but ``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT`` (``<job>-worker-0:<port>``) and
``PET_NNODES=MIN:MAX``, so each pod runs its start script under ``torchrun --no-python``, whose agent
forms the group and sets the torchrun variables (a restart by the agent runs the script again, which
adds ``--resume`` once a checkpoint exists). What scaletrain does with it today: its world size is
fixed at launch (``--workers``), so a group that forms with another size is refused and the agents
form it again; a lost process makes torchrun restart every process of the group (torchrun's elastic
mode restarts all workers on any membership change) and they resume from the last checkpoint.
In pods, training on with fewer workers (``train --min-workers`` under scaletrain's own launcher), or
admitting new ones into a running job, is not built.

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


def _elastic_spec(run: Deployment) -> dict[str, Any]:
    """Worker replicas only, started by torchrun, and the ``elasticPolicy`` the operator reads."""
    deploy, layout = run.deploy, run.layout
    assert deploy.min_workers is not None  # only called for an elastic job
    box = container(run, {}, name="pytorch", first_rank=None, launcher=("torchrun", "--no-python"))
    box["ports"] = [{"name": "pytorchjob-port", "containerPort": deploy.port, "protocol": "TCP"}]
    pod = pod_spec(run, [box], restart_policy="OnFailure")
    servers = layout.world_size - layout.workers  # the central server's pod counts as a replica too
    world = layout.world_size
    return {
        "elasticPolicy": {
            "rdzvBackend": "c10d",
            "minReplicas": deploy.min_workers + servers,
            "maxReplicas": (deploy.max_workers or layout.workers) + servers,
            "maxRestarts": deploy.max_restarts,
        },
        "nprocPerNode": "1",  # one scaletrain process per pod; the operator's default "auto" is not
        "runPolicy": {"backoffLimit": deploy.max_restarts * world, "cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": world,
                "restartPolicy": "OnFailure",
                "template": {"metadata": {"labels": run.labels("training")}, "spec": pod},
            }
        },
    }


def render(run: Deployment) -> list[dict[str, Any]]:
    """The PyTorchJob of ``run`` (elastic when ``--min-workers`` is given)."""
    if run.deploy.min_workers is not None:
        return [_job(run, _elastic_spec(run))]
    world = run.layout.world_size
    restart = "OnFailure" if run.synchronous else "Never"
    replicas = {"Master": _replica(run, 1, restart)}
    if world > 1:
        replicas["Worker"] = _replica(run, world - 1, restart)
    spec = {
        "runPolicy": {"backoffLimit": run.deploy.max_restarts * world, "cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": replicas,
    }
    return [_job(run, spec)]


def _job(run: Deployment, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": run.metadata(run.deploy.name, "training"),
        "spec": spec,
    }
