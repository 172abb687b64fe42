"""``deploy kubernetes --framework tensorflow|mxnet``: a foreign engine's run as pods, in the thesis's layout.

One pod per process of the engine's layout (:meth:`Engine.roles <scaletrain.engines.base.Engine.roles>`):
TensorFlow's ``worker`` pods, and for an asynchronous strategy its ``ps`` pods and a ``chief``; MXNet's
``scheduler``, ``server`` and ``worker`` pods. ``--operator jobset`` renders a JobSet with one replicated job per role
(an Indexed Job each: a pod's index within its role is ``JOB_COMPLETION_INDEX``, its name
``<name>-<role>-0-<index>.<name>``); ``--operator none`` one Indexed Job for every process and a headless Service
(pod ``k``, ``<name>-k.<name>``, takes its role and index from ``k`` in the layout's order). Peers reach each other
by these DNS names, every process on ``--port``.

Each pod's init container runs ``scaletrain engines prepare`` (:mod:`scaletrain.engines.cluster`) on the run's
settings from the ConfigMap (``engine.json``): it checks that the image holds the engine and writes the program's
inputs into an ``emptyDir``, the same on every pod since the preparation is seeded. The container then runs the
program with the engine's python (``$SCALETRAIN_ENGINES/<engine>``) after exporting what the engine's own launcher
would set (:meth:`Engine.environment <scaletrain.engines.base.Engine.environment>`): ``TF_CONFIG`` or the ``DMLC_*``
variables. The programs write into the run folder ``/runs/<name>`` on the volume claim.

An engine's run has no checkpoint, so a lost process ends it: an Indexed Job fails at the first failed pod
(``backoffLimit: 0``), a JobSet starts every pod again, up to ``--max-restarts`` times. Processes that serve until
stopped (TensorFlow's asynchronous ``worker`` and ``ps``) do not decide the end (``successPolicy`` on the others),
and they end by themselves once the chief's mark appears in the shared run folder. docs/deployment.md lists what is
rendered.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from scaletrain.config import load_toml, merge
from scaletrain.deploy.common import (
    CONFIG_DIR,
    DEFAULT_MAX_RESTARTS,
    DeployConfig,
    container_resources,
    object_labels,
    object_metadata,
)
from scaletrain.deploy.job import headless_service
from scaletrain.engines.base import Engine, Host, Role
from scaletrain.engines.cluster import PROGRAMS_FOLDER, RUN_FILE, run_json
from scaletrain.engines.install import ENV_ENGINES
from scaletrain.engines.launch import check_layout, known_engine
from scaletrain.engines.layouts import FOREIGN_MODES, FOREIGN_STRATEGIES, engine_run, foreign_mode
from scaletrain.engines.prepare import SPEC_NAME, EngineRun, check_settings
from scaletrain.engines.registry import ENGINES, FRAMEWORKS
from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies import strategy_flags

__all__ = ["ENGINE_DIR", "FOLLOWED", "IMAGE_ENGINES", "EngineDeployment", "plan_engine", "render_engine"]

#: the settings the engines' programs follow (the rest of ``train``'s are refused)
FOLLOWED = (
    "epochs",
    "steps",
    "batch_size",
    "lr",
    "momentum",
    "weight_decay",
    "clip_norm",
    "seed",
    "threads",
    "warmup_steps",
    "data_dir",
    "options",
)
#: where a pod's init container prepares what the program reads (an ``emptyDir``)
ENGINE_DIR = PurePosixPath("/engine")
#: where the image keeps the engines' environments (the Dockerfile's ``SCALETRAIN_ENGINES``)
IMAGE_ENGINES = "/opt/engines"
OPERATORS = ("none", "jobset")


@dataclass(frozen=True)
class EngineDeployment:
    """One foreign run on the cluster: where it goes, its engine and settings, and its processes."""

    deploy: DeployConfig
    engine: Engine
    run: EngineRun
    strategy: str
    roles: tuple[Role, ...]
    sweep: str | None = None

    @property
    def claim_name(self) -> str:
        return f"{self.deploy.name}-runs"

    def labels(self, component: str, *, instance: str | None = None) -> dict[str, str]:
        return object_labels(self.deploy, component, instance=instance)

    def metadata(self, name: str, component: str, *, instance: str | None = None) -> dict[str, Any]:
        return object_metadata(self.deploy, name, self.labels(component, instance=instance))

    def address(self, position: int) -> str:
        """The DNS name of the process at ``position`` in :attr:`roles`."""
        name, role = self.deploy.name, self.roles[position]
        if self.deploy.operator == "jobset":
            return f"{name}-{role.name}-0-{role.index}.{name}"
        return f"{name}-{position}.{name}"

    def environment(self) -> dict[str, str]:
        """The variables the engine's launcher gives the process at ``roles[0]``, with the pods' addresses."""
        hosts = [Host(self.address(k), self.deploy.port, "") for k in range(len(self.roles))]
        return self.engine.environment(self.roles[0], list(self.roles), hosts)


def plan_engine(
    workload: str,
    framework: str,
    deploy: DeployConfig,
    settings: dict[str, Any],
    *,
    servers: int | None = None,
    config_file: Path | None = None,
) -> EngineDeployment:
    """Check the framework, strategy, workload and settings (``config_file`` < ``settings``); the run's layout.

    Only the engines' registry is asked: the engine need not be installed here, only in the image.
    """
    if framework not in ENGINES:
        raise ConfigError(f"--framework {framework!r}: the frameworks are {', '.join(FRAMEWORKS)}")
    if deploy.operator not in OPERATORS:
        raise ConfigError(
            f"--operator {deploy.operator} runs scaletrain's own training; a foreign engine's run is rendered "
            "by --operator none (an Indexed Job) or --operator jobset (a JobSet)"
        )
    if deploy.operator == "none" and deploy.max_restarts != DEFAULT_MAX_RESTARTS:
        raise ConfigError(
            "--max-restarts: a foreign engine's Indexed Job is not restarted (its run has no checkpoint); "
            "--operator jobset starts every pod over up to --max-restarts times"
        )
    known_engine(framework, workload)
    given = merge(load_toml(config_file, also=strategy_flags()) if config_file is not None else {}, settings)
    given = {key: value for key, value in given.items() if value not in (None, {}) and key != "workload"}
    workers = given.pop("workers", 1)
    if workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}")
    strategy = _strategy(given.pop("strategy", None), given.pop("server", None), given.pop("sync", None), workers)
    mode = foreign_mode(strategy, workers)
    if mode is None or (mode[0] == "local" and workers > 1):
        raise ConfigError(
            f"--strategy {strategy} at {workers} workers: a foreign engine runs local (one worker), "
            f"{', '.join(FOREIGN_STRATEGIES[1:])}"
        )
    unfollowed = sorted(key for key in given if key not in FOLLOWED)
    if unfollowed:
        flags = ", ".join(f"--{key.replace('_', '-')}" for key in unfollowed)
        raise ConfigError(f"{flags}: the {framework} engine's pods do not follow it; leave it out")
    if deploy.cpus is not None:
        given.setdefault("threads", max(1, int(deploy.cpus)))
    run = engine_run(framework, workload, strategy, workers, given)
    engine = check_layout(run)
    check_settings(run)
    if servers is not None:
        run = dataclasses.replace(run, servers=_servers(engine, run, strategy, servers))
    roles = tuple(engine.roles(run.mode, run.workers, run.servers))
    return EngineDeployment(deploy, engine, run, strategy, roles)


def _strategy(strategy: str | None, server: str | None, sync: str | None, workers: int) -> str:
    """The spec as the bench names it: given whole, in parts (``--strategy ps --server central --sync async``),
    or by default local for one worker and all-reduce for more."""
    if strategy is None:
        return "local" if workers == 1 else "allreduce-join"
    if "-" in strategy:
        return strategy
    return "-".join(part for part in (strategy, server, sync) if part)


def _servers(engine: Engine, run: EngineRun, strategy: str, servers: int) -> int:
    """``--servers``, where the layout has servers and their number is free."""
    if servers < 1:
        raise ConfigError(f"--servers must be ≥ 1, got {servers}")
    if not any(role.name in ("ps", "server") for role in engine.roles(run.mode, run.workers, servers)):
        raise ConfigError(f"--servers: the {engine.name} engine runs {strategy} without servers; leave it out")
    fixed = FOREIGN_MODES[strategy][1]
    if fixed and servers != fixed:  # a central server is one; 0 or None leave the engine's count to --servers
        count = "one server" if fixed == 1 else f"{fixed} servers"
        raise ConfigError(f"--servers {servers}: {strategy} has {count}; ps-sharded-async has several")
    return servers


def _role_lines(run: EngineDeployment, role: Role | None) -> list[str]:
    """Shell lines that set ``role`` and ``index``: the replicated job's role, or the Indexed Job's ranges."""
    if role is not None:
        return [f"role={role.name} index=$JOB_COMPLETION_INDEX"]
    lines, first = ["k=$JOB_COMPLETION_INDEX"], 0
    groups = [(name, sum(r.name == name for r in run.roles)) for name in dict.fromkeys(r.name for r in run.roles)]
    for number, (name, count) in enumerate(groups):
        keyword = "if" if number == 0 else "elif"
        test = f'{keyword} [ "$k" -lt {first + count} ]; then ' if number < len(groups) - 1 else "else "
        offset = "$k" if first == 0 else f"$((k - {first}))"
        lines.append(f"{test if len(groups) > 1 else ''}role={name} index={offset}")
        first += count
    if len(groups) > 1:
        lines[-1] += "; fi"
    return lines


def _variables(run: EngineDeployment) -> tuple[list[dict[str, Any]], list[str]]:
    """The container's variables the same in every pod, and the start script's lines for the pod's own."""
    common = run.environment()
    lines = []
    if "TF_CONFIG" in common:
        cluster = json.loads(common.pop("TF_CONFIG"))["cluster"]
        common["SCALETRAIN_TF_CLUSTER"] = json.dumps(cluster)
        task = '{\\"type\\": \\"$role\\", \\"index\\": $index}'
        lines.append(f'export TF_CONFIG="{{\\"cluster\\": $SCALETRAIN_TF_CLUSTER, \\"task\\": {task}}}"')
    env = [{"name": key, "value": value} for key, value in common.items() if not key.startswith("DMLC_")]
    if "DMLC_ROLE" in common:
        shared = ("DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_SERVER", "DMLC_NUM_WORKER")
        env += [{"name": key, "value": common[key]} for key in shared]
        env.append({"name": "DMLC_USE_KUBERNETES", "value": "1"})  # ps-lite's scheduler binds 0.0.0.0
        env.append({"name": "DMLC_NODE_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        lines.append('export DMLC_ROLE="$role"')
    env.append({"name": "PYTHONUNBUFFERED", "value": "1"})
    return env, lines


def start_script(run: EngineDeployment, role: Role | None) -> str:
    """The container's ``sh -c`` script: the pod's role and index, its variables, then the engine's program."""
    _, lines = _variables(run)
    python = f'"${{{ENV_ENGINES}:-{IMAGE_ENGINES}}}/{run.engine.name}/bin/python"'
    program = ENGINE_DIR / PROGRAMS_FOLDER / run.engine.program
    command = f'exec {python} {program} --spec {ENGINE_DIR / SPEC_NAME} --role "$role" --index "$index"'
    return "\n".join(["set -e", *_role_lines(run, role), *lines, command])


def _pod(run: EngineDeployment, role: Role | None, labels: dict[str, str]) -> dict[str, Any]:
    deploy = run.deploy
    env, _ = _variables(run)
    mounts = [
        {"name": "runs", "mountPath": "/runs"},
        {"name": "config", "mountPath": str(CONFIG_DIR), "readOnly": True},
        {"name": "engine", "mountPath": str(ENGINE_DIR)},
    ]
    prepare = ["scaletrain", "engines", "prepare", str(CONFIG_DIR / RUN_FILE)]
    prepare += ["--into", str(ENGINE_DIR), "--results", str(deploy.run_dir)]
    boxes = [
        {"name": "prepare", "image": deploy.image, "imagePullPolicy": deploy.pull_policy, "command": prepare},
        {
            "name": run.engine.name,
            "image": deploy.image,
            "imagePullPolicy": deploy.pull_policy,
            "command": ["sh", "-c", start_script(run, role)],
            "env": env,
            "ports": [{"name": "engine", "containerPort": deploy.port, "protocol": "TCP"}],
        },
    ]
    for box in boxes:
        box["volumeMounts"] = mounts
        if container_resources(deploy):
            box["resources"] = container_resources(deploy)
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "initContainers": boxes[:1],
        "containers": boxes[1:],
        "volumes": [
            {"name": "runs", "persistentVolumeClaim": {"claimName": run.claim_name}},
            {"name": "config", "configMap": {"name": f"{deploy.name}-config"}},
            {"name": "engine", "emptyDir": {}},
        ],
    }
    if deploy.node_selector:
        spec["nodeSelector"] = dict(deploy.node_selector)
    if deploy.service_account:
        spec["serviceAccountName"] = deploy.service_account
    return {"metadata": {"labels": labels}, "spec": spec}


def _indexed_job(run: EngineDeployment) -> list[dict[str, Any]]:
    name, world, labels = run.deploy.name, len(run.roles), run.labels("training")
    service = headless_service(run, "engine")
    template = _pod(run, None, labels)
    template["spec"]["subdomain"] = name
    spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": world,
        "parallelism": world,
        "backoffLimit": 0,
        "template": template,
    }
    ending = [str(k) for k, role in enumerate(run.roles) if role.ends_itself]
    if len(ending) < world:
        spec["successPolicy"] = {"rules": [{"succeededIndexes": ",".join(ending)}]}
    return [
        service,
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": run.metadata(name, "training"), "spec": spec},
    ]


def _jobset(run: EngineDeployment) -> list[dict[str, Any]]:
    name = run.deploy.name
    jobs = []
    for role_name in dict.fromkeys(role.name for role in run.roles):
        first = next(role for role in run.roles if role.name == role_name)
        count = sum(role.name == role_name for role in run.roles)
        job = {"completionMode": "Indexed", "completions": count, "parallelism": count, "backoffLimit": 0}
        job["template"] = _pod(run, first, run.labels(role_name))
        jobs.append({"name": role_name, "replicas": 1, "template": {"spec": job}})
    spec: dict[str, Any] = {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True, "subdomain": name},
        "failurePolicy": {"maxRestarts": run.deploy.max_restarts},
        "replicatedJobs": jobs,
    }
    ending = list(dict.fromkeys(role.name for role in run.roles if role.ends_itself))
    if len(ending) < len(jobs):
        spec["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ending}
    metadata = run.metadata(name, "training")
    return [{"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": metadata, "spec": spec}]


def render_engine(run: EngineDeployment) -> list[dict[str, Any]]:
    """The run's ConfigMap (``engine.json``) and its Indexed Job and Service, or its JobSet (the volume claim
    is :func:`scaletrain.deploy.common.volume_claim`'s)."""
    config = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": run.metadata(f"{run.deploy.name}-config", "config"),
        "data": {RUN_FILE: run_json(run.run)},
    }
    return [config, *(_jobset(run) if run.deploy.operator == "jobset" else _indexed_job(run))]
