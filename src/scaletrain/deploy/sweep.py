"""A ``scaletrain bench`` sweep on Kubernetes: one training Job per configuration of the grid.

Every configuration (strategy spec × workers × batch size × repeat, as :func:`~scaletrain.measure.sweep.plan_runs`
plans them for a local bench) becomes a run of its own in the chosen flavour, named
``<name>-<configuration>`` (e.g. ``lenet-bench-ps-central-async-b64-w4-r0``): its ConfigMap, and for
``--operator none`` its headless Service and Indexed Job. All runs mount one volume claim,
``<name>-runs``, and each trains in ``/runs/<name>/runs/<configuration>`` — the layout of a local
bench's output folder, so that ``scaletrain bench`` run with the same grid on a copy of
``/runs/<name>`` finds every run's ``summary.json`` and assembles results, pictures and report from
them without training (see docs/deployment.md). The runs get the bench's own training settings (its
default of 100 steps, 5 untimed warm-up steps, one thread per process, no TensorBoard logs); the
bench's unmeasured warm-up run is left out, since every run starts in fresh pods.

    >>> from scaletrain.measure.sweep import SweepConfig
    >>> grid = SweepConfig("lenet", Path("/runs/fm"), workers=(1, 2), strategies=("allreduce-join",), batch_sizes=(64,))
    >>> runs = plan_sweep(grid, DeployConfig(name="fm", image="scaletrain:cpu"))
    >>> for run in runs:
    ...     print(run.deploy.name, run.run_dir, run.layout.world_size)
    fm-allreduce-join-b64-w1-r0 /runs/fm/runs/allreduce-join-b64-w1-r0 1
    fm-allreduce-join-b64-w2-r0 /runs/fm/runs/allreduce-join-b64-w2-r0 2
    >>> [obj["kind"] for obj in render_sweep(runs)]
    ['PersistentVolumeClaim', 'ConfigMap', 'Service', 'Job', 'ConfigMap', 'Service', 'Job']
"""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from pathlib import Path
from typing import Any

from scaletrain.deploy import FLAVOURS, plan
from scaletrain.deploy.common import LONGEST_NAME, RUNS_DIR, DeployConfig, Deployment, config_map, volume_claim
from scaletrain.errors import ConfigError
from scaletrain.measure.bench import preset_config
from scaletrain.measure.sweep import SweepConfig, plan_runs, run_settings
from scaletrain.workloads import workload_label

__all__ = ["kubernetes_sweep", "plan_sweep", "render_sweep"]

#: Bench settings that only mean something on the machine running ``scaletrain bench``.
_LOCAL_ONLY = {
    "network": "emulated networks are for local runs",
    "max_workers": "it caps worker counts to this machine's cores; the cluster runs every count given",
    # a foreign engine's pods would need its environment in the image and its own layout of processes
    "frameworks": "the pods run scaletrain's own training; foreign engines run with scaletrain bench on this machine",
}


def plan_sweep(sweep: SweepConfig, deploy: DeployConfig) -> list[Deployment]:
    """One :class:`Deployment` per configuration of ``sweep``, placed as ``deploy`` says.

    ``deploy.name`` names the sweep: its volume claim, its folder ``/runs/<name>`` and the prefix of
    every run's objects. Configurations that come out the same (a strategy or batch size given
    twice, ``ps-distributed-none`` beside ``ps-sharded-async``) are rendered once.
    """
    runs, _ = plan_runs(sweep)
    folders = list(dict.fromkeys(run.folder() for run in runs))  # in the sweep's order, each once
    if not folders:
        raise ConfigError("the sweep has no configurations; give at least one strategy spec in --strategies")
    room = LONGEST_NAME - 1 - max(len(folder) for folder in folders)
    if len(deploy.name) > room:
        example = max(folders, key=len)
        raise ConfigError(
            f"--name {deploy.name!r} is too long for this sweep: each run is named NAME-<configuration> "
            f"(e.g. NAME-{example}), at most {LONGEST_NAME} characters; give a --name of at most {room}"
        )
    by_folder = {run.folder(): run for run in reversed(runs)}  # the first run of each folder
    deployments = []
    for folder in folders:
        settings = {**run_settings(sweep, by_folder[folder]), "progress": "plain"}  # plain lines for kubectl logs
        placement = dataclasses.replace(deploy, name=f"{deploy.name}-{folder}")
        run_dir = deploy.run_dir / "runs" / folder
        deployments.append(plan(sweep.workload, placement, settings, sweep=deploy.name, folder=run_dir))
    return deployments


def render_sweep(runs: list[Deployment]) -> list[dict[str, Any]]:
    """The sweep's volume claim, then each run's ConfigMap and training objects."""
    objects = [volume_claim(runs[0])]
    for run in runs:
        objects += [config_map(run), *FLAVOURS[run.deploy.operator].render(run)]
    return objects


def kubernetes_sweep(
    workload: str | None,
    *,
    image: str,
    name: str | None = None,
    preset: str | None = None,
    quick: bool = False,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Render a bench sweep as Kubernetes objects (see :func:`scaletrain.api.deploy_kubernetes_bench`).

    ``settings`` are :class:`DeployConfig` fields (``operator``, ``cpus`` …) and
    :class:`~scaletrain.measure.sweep.SweepConfig` fields (``workers``, ``strategies``,
    ``batch_sizes``, ``steps``, ``repeats`` …); ``None`` counts as not given. ``name`` defaults to
    ``<workload>-bench``. With ``cpus`` and no ``threads_per_worker``, each process gets as many torch
    threads as whole cores.
    """
    given = {key: value for key, value in settings.items() if value is not None}
    if tuple(given.get("frameworks") or ()) == ("scaletrain",):  # the default, said aloud
        del given["frameworks"]
    for key, why in _LOCAL_ONLY.items():
        if key in given:
            flag = "framework" if key == "frameworks" else key.replace("_", "-")  # the flag of SweepConfig.frameworks
            raise ConfigError(f"--{flag} cannot be set for a deployment: {why}; leave it out")
    placement = {f.name for f in fields(DeployConfig)}
    grid = {key: value for key, value in given.items() if key not in placement}
    if "cpus" in given and "threads_per_worker" not in grid:
        grid["threads_per_worker"] = max(1, int(given["cpus"]))
    if preset is not None:
        sweep = dataclasses.replace(preset_config(preset, Path(RUNS_DIR), quick=quick, **grid), max_workers=None)
        if workload is not None and workload != sweep.workload:
            raise ConfigError(f"preset {preset} trains {sweep.workload}, not {workload}")
    elif workload is None:
        raise ConfigError("name a workload (e.g. scaletrain deploy kubernetes-bench lenet) or a --preset")
    elif quick:
        raise ConfigError("--quick shortens a --preset; for a workload use --steps")
    else:
        sweep = SweepConfig(workload=workload, out=Path(RUNS_DIR), **grid)
    deploy = DeployConfig(
        name=name or f"{workload_label(sweep.workload)}-bench",
        image=image,
        **{key: value for key, value in given.items() if key in placement},
    )
    return render_sweep(plan_sweep(dataclasses.replace(sweep, out=Path(deploy.run_dir)), deploy))
