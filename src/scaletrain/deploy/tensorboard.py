"""A TensorBoard beside a deployed run: a Deployment that reads the run folder on the shared volume, and
its Service."""

from __future__ import annotations

from typing import Any

from scaletrain.deploy.common import RUNS_DIR, Deployment

__all__ = ["TENSORBOARD_PORT", "tensorboard"]

TENSORBOARD_PORT = 6006


def tensorboard(run: Deployment) -> list[dict[str, Any]]:
    """A TensorBoard Deployment reading the run folder on the shared volume, and its Service."""
    deploy = run.deploy
    name = f"{deploy.name}-tensorboard"
    labels = run.labels("tensorboard")
    board = {
        "name": "tensorboard",
        "image": deploy.image,
        "imagePullPolicy": deploy.pull_policy,
        "command": ["tensorboard", "--logdir", str(run.run_dir), "--bind_all", "--port", str(TENSORBOARD_PORT)],
        "ports": [{"name": "http", "containerPort": TENSORBOARD_PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": "runs", "mountPath": str(RUNS_DIR), "readOnly": True}],
    }
    pod: dict[str, Any] = {
        "containers": [board],
        "volumes": [{"name": "runs", "persistentVolumeClaim": {"claimName": run.claim_name, "readOnly": True}}],
    }
    if deploy.node_selector:
        pod["nodeSelector"] = dict(deploy.node_selector)
    if deploy.service_account:
        pod["serviceAccountName"] = deploy.service_account
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": run.metadata(name, "tensorboard"),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {"metadata": {"labels": labels}, "spec": pod},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": run.metadata(name, "tensorboard"),
            "spec": {
                "selector": labels,
                "ports": [{"name": "http", "port": TENSORBOARD_PORT, "targetPort": "http", "protocol": "TCP"}],
            },
        },
    ]
