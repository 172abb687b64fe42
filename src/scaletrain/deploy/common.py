"""What every Kubernetes flavour shares: the deployment settings, the pod's container, the run folder's
volume and the configuration as a ConfigMap (TensorBoard: :mod:`.tensorboard`; writing the objects out:
:mod:`.output`).

Objects are plain dicts in the Kubernetes API's own shape, dumped with PyYAML. A pod runs
``scaletrain train WORKLOAD --config /etc/scaletrain/run.toml`` (the run configuration comes from a
ConfigMap) through a small ``sh`` script that adds ``--resume`` whenever the run folder on the
shared volume already holds a checkpoint, so a restarted pod continues instead of starting over.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Protocol

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies import Layout

__all__ = [
    "CONFIG_DIR",
    "CONFIG_FILE",
    "LONGEST_NAME",
    "OPERATORS",
    "PULL_POLICIES",
    "RUNS_DIR",
    "DeployConfig",
    "Deployment",
    "Placed",
    "config_map",
    "container",
    "container_resources",
    "object_labels",
    "object_metadata",
    "pod_spec",
    "pod_volumes",
    "run_toml",
    "volume_claim",
]

OPERATORS = ("none", "kubeflow", "jobset", "trainer")
PULL_POLICIES = ("Always", "IfNotPresent", "Never")
#: Where the run folder's volume is mounted in every pod; the run itself is ``RUNS_DIR/<name>``.
RUNS_DIR = PurePosixPath("/runs")
CONFIG_DIR = PurePosixPath("/etc/scaletrain")
CONFIG_FILE = "run.toml"
#: Where the image's virtual environment puts ``scaletrain`` and ``tensorboard`` (see Dockerfile).
DEFAULT_PORT = 29500
DEFAULT_MAX_RESTARTS = 3
#: The longest ``--name``: ``<name>-tensorboard`` must still be a DNS label (63 characters).
LONGEST_NAME = 63 - len("-tensorboard")
_NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti|P|Pi|E|Ei)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


@dataclass(frozen=True)
class DeployConfig:
    """How the run is placed on the cluster; the training itself is a :class:`TrainConfig`.

    ``name`` names every object (the Job, Service, ConfigMap, volume claim …) and the run folder
    ``/runs/<name>`` on the volume. ``max_restarts`` bounds how often a failed run is restarted
    from its last checkpoint. ``min_workers`` (and ``max_workers``, default ``--workers``) ask the
    Kubeflow training operator for an elastic PyTorchJob (see :mod:`scaletrain.deploy.kubeflow`).

    >>> DeployConfig(name="lenet-ar", image="scaletrain:cpu", cpus=2).cpu_quantity
    '2'
    """

    name: str
    image: str
    operator: str = "none"
    namespace: str | None = None
    service_account: str | None = None
    pull_policy: str = "IfNotPresent"
    cpus: float | None = None
    memory: str | None = None
    gpus: int = 0
    node_selector: dict[str, str] = field(default_factory=dict)
    volume_size: str = "5Gi"
    storage_class: str | None = None
    access_mode: str = "ReadWriteMany"
    port: int = DEFAULT_PORT
    max_restarts: int = DEFAULT_MAX_RESTARTS
    tensorboard_deployment: bool = True
    min_workers: int | None = None
    max_workers: int | None = None

    def __post_init__(self) -> None:
        longest = LONGEST_NAME
        if not _NAME.match(self.name) or len(self.name) > longest:
            raise ConfigError(
                f"--name {self.name!r} must be lower-case letters, digits and '-', start with a letter and be at "
                f"most {longest} characters (it names Kubernetes objects and pod host names)"
            )
        if not self.image:
            raise ConfigError("give --image, the container image with scaletrain (see scripts/build-image.sh)")
        if self.operator not in OPERATORS:
            raise ConfigError(f"--operator must be one of {', '.join(OPERATORS)}, got {self.operator!r}")
        if self.namespace is not None and not _NAME.match(self.namespace):
            raise ConfigError(f"--namespace {self.namespace!r} is not a valid Kubernetes namespace name")
        if self.pull_policy not in PULL_POLICIES:
            raise ConfigError(f"--pull-policy must be one of {', '.join(PULL_POLICIES)}, got {self.pull_policy!r}")
        if self.cpus is not None and not self.cpus > 0:
            raise ConfigError(f"--cpus must be > 0, got {self.cpus!r}")
        for flag, value in (("--memory", self.memory), ("--volume-size", self.volume_size)):
            if value is not None and not _QUANTITY.match(value):
                raise ConfigError(f"{flag} {value!r} is not a Kubernetes quantity; write e.g. 4Gi or 512Mi")
        if self.gpus < 0:
            raise ConfigError(f"--gpus must be ≥ 0, got {self.gpus}")
        for key, value in self.node_selector.items():
            if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or len(value) > 63:
                raise ConfigError(f"--node-selector {key}={value} is not a valid label; write KEY=VALUE")
        if self.access_mode not in ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"):
            raise ConfigError("--access-mode must be ReadWriteMany (pods on many nodes) or ReadWriteOnce (one node)")
        if not 0 < self.port < 65536:
            raise ConfigError(f"--port {self.port} is not a valid TCP port")
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts must be ≥ 0, got {self.max_restarts}")
        self._check_elastic()
        if self.operator == "trainer":
            self._check_trainer()

    def _check_elastic(self) -> None:
        """``--min-workers``/``--max-workers`` on their own; :func:`scaletrain.deploy.plan` checks them against
        ``--workers``."""
        if self.min_workers is None and self.max_workers is None:
            return
        if self.operator != "kubeflow":
            raise ConfigError(
                "--min-workers/--max-workers write a PyTorchJob's elasticPolicy: add --operator kubeflow, "
                "or leave them out"
            )
        if self.min_workers is None:
            raise ConfigError("--max-workers needs --min-workers too (the elastic PyTorchJob's minReplicas)")
        if self.min_workers < 1:
            raise ConfigError(f"--min-workers must be ≥ 1, got {self.min_workers}")
        if self.max_workers is not None and self.max_workers < self.min_workers:
            raise ConfigError(
                f"--max-workers {self.max_workers} is below --min-workers {self.min_workers}; give MIN ≤ MAX"
            )

    def _check_trainer(self) -> None:
        """What a TrainJob has no field for: the ClusterTrainingRuntime decides it."""
        if self.port != DEFAULT_PORT:
            raise ConfigError(
                f"--port cannot be set with --operator trainer: the torch-distributed runtime sets "
                f"PET_MASTER_PORT={DEFAULT_PORT} itself; leave --port out"
            )
        if self.pull_policy != "IfNotPresent":
            raise ConfigError(
                "--pull-policy cannot be set with --operator trainer: a TrainJob has no field for it "
                "(the runtime's pod template decides); leave it out"
            )
        if self.max_restarts != DEFAULT_MAX_RESTARTS:
            raise ConfigError(
                "--max-restarts cannot be set with --operator trainer: the ClusterTrainingRuntime decides "
                "restarts (torch-distributed: pods restart OnFailure, up to the Job's default backoffLimit "
                "of 6); leave it out"
            )

    @property
    def cpu_quantity(self) -> str | None:
        """``--cpus`` as a Kubernetes quantity: whole cores as ``"2"``, fractions in millicores."""
        if self.cpus is None:
            return None
        return str(int(self.cpus)) if float(self.cpus).is_integer() else f"{round(self.cpus * 1000)}m"

    @property
    def run_dir(self) -> PurePosixPath:
        return RUNS_DIR / self.name


@dataclass(frozen=True)
class Deployment:
    """One rendered run: the settings, the training's configuration and its process layout.

    A run of a bench sweep (:mod:`scaletrain.deploy.sweep`) names the ``sweep``: it mounts the
    sweep's volume claim ``<sweep>-runs`` and trains in its own ``folder`` there; a run of its own
    has the claim ``<name>-runs`` and the folder ``/runs/<name>``.
    """

    deploy: DeployConfig
    train: TrainConfig
    settings: dict[str, Any]  # what the user set (file and flags), written to the ConfigMap as TOML
    layout: Layout
    sweep: str | None = None
    folder: PurePosixPath | None = None

    @property
    def claim_name(self) -> str:
        return f"{self.sweep or self.deploy.name}-runs"

    @property
    def run_dir(self) -> PurePosixPath:
        return self.folder or self.deploy.run_dir

    @property
    def synchronous(self) -> bool:
        """A lost process stops everyone (all-reduce, sync modes, sharded servers): restart them all. Not where
        the strategy's server outlives lost workers (the asynchronous central server)."""
        return not self.layout.outlives_lost_workers

    def labels(self, component: str, *, instance: str | None = None) -> dict[str, str]:
        return object_labels(self.deploy, component, instance=instance, sweep=self.sweep)

    def metadata(self, name: str, component: str, *, instance: str | None = None) -> dict[str, Any]:
        return object_metadata(self.deploy, name, self.labels(component, instance=instance))


class Placed(Protocol):
    """What a run's volume claim needs of it: a :class:`Deployment` or a foreign engine's run (:mod:`.engines`)."""

    @property
    def deploy(self) -> DeployConfig: ...

    @property
    def sweep(self) -> str | None: ...

    @property
    def claim_name(self) -> str: ...

    def metadata(self, name: str, component: str, *, instance: str | None = None) -> dict[str, Any]: ...


def object_labels(
    deploy: DeployConfig, component: str, *, instance: str | None = None, sweep: str | None = None
) -> dict[str, str]:
    """The labels of a run's objects: ``instance`` (default the run's name) and its ``component``."""
    labels = {
        "app.kubernetes.io/name": "scaletrain",
        "app.kubernetes.io/instance": instance or deploy.name,
        "app.kubernetes.io/component": component,
    }
    if sweep:
        labels["app.kubernetes.io/part-of"] = sweep
    return labels


def object_metadata(deploy: DeployConfig, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": labels}
    if deploy.namespace:
        meta["namespace"] = deploy.namespace
    return meta


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"setting {value!r} cannot be written to the run configuration")
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)  # a JSON string is a valid TOML basic string


def run_toml(settings: dict[str, Any]) -> str:
    """The run configuration in the ``--config`` TOML format of :func:`scaletrain.config.load_toml`.

    >>> print(run_toml({"batch_size": 16, "options": {"num_steps": 35}, "technique_options": {"ratio": 0.5}}), end="")
    batch-size = 16
    <BLANKLINE>
    [options]
    num_steps = 35
    <BLANKLINE>
    [technique_options]
    ratio = 0.5
    """
    lines = [
        f"{key.replace('_', '-')} = {_toml_value(value)}"
        for key, value in settings.items()
        if not isinstance(value, dict) and value is not None
    ]
    for table, values in settings.items():  # options, technique_options: tables, after every plain key
        if isinstance(values, dict) and values:
            lines += ["", f"[{table}]"] + [f"{key} = {_toml_value(value)}" for key, value in values.items()]
    return "\n".join(lines) + "\n"


def config_map(run: Deployment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": run.metadata(f"{run.deploy.name}-config", "config"),
        "data": {CONFIG_FILE: run_toml(run.settings)},
    }


def volume_claim(run: Placed) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": [run.deploy.access_mode],
        "resources": {"requests": {"storage": run.deploy.volume_size}},
    }
    if run.deploy.storage_class:
        spec["storageClassName"] = run.deploy.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": run.metadata(run.claim_name, "storage", instance=run.sweep),  # a sweep's runs share it
        "spec": spec,
    }


def _start_script(run: Deployment, first_rank: int | None, setup: list[str]) -> str:
    """The pod's ``sh -c`` script: rank from the Job's completion index (or ``setup``'s lines, which run
    first), ``--resume`` once a checkpoint exists."""
    lines = list(setup)
    if first_rank is not None:
        # Kubernetes sets JOB_COMPLETION_INDEX in the pods of an Indexed Job.
        rank = "$JOB_COMPLETION_INDEX" if first_rank == 0 else f"$((JOB_COMPLETION_INDEX + {first_rank}))"
        lines.append(f"export RANK={rank}")
    lines += [
        f'if [ -e "{run.run_dir}/checkpoint.pt" ]; then set -- "$@" --resume; fi',
        'exec scaletrain train "$@"',
    ]
    return "\n".join(lines)


def container(
    run: Deployment,
    env: dict[str, str],
    *,
    name: str = "scaletrain",
    first_rank: int | None,
    setup: tuple[str, ...] = (),
    launcher: tuple[str, ...] = (),
) -> dict:
    """The training container: the start script, the run's arguments, resources and volume mounts.

    ``env`` holds the rendezvous variables this flavour sets itself; ``first_rank`` is the rank of
    completion index 0 when the rank comes from an Indexed Job (``None`` when an operator sets ``RANK``
    or ``setup``, shell lines run first, does). ``launcher`` is a command that runs the start script
    (``torchrun --no-python`` for an elastic PyTorchJob), so that each of its restarts checks for a
    checkpoint again.
    """
    deploy = run.deploy
    args = [run.train.workload, "--config", str(CONFIG_DIR / CONFIG_FILE)]
    spec: dict[str, Any] = {
        "name": name,
        "image": deploy.image,
        "imagePullPolicy": deploy.pull_policy,
        "command": [*launcher, "sh", "-c", _start_script(run, first_rank, list(setup)), "scaletrain"],
        "args": args,
        "env": [{"name": key, "value": value} for key, value in {**env, "PYTHONUNBUFFERED": "1"}.items()],
        "ports": [{"name": "rendezvous", "containerPort": deploy.port, "protocol": "TCP"}],
        "volumeMounts": _volume_mounts(),
    }
    resources = container_resources(deploy)
    if resources:
        spec["resources"] = resources
    return spec


def container_resources(deploy: DeployConfig) -> dict[str, dict[str, Any]]:
    """``--cpus``, ``--memory`` (request = limit) and ``--gpus`` of one process, in a container's shape."""
    resources: dict[str, dict[str, Any]] = {}
    if deploy.cpu_quantity:
        resources.setdefault("requests", {})["cpu"] = deploy.cpu_quantity
        resources.setdefault("limits", {})["cpu"] = deploy.cpu_quantity
    if deploy.memory:
        resources.setdefault("requests", {})["memory"] = deploy.memory
        resources.setdefault("limits", {})["memory"] = deploy.memory
    if deploy.gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = deploy.gpus
    return resources


def _volume_mounts() -> list[dict[str, Any]]:
    """The training container's mounts: the run folder's volume and the ConfigMap."""
    return [
        {"name": "runs", "mountPath": str(RUNS_DIR)},
        {"name": "config", "mountPath": str(CONFIG_DIR), "readOnly": True},
    ]


def pod_volumes(run: Deployment) -> list[dict[str, Any]]:
    return [
        {"name": "runs", "persistentVolumeClaim": {"claimName": run.claim_name}},
        {"name": "config", "configMap": {"name": f"{run.deploy.name}-config"}},
    ]


def pod_spec(run: Deployment, containers: list[dict], *, restart_policy: str) -> dict[str, Any]:
    deploy = run.deploy
    spec: dict[str, Any] = {
        "restartPolicy": restart_policy,
        "containers": containers,
        "volumes": pod_volumes(run),
    }
    if deploy.node_selector:
        spec["nodeSelector"] = dict(deploy.node_selector)
    if deploy.service_account:
        spec["serviceAccountName"] = deploy.service_account
    return spec
