"""Deploying a training run to Kubernetes: manifests in four flavours (see :mod:`.job`, :mod:`.kubeflow`,
:mod:`.jobset`, :mod:`.trainer`), sharing the run folder's volume claim, the run configuration as a ConfigMap and
TensorBoard (:mod:`.common`); a bench sweep as one run per configuration on one volume (:mod:`.sweep`); a
foreign engine's run, TensorFlow's or MXNet's, as an Indexed Job or a JobSet (:mod:`.engines`).

    >>> from scaletrain.deploy import DeployConfig, plan, render
    >>> run = plan("lenet", DeployConfig(name="demo", image="scaletrain:cpu"), {"workers": 2, "steps": 100})
    >>> [obj["kind"] for obj in render(run)]
    ['PersistentVolumeClaim', 'ConfigMap', 'Service', 'Job', 'Deployment', 'Service']
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path, PurePosixPath
from typing import Any

from scaletrain.config import TrainConfig, load_toml, merge
from scaletrain.deploy import job, jobset, kubeflow, trainer
from scaletrain.deploy.common import (
    OPERATORS,
    DeployConfig,
    Deployment,
    config_map,
    volume_claim,
)
from scaletrain.deploy.engines import plan_engine, render_engine
from scaletrain.deploy.output import to_yaml, write_folder
from scaletrain.deploy.tensorboard import tensorboard
from scaletrain.errors import ConfigError
from scaletrain.parallel.run import refuse_unread
from scaletrain.parallel.strategies import (
    Layout,
    check_strategy_settings,
    expand_spec,
    strategy_flags,
    with_strategy_flags,
)
from scaletrain.workloads import create_workload, workload_label

__all__ = ["OPERATORS", "DeployConfig", "Deployment", "kubernetes", "plan", "render", "to_yaml", "write_folder"]

FLAVOURS = {"none": job, "kubeflow": kubeflow, "jobset": jobset, "trainer": trainer}
#: Training settings that make no sense in pods: the deployment decides them.
_DECIDED_HERE = {
    "out": "the run folder is /runs/NAME on the volume claim",
    "resume": "pods add --resume by themselves when the run folder holds a checkpoint",
    "nodefile": "pods find each other through the cluster's DNS",
    "index": "a pod's rank comes from the Job or the operator",
    "network": "emulated networks are for local runs",
}


def plan(
    workload: str,
    deploy: DeployConfig,
    settings: dict[str, Any],
    *,
    config_file: Path | None = None,
    sweep: str | None = None,
    folder: PurePosixPath | None = None,
) -> Deployment:
    """Check the training settings (``config_file`` < ``settings``) and work out the processes.

    The pods get ``progress = "plain"`` and, with ``--cpus``, as many torch threads as whole cores
    unless the settings say otherwise. ``sweep`` and ``folder`` place a run of a bench sweep on the
    sweep's volume (see :class:`Deployment`).
    """
    from_file = load_toml(config_file, also=strategy_flags()) if config_file is not None else {}
    given = merge(from_file, {key: value for key, value in settings.items() if value is not None})
    given = with_strategy_flags(given)  # a strategy's option by its flag's keyword: into strategy_options
    # made here once, as every pod will: a reference that does not import fails now, not in the cluster (the
    # workload's options are checked by the pods, as ever)
    create_workload(workload)
    given.pop("workload", None)
    for key in ("min_workers", "max_workers"):  # deploy's own --min-workers/--max-workers are DeployConfig's
        if given.pop(key, None) is not None:
            raise ConfigError(
                f"{key} in the configuration is train's --{key.replace('_', '-')} (an elastic run's bound: going on "
                "with the survivors, admitting --join), built for local runs only; leave it out (deploy's "
                "--min-workers and --max-workers with --operator kubeflow render an elastic PyTorchJob)"
            )
    if given.pop("join", False):
        raise ConfigError("join in the configuration is train's --join (a worker for a running run); leave it out")
    for key, why in _DECIDED_HERE.items():
        if given.get(key) not in (None, False):
            raise ConfigError(f"--{key.replace('_', '-')} cannot be set for a deployment: {why}; leave it out")
        given.pop(key, None)
    given.setdefault("progress", "plain")
    if deploy.cpus is not None:
        given.setdefault("threads", max(1, int(deploy.cpus)))
    given["out"] = str(folder or deploy.run_dir)
    # In TrainConfig's order, whatever order the file and flags came in: the same run, the same ConfigMap.
    given = {f.name: given[f.name] for f in fields(TrainConfig) if f.name in given}
    given = {key: str(value) if isinstance(value, Path) else value for key, value in given.items()}
    refuse_unread(expand_spec(given))  # the pods' own check, before anything is written
    train = TrainConfig(workload=workload, **expand_spec(given))
    check_strategy_settings(train)
    layout = Layout(train.strategy, train.workers, train.server, train.sync)
    _check_elastic(deploy, train.workers)
    return Deployment(deploy, train, given, layout, sweep=sweep, folder=folder)


def _check_elastic(deploy: DeployConfig, workers: int) -> None:
    """``--min-workers`` ≤ ``--workers`` ≤ ``--max-workers``: the job starts ``--workers`` pods."""
    if deploy.min_workers is not None and deploy.min_workers > workers:
        raise ConfigError(
            f"--min-workers {deploy.min_workers} is above --workers {workers}, the pods the job starts; "
            f"give MIN ≤ {workers} or more --workers"
        )
    if deploy.max_workers is not None and deploy.max_workers < workers:
        raise ConfigError(
            f"--max-workers {deploy.max_workers} is below --workers {workers}; give MAX ≥ {workers} or leave it out"
        )


def render(run: Deployment) -> list[dict[str, Any]]:
    """Every object of the deployment: volume claim, ConfigMap, the flavour's objects, TensorBoard."""
    objects = [volume_claim(run), config_map(run), *FLAVOURS[run.deploy.operator].render(run)]
    if run.deploy.tensorboard_deployment:
        objects += tensorboard(run)
    return objects


def kubernetes(
    workload: str,
    *,
    image: str,
    name: str | None = None,
    config_file: Path | None = None,
    framework: str | None = None,
    servers: int | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Render a training run as Kubernetes objects (see :func:`scaletrain.api.deploy_kubernetes`).

    ``settings`` are :class:`DeployConfig` fields (``operator``, ``cpus``, ``namespace`` …) and
    :class:`~scaletrain.config.TrainConfig` fields (``workers``, ``strategy``, ``steps`` …); ``None``
    counts as not given. ``name`` defaults to ``scaletrain-<workload>`` (for a ``module:attribute``
    reference, its module's last part and attribute: ``scaletrain-tasks-make-workload``). The image must
    hold the reference's module, or the package that declares an installed workload.

    ``framework`` ``tensorflow`` or ``mxnet`` renders that engine's run instead (:mod:`.engines`; ``servers``:
    its number of parameter servers where the strategy leaves it free); the image must hold the engine.
    """
    placement = {f.name for f in fields(DeployConfig)}
    given = {key: value for key, value in settings.items() if value is not None}
    deploy = DeployConfig(
        name=name or f"scaletrain-{workload_label(workload)}",
        image=image,
        **{key: value for key, value in given.items() if key in placement},
    )
    training = {key: value for key, value in given.items() if key not in placement}
    if framework not in (None, "scaletrain"):
        foreign = plan_engine(workload, framework, deploy, training, servers=servers, config_file=config_file)
        return [volume_claim(foreign), *render_engine(foreign)]
    if servers is not None:
        raise ConfigError("--servers sets a foreign engine's parameter servers: add --framework tensorflow or mxnet")
    return render(plan(workload, deploy, training, config_file=config_file))
