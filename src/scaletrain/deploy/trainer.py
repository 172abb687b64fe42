"""``--operator trainer``: a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``).

The TrainJob names the ``torch-distributed`` ClusterTrainingRuntime that Kubeflow Trainer installs
(``spec.runtimeRef``) and gives ``trainer.numNodes`` (one pod per process: the workers, and the
central server if there is one), ``numProcPerNode: 1``, the image, ``command``/``args``, ``env`` and
``resourcesPerNode``. The run folder's volume, the ConfigMap, ``--node-selector`` and
``--service-account`` go into the pods through ``spec.runtimePatches`` (the runtime's replicated job
``node``, container ``node``).

Facts from Kubeflow Trainer v2.3.0 (``pkg/runtime/framework/plugins/torch/torch.go``,
``pkg/constants/constants.go``): the runtime builds a JobSet named after the TrainJob with one
replicated job ``node`` of ``numNodes`` pods, and injects into the trainer container
``PET_NNODES`` (numNodes), ``PET_NPROC_PER_NODE`` (numProcPerNode), ``PET_NODE_RANK`` (the pod's
Job completion index), ``PET_MASTER_ADDR`` (``<name>-node-0-0.<name>``) and ``PET_MASTER_PORT``
(29500); a TrainJob must not set these itself. The pod's start script exports them as the
torchrun variables scaletrain reads (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``)
and refuses a ``PET_NPROC_PER_NODE`` other than 1, since each pod is one scaletrain process.

Restarts are the runtime's to decide: ``torch-distributed`` has no ``failurePolicy``, JobSet defaults
the pods to ``restartPolicy: OnFailure`` and the Job's ``backoffLimit`` is Kubernetes' default (6);
a restarted pod resumes from the last checkpoint like the other flavours' pods.
"""

from __future__ import annotations

from typing import Any

from scaletrain.deploy.common import Deployment, container, pod_volumes

__all__ = ["RUNTIME", "RUNTIME_VARIABLES", "render"]

#: The ClusterTrainingRuntime that Kubeflow Trainer v2 installs for PyTorch (``manifests/base/runtimes``).
RUNTIME = "torch-distributed"
#: The runtime's replicated job and its trainer container, both named ``node``.
NODE = "node"
#: What the runtime injects, and the torchrun variable scaletrain reads for each (None: only checked to be 1).
RUNTIME_VARIABLES = {
    "PET_NODE_RANK": "RANK",
    "PET_NNODES": "WORLD_SIZE",
    "PET_MASTER_ADDR": "MASTER_ADDR",
    "PET_MASTER_PORT": "MASTER_PORT",
    "PET_NPROC_PER_NODE": None,
}


def _setup() -> tuple[str, ...]:
    """Shell lines that turn the runtime's ``PET_*`` variables into scaletrain's torchrun variables."""
    missing = "not set; run this pod from a TrainJob of the torch-distributed runtime"
    lines = [f': "${{{name}:?{missing}}}"' for name in RUNTIME_VARIABLES]
    lines.append(
        'if [ "$PET_NPROC_PER_NODE" != 1 ]; then echo "PET_NPROC_PER_NODE is $PET_NPROC_PER_NODE: scaletrain '
        'runs one process per pod; set trainer.numProcPerNode: 1" >&2; exit 2; fi'
    )
    exports = " ".join(f'{ours}="${pet}"' for pet, ours in RUNTIME_VARIABLES.items() if ours)
    lines.append(f"export {exports}")
    return tuple(lines)


def render(run: Deployment) -> list[dict[str, Any]]:
    """The TrainJob of ``run``."""
    deploy = run.deploy
    box = container(run, {}, name=NODE, first_rank=None, setup=_setup())
    trainer: dict[str, Any] = {
        "image": deploy.image,
        "command": box["command"],
        "args": box["args"],
        "env": box["env"],
        "numNodes": run.layout.world_size,
        "numProcPerNode": 1,
    }
    if "resources" in box:
        trainer["resourcesPerNode"] = box["resources"]
    pod: dict[str, Any] = {
        "volumes": pod_volumes(run),
        "containers": [{"name": NODE, "volumeMounts": box["volumeMounts"]}],
    }
    if deploy.node_selector:
        pod["nodeSelector"] = dict(deploy.node_selector)
    if deploy.service_account:
        pod["serviceAccountName"] = deploy.service_account
    # The patch follows the runtime's JobSet template: replicated job "node", its Job template, its pod template.
    node_job = {
        "name": NODE,
        "template": {"spec": {"template": {"metadata": {"labels": run.labels("training")}, "spec": pod}}},
    }
    patch = {
        "manager": "scaletrain",
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node_job]}}},
    }
    spec = {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": RUNTIME},
        "trainer": trainer,
        "runtimePatches": [patch],
    }
    return [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": run.metadata(deploy.name, "training"),
            "spec": spec,
        }
    ]
