"""The public Python API; the ``scaletrain`` command only parses flags and calls these.

Train a built-in workload::

    >>> import scaletrain
    >>> summary = scaletrain.train("lenet", steps=100, out="runs/demo")  # doctest: +SKIP
    >>> round(summary["test_accuracy"], 2)  # doctest: +SKIP
    0.71

Train your own model on your own tensors with the same loop, metrics and output files::

    >>> import torch
    >>> from torch import nn
    >>> from scaletrain import ClassificationWorkload
    >>> x, y = torch.randn(256, 8), torch.randint(0, 2, (256,))
    >>> mine = ClassificationWorkload.from_tensors("mine", lambda: nn.Linear(8, 2), train=(x, y), test=(x, y))
    >>> summary = scaletrain.train(mine, epochs=1, out="runs/mine")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from scaletrain.engines.install import engine_named, install
from scaletrain.engines.install import status as list_engines
from scaletrain.errors import ConfigError
from scaletrain.estimate.intervals import speedup_range
from scaletrain.estimate.models import Configuration, predicted_speedups
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.recommend import recommend as _recommend
from scaletrain.measure.bench import compare_results, preset_config, run_bench
from scaletrain.measure.cases import run_cases as validate_cases
from scaletrain.measure.profile import ProfileConfig, run_profile
from scaletrain.measure.sweep import SweepConfig
from scaletrain.measure.validate import ValidationConfig, run_validation
from scaletrain.parallel.process import layout_of
from scaletrain.parallel.rendezvous import ENV_RANK
from scaletrain.parallel.run import make_config, run_training
from scaletrain.parallel.teardown import exit_now as _exit_now
from scaletrain.train.checkpoint import check_writable
from scaletrain.train.saved import load_model, run_summary
from scaletrain.workloads import Workload, create_workload, workload_label, workload_names

__all__ = [
    "bench",
    "compare",
    "deploy_kubernetes",
    "deploy_kubernetes_bench",
    "estimate",
    "estimate_range",
    "exit_now",
    "install_engine",
    "list_engines",
    "list_workloads",
    "load_model",
    "make_config",
    "profile",
    "recommend",
    "runs_alone",
    "strategy_spec",
    "train",
    "validate",
    "validate_cases",
]


def train(workload: str | Workload | None, *, config_file: Path | None = None, **settings: Any) -> dict[str, Any]:
    """Train a workload; return ``summary.json``'s content.

    ``workload``: a registered name, the name of a workload an installed package declares, a
    ``module:attribute`` reference (``"my_pkg.tasks:make_workload"``: a Workload subclass, a function
    returning a workload, or a workload object), a :class:`Workload` object, or None for ``config_file``'s
    ``workload`` key (a workload named here wins over the file's). ``settings`` are
    :class:`TrainConfig` fields (``epochs``, ``steps``, ``batch_size``, ``lr``, ``out``, ``options``,
    ``workers``, ``strategy``, ``server``, ``sync`` ...). With more than one process the run is
    distributed: started here on 127.0.0.1 (``workers=N``), or joined as one process of a job started
    elsewhere (``nodefile`` + ``index``, or the torchrun variables); then only rank 0 gets the summary.
    ``min_workers=M`` (all-reduce only) lets the run go on without a lost worker while M remain, and admits
    workers started later with ``join=True`` (the run's settings and ``out``) up to ``max_workers``; the summary's
    ``membership`` lists the changes (:mod:`scaletrain.parallel.strategies.elastic`). A joining worker gets its
    rank, the folder and ``joined`` (the step it joined after).

    The processes started here get an object as what makes it again: its import reference when
    :func:`create_workload` made it from one, otherwise the object pickled (cloudpickle: a class defined
    in a notebook or a script's ``__main__`` works), its tensors shared through a memory-mapped file.

    >>> summary = scaletrain.train(mine, workers=2, epochs=1, out="runs/mine")  # doctest: +SKIP
    >>> summary = scaletrain.train("my_pkg.tasks:make_workload", workers=2, out="runs/tasks")  # doctest: +SKIP
    """
    own = workload if isinstance(workload, Workload) else None
    if own is None:
        return run_training(make_config(workload, config_file=config_file, **settings))
    name = own.name
    if own.origin is not None:  # made by create_workload: the same name and options make it again
        given = settings.get("options")
        if given is not None and dict(given) != own.origin.options:
            raise ConfigError(
                f"options= does not change a workload object ({own.origin.reference} was made with "
                f"{own.origin.options or 'no options'}); make it with scaletrain.create_workload("
                f"{own.origin.reference!r}, options) or pass the name instead of the object"
            )
        name, settings = own.origin.reference, {**settings, "options": own.origin.options}
    return run_training(make_config(name, config_file=config_file, **settings), own)


def runs_alone(workload: str | Workload | None, *, config_file: Path | None = None, **settings: Any) -> bool:
    """Whether :func:`train` with these arguments is one process started here: no other worker or server,
    no run to join, no other launcher's process group (whose launcher watches its processes).

    >>> runs_alone("lenet"), runs_alone("lenet", workers=2)
    (True, False)
    """
    if isinstance(workload, Workload):
        workload = workload.origin.reference if workload.origin is not None else workload.name
    config = make_config(workload, config_file=config_file, **settings)
    alone = layout_of(config).world_size == 1 and not config.join and config.nodefile is None
    return alone and ENV_RANK not in os.environ


def exit_now(code: int = 0) -> None:
    """End this process at once, after :func:`train` in a process of a job started elsewhere.

    A process that was one of a process group (torchrun, a node file) can abort at interpreter exit
    when c10d/gloo's background threads are torn down after the work is done; every output file is
    closed by then, so this flushes stdout and stderr and leaves without that teardown.

    >>> summary = scaletrain.train("lenet", nodefile="nodes.txt", index=1, out="runs/job")  # doctest: +SKIP
    >>> scaletrain.exit_now(0)  # doctest: +SKIP
    """
    _exit_now(code)


def bench(
    workload: str | None = None,
    *,
    preset: str | None = None,
    quick: bool = False,
    out: Path | None = None,
    progress: Callable[[str], None] | None = None,
    **sweep: Any,
) -> dict[str, Any]:
    """Sweep workers × strategies × batch sizes with real runs; write results, pictures and report.md.

    ``sweep`` holds :class:`~scaletrain.measure.sweep.SweepConfig` fields (``workers``,
    ``strategies``, ``batch_sizes``, ``steps``, ``repeats``, ``network`` …); ``None`` values count as
    not given. ``progress`` (e.g. ``print``) receives a line as each run starts and ends. Returns the
    rows, notes, the paths written, the reading and the table of medians as text.

    >>> result = bench("lenet", workers=(1, 2), strategies=("allreduce-join",), steps=50)  # doctest: +SKIP
    >>> result["report"]  # doctest: +SKIP
    PosixPath('bench-results/lenet-…/report.md')
    """
    given = {key: value for key, value in sweep.items() if value is not None}
    name = preset or workload
    if name is None:
        raise ConfigError("name a workload or a preset")
    out = out or Path("bench-results") / f"{workload_label(name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    if preset is not None:
        config = preset_config(preset, out, quick=quick, **given)
        if workload is not None and workload != config.workload:
            raise ConfigError(f"preset {preset} trains {config.workload}, not {workload}")
        return run_bench(config, title=f"Scaling of {config.workload} ({preset})", progress=progress)
    return run_bench(SweepConfig(workload=workload, out=out, **given), progress=progress)


def compare(sources: list[Path], *, out: Path, names: list[str] | None = None) -> dict[str, Any]:
    """Overlay two or more bench result sets in the same pictures and one report."""
    return compare_results([Path(source) for source in sources], Path(out), names=names)


def install_engine(name: str, *, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Install a foreign engine (``tensorflow``, ``mxnet``) in an environment of its own; what it holds."""
    return install(engine_named(name), progress=progress)


def list_workloads() -> list[dict[str, Any]]:
    """Name, dataset, metric and parameter count of every registered workload, then of every workload an
    installed package declares (entry-point group ``scaletrain.workloads``).

    >>> [w["name"] for w in list_workloads()]  # doctest: +NORMALIZE_WHITESPACE
    ['lenet', 'ptb-lstm', 'vgg16e', 'googlenet', 'squeezenet', 'resnet34', 'resnet', 'resnet20', 'resnet32',
     'resnet56', 'gpt']
    """
    return [create_workload(name).describe() for name in workload_names()]


def profile(
    workload: str, *, out: Path | None = None, architecture_of: Path | str | None = None, **settings: Any
) -> Profile:
    """Measure t_grad, t_comm and the refined model's inputs for a workload; write JSON to ``out`` if given.

    ``settings`` are :class:`~scaletrain.measure.profile.ProfileConfig` fields (``batch_size``,
    ``network``, ``split_workers``, ``options`` …); ``None`` values count as not given.
    ``architecture_of``: a finished run's folder; the network it left (pruned channels, removed blocks)
    is profiled instead of the workload's own, with the run's workload options (``options`` given here
    win) — what the estimator then predicts is what that network would scale to.

    >>> measured = scaletrain.profile("lenet", batch_size=512, split_workers=(2,))  # doctest: +SKIP
    >>> measured.t_grad, measured.t_comm  # doctest: +SKIP
    (0.159, 0.00069)
    >>> pruned = scaletrain.profile("resnet20", architecture_of="runs/resnet20-prunetrain")  # doctest: +SKIP
    """
    given = {key: value for key, value in settings.items() if value is not None}
    if architecture_of is not None:
        summary = run_summary(Path(architecture_of))
        if workload not in (summary.get("workload"), summary.get("reference")):
            trained = summary.get("reference") or summary.get("workload")
            raise ConfigError(
                f"{architecture_of} is a run of {trained!r}, not {workload!r}; profile {trained} or give another run"
            )
        given["options"] = {**(summary.get("options") or {}), **given.get("options", {})}
        given["architecture"] = summary.get("architecture") or {}
    config = ProfileConfig(workload, **given)
    if out is not None:  # before minutes of measuring, not after
        check_writable(Path(out).parent, what="the profile's folder")
    return run_profile(config, out=out)


def estimate(
    *,
    t_grad: float | None = None,
    t_comm: float | None = None,
    profile: Profile | None = None,
    kind: str | None = None,
    server: str | None = None,
    strategy: str = "ps",
    workers: int = 1,
    batches: float = 128,
    case: str = "mean",
    model: str = "thesis",
    cores: int | None = None,
    plot: Path | None = None,
    async_batches: str | None = None,
    strategy_options: Mapping[str, Any] | None = None,
) -> list[float]:
    """Predicted speedups for 1..``workers`` workers (Šlampa's ``estimate.py`` interface).

    Give ``t_grad`` and ``t_comm`` (seconds), or a measured ``profile`` (which the refined model
    uses in full). ``strategy``: a whole spec (``ps-central-join``, ``allreduce-split`` …), or a
    strategy's name (``ps``, ``allreduce``) with the thesis's ``kind`` (async, sync-join — the
    default —, sync-split) and ``server`` (central — the default —, distributed = sharded); see
    :func:`strategy_spec`. ``plot``: also draw the curve into this PNG. ``strategy_options``: the strategy's own
    options its prediction reads (``{"sync_every": 16}`` for diloco; its defaults for the rest).

    >>> [round(s, 3) for s in estimate(t_grad=0.758, t_comm=0.033, server="distributed", workers=3)]
    [1.0, 1.917, 2.835]
    >>> [round(s, 3) for s in estimate(t_grad=0.758, t_comm=0.033, strategy="ps-sharded-join", workers=3)]
    [1.0, 1.917, 2.835]
    """
    # async: training's default (split) for a measured profile; the thesis's Downpour (share) for given times
    async_batches = async_batches or ("share" if profile is None else "split")
    configuration = replace(Configuration.from_flags(strategy, kind, server), async_batches=async_batches)
    configuration = configuration.with_options(strategy_options or {})
    if profile is None:
        if t_grad is None or t_comm is None:
            raise ConfigError("give --t-grad and --t-comm, a --profile file, or a workload to profile")
        profile = Profile(workload="(given times)", batch_size=0, t_grad=t_grad, t_comm=t_comm)
    curves = predicted_speedups(model, profile, [configuration], workers, batches=batches, cores=cores, case=case)
    speedups = curves[configuration]
    if plot is not None:
        from scaletrain.estimate.plots import plot_curves  # matplotlib only when drawing

        plot_curves(
            Path(plot),
            labels=[configuration.label],
            max_workers=workers,
            predict=lambda _model, _label, n: speedups[n - 1],
            models=(model,),
            title=f"Predicted speedup ({model} model, {case} case, D = {batches:g})",
        )
    return speedups


def estimate_range(
    profile: Profile,
    *,
    strategy: str = "ps",
    workers: int = 1,
    batches: float = 128,
    cores: int | None = None,
    async_batches: str = "split",
    strategy_options: Mapping[str, Any] | None = None,
) -> tuple[float, float, float] | None:
    """The refined model's (low, point, high) speedup on ``workers`` workers from a measured ``profile``; None where
    it measured no spread (see :mod:`scaletrain.estimate.intervals`). ``strategy`` etc. as :func:`estimate` takes them.

    >>> toy = Profile("toy", 32, t_grad=0.1, t_comm=0.01, samples={"t_grad": [0.09, 0.1, 0.11], "launches": 3})
    >>> [round(s, 3) for s in estimate_range(toy, strategy="allreduce-join", workers=2)]
    [1.403, 1.818, 2.329]
    """
    configuration = replace(Configuration.from_flags(strategy), async_batches=async_batches)
    configuration = configuration.with_options(strategy_options or {})
    return speedup_range(profile, configuration, workers, batches=batches, cores=cores)


def strategy_spec(strategy: str = "ps", *, kind: str | None = None, server: str | None = None) -> str:
    """The configuration to predict as a strategy spec: ``strategy`` with the thesis's ``kind`` and ``server``.

    ``strategy`` is a spec (which sets all three, so a ``kind`` or ``server`` that says otherwise is
    an error naming the fix) or a name (``kind`` default sync-join, ``server`` default central).

    >>> strategy_spec("ps", kind="async", server="distributed")
    'ps-sharded-async'
    >>> strategy_spec("allreduce-split")
    'allreduce-split'
    """
    return Configuration.from_flags(strategy, kind, server).label


def recommend(profile: Profile, *, max_workers: int, **settings: Any) -> dict[str, dict[str, Any]]:
    """Best worker count, strategy, server and sync mode with the predicted speedup, under each model.

    >>> advice = recommend(Profile("toy", 32, t_grad=0.758, t_comm=0.033), max_workers=8)
    >>> advice["thesis"]["workers"], advice["thesis"]["configuration"]
    (8, 'ps-sharded-join')
    """
    return _recommend(profile, max_workers=max_workers, **settings)


def validate(workload: str, *, out: Path, **settings: Any) -> dict[str, Any]:
    """Profile, predict with both models, run the real sweep and compare (see :mod:`scaletrain.measure.validate`).

    ``settings`` are :class:`~scaletrain.measure.validate.ValidationConfig` fields (``workers``,
    ``strategies``, ``batch_size``, ``steps``, ``repeats``, ``network`` …).
    """
    given = {key: value for key, value in settings.items() if value is not None}
    return run_validation(ValidationConfig(workload, Path(out), **given))


def deploy_kubernetes(
    workload: str,
    *,
    image: str,
    out: Path | None = None,
    config_file: Path | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """Kubernetes objects that run a training run on a cluster; written to ``out`` as a Kustomize base if given.

    ``settings`` are the cluster settings of :class:`scaletrain.deploy.DeployConfig` (``operator``:
    ``none`` for an Indexed Job, ``kubeflow``, ``jobset``, ``trainer`` for a Kubeflow Trainer v2 TrainJob;
    ``min_workers``/``max_workers`` for an elastic PyTorchJob; ``name``, ``cpus``, ``memory``, ``gpus``,
    ``namespace`` …) and :class:`TrainConfig` fields (``workers``, ``strategy``, ``steps`` …);
    ``None`` values count as not given. See :mod:`scaletrain.deploy`.

    >>> objects = deploy_kubernetes("lenet", image="scaletrain:cpu", workers=2, operator="jobset")
    >>> [obj["kind"] for obj in objects]
    ['PersistentVolumeClaim', 'ConfigMap', 'JobSet', 'Deployment', 'Service']
    """
    from scaletrain.deploy import kubernetes, write_folder

    objects = kubernetes(workload, image=image, config_file=config_file, **settings)
    if out is not None:
        write_folder(objects, Path(out))
    return objects


def deploy_kubernetes_bench(
    workload: str | None = None,
    *,
    image: str,
    preset: str | None = None,
    quick: bool = False,
    out: Path | None = None,
    **settings: Any,
) -> list[dict[str, Any]]:
    """A :func:`bench` sweep as Kubernetes objects, one run per configuration; written to ``out`` if given.

    ``settings`` are the sweep's :class:`~scaletrain.measure.sweep.SweepConfig` fields (``workers``,
    ``strategies``, ``batch_sizes``, ``steps``, ``repeats`` …) and the cluster settings of
    :class:`scaletrain.deploy.DeployConfig` (``name``, default ``<workload>-bench``; ``operator``,
    ``cpus`` …); ``None`` values count as not given. Every run shares the volume claim
    ``<name>-runs`` and trains in ``/runs/<name>/runs/<configuration>``. See :mod:`scaletrain.deploy.sweep`.

    >>> objects = deploy_kubernetes_bench("lenet", image="scaletrain:cpu", workers=(1, 2),
    ...                                   strategies=("allreduce-join", "ps-central-async"), batch_sizes=(64,))
    >>> for obj in objects:
    ...     if obj["kind"] == "Job":
    ...         print(obj["metadata"]["name"])
    lenet-bench-allreduce-join-b64-w1-r0
    lenet-bench-allreduce-join-b64-w2-r0
    lenet-bench-ps-central-async-b64-w1-r0
    lenet-bench-ps-central-async-b64-w2-r0
    """
    from scaletrain.deploy import write_folder
    from scaletrain.deploy.sweep import kubernetes_sweep

    objects = kubernetes_sweep(workload, image=image, preset=preset, quick=quick, **settings)
    if out is not None:
        write_folder(objects, Path(out))
    return objects
