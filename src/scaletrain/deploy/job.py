"""``--operator none``: an Indexed Job (one pod per process) and a headless Service; nothing to install.

Pod ``i`` of an Indexed Job gets ``JOB_COMPLETION_INDEX=i`` and, with ``subdomain`` set to the
headless Service, the DNS name ``<job>-i.<service>``; rank = index, and ``MASTER_ADDR`` is pod 0's
name. The Service publishes pods before they are ready, so the name exists as soon as pod 0 has an
address; workers that start earlier retry within the run's ``--timeout`` (see
:func:`scaletrain.parallel.rendezvous.connect`).

Restarts: with synchronous strategies a lost process makes every other one fail (a broken
connection, or at the latest the ``--timeout``), ``restartPolicy: OnFailure`` restarts each of them
and all resume from the last checkpoint. Asynchronous training with a central server (rank 0)
tolerates lost workers: indexes are not retried, up to N−1 of them may fail, and the Job succeeds
when the server (index 0) does.
"""

from __future__ import annotations

from typing import Any

from scaletrain.deploy.common import Deployment, container, pod_spec

__all__ = ["render"]


def headless_service(run: Any, port_name: str) -> dict[str, Any]:
    """The headless Service that gives each pod of ``run``'s training Job a stable DNS name (its pods' labels,
    ``run.deploy``'s name and port, published before the pods are ready)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": run.metadata(run.deploy.name, "training"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": run.labels("training"),
            "ports": [{"name": port_name, "port": run.deploy.port, "targetPort": run.deploy.port}],
        },
    }


def render(run: Deployment) -> list[dict[str, Any]]:
    """The headless Service and the Indexed Job of ``run``."""
    name, world = run.deploy.name, run.layout.world_size
    labels = run.labels("training")
    env = {"WORLD_SIZE": str(world), "MASTER_ADDR": f"{name}-0.{name}", "MASTER_PORT": str(run.deploy.port)}
    service = headless_service(run, "rendezvous")
    restart = "OnFailure" if run.synchronous else "Never"
    pod = pod_spec(run, [container(run, env, first_rank=0)], restart_policy=restart)
    pod["subdomain"] = name
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": world,
        "parallelism": world,
        "template": {"metadata": {"labels": labels}, "spec": pod},
    }
    if run.synchronous:
        # Each restart of the whole group costs up to one failure per process.
        spec["backoffLimit"] = run.deploy.max_restarts * world
    else:
        spec["backoffLimitPerIndex"] = 0
        spec["maxFailedIndexes"] = max(0, run.layout.workers - 1)
        spec["successPolicy"] = {"rules": [{"succeededIndexes": "0"}]}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": run.metadata(name, "training"), "spec": spec}
    return [service, job]
