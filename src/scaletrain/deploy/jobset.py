"""``--operator jobset``: a ``JobSet`` (``jobset.x-k8s.io/v1alpha2``; needs the JobSet controller).

With a central parameter server (``--strategy ps --server central``) the set has two replicated
jobs, ``server`` (one pod, rank 0) and ``worker`` (an Indexed Job of N pods, ranks 1…N); with the
other strategies only ``worker``, ranks 0…N−1. The controller gives every pod the host name
``<set>-<job>-<job index>-<pod index>`` under a headless Service named after the set, and
``MASTER_ADDR`` is rank 0's name.

Restarts: every child Job fails on its first pod failure (``backoffLimit: 0``) and the set's
``failurePolicy`` then recreates all of them (up to ``--max-restarts`` times); every pod resumes from
the last checkpoint on the volume. This is restart-all for every strategy, asynchronous ones included.
"""

from __future__ import annotations

from typing import Any

from scaletrain.deploy.common import Deployment, container, pod_spec

__all__ = ["render"]


def _replicated_job(run: Deployment, role: str, processes: int, first_rank: int, env: dict[str, str]) -> dict:
    pod = pod_spec(run, [container(run, env, first_rank=first_rank)], restart_policy="Never")
    return {
        "name": role,
        "replicas": 1,
        "template": {
            "spec": {
                "completionMode": "Indexed",
                "completions": processes,
                "parallelism": processes,
                "backoffLimit": 0,
                "template": {"metadata": {"labels": run.labels(role)}, "spec": pod},
            }
        },
    }


def render(run: Deployment) -> list[dict[str, Any]]:
    """The JobSet of ``run``."""
    name, layout = run.deploy.name, run.layout
    first = "server" if layout.has_server_process else "worker"
    env = {
        "WORLD_SIZE": str(layout.world_size),
        "MASTER_ADDR": f"{name}-{first}-0-0.{name}",
        "MASTER_PORT": str(run.deploy.port),
    }
    jobs = []
    if layout.has_server_process:
        jobs.append(_replicated_job(run, "server", 1, 0, env))
    jobs.append(_replicated_job(run, "worker", layout.workers, 1 if layout.has_server_process else 0, env))
    spec = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": name},
        "failurePolicy": {"maxRestarts": run.deploy.max_restarts},
        "replicatedJobs": jobs,
    }
    return [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": run.metadata(name, "training"),
            "spec": spec,
        }
    ]
