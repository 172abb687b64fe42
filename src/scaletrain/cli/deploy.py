"""``scaletrain deploy kubernetes WORKLOAD [train flags] --workers N --image IMG``: manifests to apply;
``scaletrain deploy kubernetes-bench WORKLOAD [bench flags] --image IMG``: a bench sweep, one run per
configuration. ``deploy kubernetes --framework tensorflow|mxnet``: a foreign engine's run
(:mod:`scaletrain.deploy.engines`).

The training flags are ``scaletrain train``'s own, the sweep's ``scaletrain bench``'s own (their
parsers are the parents of these); ``--out`` here is where the manifests go (a Kustomize base)
instead of the run folder, which is ``/runs/NAME`` on the volume claim. Without ``--out`` the YAML
goes to stdout for ``kubectl apply -f -``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from scaletrain.api import deploy_kubernetes, deploy_kubernetes_bench
from scaletrain.cli import bench, train
from scaletrain.cli.registry_flags import technique_settings
from scaletrain.config import TrainConfig
from scaletrain.deploy.common import OPERATORS, PULL_POLICIES
from scaletrain.deploy.output import to_yaml
from scaletrain.engines.registry import FRAMEWORKS
from scaletrain.errors import ConfigError

__all__ = ["add_parser", "run", "run_bench"]


def _parser_of(command: Any, name: str) -> argparse.ArgumentParser:
    """The parser of ``scaletrain NAME``, to be the parent of a deploy target's parser."""
    holder = argparse.ArgumentParser(add_help=False).add_subparsers()
    command.add_parser(holder)
    return holder.choices[name]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("deploy", help="write manifests that run training on a cluster")
    targets = parser.add_subparsers(dest="target", required=True, metavar="TARGET")
    kube = targets.add_parser(
        "kubernetes",
        parents=[_parser_of(train, "train")],
        conflict_handler="resolve",  # --out names the manifests' folder here
        argument_default=None,
        help="Indexed Job, Kubeflow PyTorchJob, JobSet or Kubeflow Trainer TrainJob, with volume, ConfigMap and "
        "TensorBoard",
        description="Render a training run as Kubernetes objects; the training flags are those of "
        "`scaletrain train`. Apply with `kubectl apply -f -` (stdout) or `kubectl apply -k OUT`. "
        "--operator: none = Indexed Job + headless Service; kubeflow = PyTorchJob (kubeflow.org/v1, the "
        "training operator); jobset = JobSet; trainer = Kubeflow Trainer v2 TrainJob naming the "
        "torch-distributed ClusterTrainingRuntime (its PET_* variables give each pod its rank). "
        "See docs/deployment.md.",
    )
    cluster = _add_cluster_flags(kube, default_name="scaletrain-WORKLOAD")
    cluster.add_argument(
        "--min-workers",
        type=int,
        help="with --operator kubeflow: an elastic PyTorchJob (elasticPolicy minReplicas, torchrun's c10d "
        "rendezvous; pods start under torchrun). scaletrain still trains with exactly --workers: a lost "
        "worker makes torchrun restart every process from the last checkpoint; training on with fewer "
        "(train --min-workers, under scaletrain's own launcher) is not built for pods",
    )
    cluster.add_argument(
        "--max-workers", type=int, help="with --min-workers: the elasticPolicy's maxReplicas (default --workers)"
    )
    cluster.add_argument(
        "--no-tensorboard-deployment",
        dest="tensorboard_deployment",
        action="store_false",
        default=True,
        help="leave out the TensorBoard Deployment and Service",
    )
    foreign = kube.add_argument_group("foreign engine (docs/frameworks.md)")
    foreign.add_argument(
        "--framework",
        metavar="NAME",
        help=f"{', '.join(FRAMEWORKS)} (default scaletrain): tensorflow or mxnet renders that engine's run, one pod "
        "per process (workers; TensorFlow's ps and chief, MXNet's servers and scheduler) in an Indexed Job "
        "(--operator none) or a JobSet (--operator jobset), with --strategy local, allreduce-join, "
        "ps-central-async or ps-sharded-async; the image needs the engine (scripts/build-image.sh, ENGINES)",
    )
    foreign.add_argument(
        "--servers",
        type=int,
        metavar="P",
        help="with --framework: parameter servers of ps-sharded-async (default --workers) or of MXNet's "
        "allreduce-join (dist_sync; default --workers)",
    )
    kube.set_defaults(handler=run)
    sweep = targets.add_parser(
        "kubernetes-bench",
        parents=[_parser_of(bench, "bench")],
        conflict_handler="resolve",
        help="a bench sweep: one training Job (or PyTorchJob, JobSet, TrainJob) per configuration, one shared volume",
        description="Render a `scaletrain bench` sweep as Kubernetes objects: one run per configuration "
        "(strategy, workers, batch size, repeat), each in its own folder /runs/NAME/runs/CONFIGURATION on "
        "one volume claim; the grid flags are those of `scaletrain bench`. Assemble the results afterwards "
        "with `scaletrain bench` on a copy of /runs/NAME (see docs/deployment.md).",
    )
    _add_cluster_flags(sweep, default_name="WORKLOAD-bench")
    for flag in ("--network", "--max-workers"):  # local-only; still parsed, so that giving one says why not
        sweep.add_argument(flag, help=argparse.SUPPRESS)
    sweep.set_defaults(handler=run_bench)


def _add_cluster_flags(parser: argparse.ArgumentParser, *, default_name: str) -> argparse._ArgumentGroup:
    group = parser.add_argument_group("cluster")
    group.add_argument("--image", required=True, help="container image with scaletrain (scripts/build-image.sh)")
    group.add_argument(
        "--operator",
        choices=OPERATORS,
        default="none",
        help="none: Indexed Job (default); kubeflow: PyTorchJob; jobset: JobSet; trainer: Kubeflow Trainer v2 TrainJob",
    )
    group.add_argument("--name", help=f"name of the objects and of the run folder /runs/NAME (default {default_name})")
    group.add_argument(
        "--out", type=Path, help="write one file per object and kustomization.yaml here (default stdout)"
    )
    group.add_argument("--namespace", help="namespace of every object")
    group.add_argument("--service-account", help="service account of the pods")
    group.add_argument("--pull-policy", choices=PULL_POLICIES, help="image pull policy (default IfNotPresent)")
    group.add_argument("--cpus", type=float, help="CPU cores per process (request = limit; sets the torch threads)")
    group.add_argument("--memory", help="memory per process, e.g. 4Gi (request = limit)")
    group.add_argument("--gpus", type=int, help="GPUs per process (nvidia.com/gpu)")
    group.add_argument(
        "--node-selector", action="append", default=[], metavar="KEY=VALUE", help="node label the pods need"
    )
    group.add_argument("--volume-size", help="size of the run folder's volume claim (default 5Gi)")
    group.add_argument("--storage-class", help="storage class of the volume claim")
    group.add_argument("--access-mode", help="volume access mode (default ReadWriteMany: pods on many nodes)")
    group.add_argument("--port", type=int, help="rendezvous port (default 29500; a TrainJob's runtime fixes it)")
    group.add_argument(
        "--max-restarts",
        type=int,
        help="restarts from the last checkpoint before giving up (default 3; a TrainJob's runtime decides its own)",
    )
    return group


def _node_selector(pairs: list[str]) -> dict[str, str]:
    selector = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--node-selector {pair!r} must look like KEY=VALUE, e.g. pool=training")
        selector[key] = value
    return selector


def _placement(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster flags as :class:`~scaletrain.deploy.DeployConfig` fields (``None``: not given)."""
    return {
        "name": args.name,
        "operator": args.operator,
        "namespace": args.namespace,
        "service_account": args.service_account,
        "pull_policy": args.pull_policy,
        "cpus": args.cpus,
        "memory": args.memory,
        "gpus": args.gpus,
        "node_selector": _node_selector(args.node_selector) or None,
        "volume_size": args.volume_size,
        "storage_class": args.storage_class,
        "access_mode": args.access_mode,
        "port": args.port,
        "max_restarts": args.max_restarts,
    }


def _write(objects: list[dict[str, Any]], out: Path | None) -> int:
    if out is None:
        sys.stdout.write(to_yaml(objects))
    else:
        kinds = ", ".join(f"{obj['kind']} {obj['metadata']['name']}" for obj in objects)
        print(f"wrote {kinds} to {out}; apply with: kubectl apply -k {out}")
    return 0


def run(args: argparse.Namespace) -> int:
    # --min-workers and --max-workers here are the PyTorchJob's elastic bounds, not train's (its survivors, --join)
    unread = ("workload", "out", "min_workers", "max_workers", "join")
    training = {f.name: getattr(args, f.name, None) for f in fields(TrainConfig) if f.name not in unread}
    training["options"] = train.workload_options(args) or None
    training.update(technique_settings(args))  # -T options and a technique's own flags, as train takes them
    objects = deploy_kubernetes(
        args.workload,
        image=args.image,
        config_file=args.config,
        out=args.out,
        tensorboard_deployment=args.tensorboard_deployment,
        min_workers=args.min_workers,
        max_workers=args.max_workers,
        framework=args.framework,
        servers=args.servers,
        **_placement(args),
        **training,
    )
    return _write(objects, args.out)


def run_bench(args: argparse.Namespace) -> int:
    objects = deploy_kubernetes_bench(
        args.workload,
        image=args.image,
        preset=args.preset,
        quick=args.quick,
        out=args.out,
        **_placement(args),
        **bench.sweep_settings(args),
    )
    return _write(objects, args.out)
