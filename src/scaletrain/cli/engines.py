"""``scaletrain engines install NAME`` and ``scaletrain engines list``: the foreign frameworks' environments;
``scaletrain engines prepare``: a deployed foreign run's pod makes its program's inputs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from scaletrain.api import install_engine, list_engines
from scaletrain.engines.cluster import prepare_pod
from scaletrain.engines.registry import ENGINES

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "engines",
        help="install or list the foreign engines (TensorFlow, MXNet) that bench --framework compares",
        description=(
            "Each engine lives in a Python environment of its own under the engines folder "
            "(SCALETRAIN_ENGINES, default ~/.cache/scaletrain/engines), with pinned versions."
        ),
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = actions.add_parser("install", help="create an engine's environment (again, if it exists)")
    install.add_argument("names", nargs="+", choices=sorted(ENGINES), metavar="NAME", help=", ".join(ENGINES))
    actions.add_parser("list", help="each engine: installed or not, version, workloads and modes")
    prepare = actions.add_parser(
        "prepare",
        help="a deployed foreign run's pod: write what its program reads (the pods' init container runs this)",
        description="Write spec.json, order.npz, init.npz (tokens.npz for a text) and a copy of the engines' "
        "programs into INTO from the run's settings (engine.json in the ConfigMap of `scaletrain deploy "
        "kubernetes --framework`); the spec's out, where the program writes, is RESULTS. Seeded: every pod "
        "of a run writes the same files.",
    )
    prepare.add_argument("settings", type=Path, metavar="SETTINGS", help="the run's engine.json")
    prepare.add_argument("--into", type=Path, required=True, help="the folder the program reads from")
    prepare.add_argument("--results", type=Path, required=True, help="the folder the program writes to")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "install":
        for name in args.names:
            marker = install_engine(name, progress=lambda line: print(line, file=sys.stderr, flush=True))
            print(f"{name} {marker['version']} installed in {marker['seconds']:.0f} s: {marker['python']}")
        return 0
    if args.action == "prepare":
        spec = prepare_pod(args.settings, args.into, args.results)
        print(f"prepared {spec['workload']} ({spec['mode']}) in {args.into}; the program writes to {spec['out']}")
        return 0
    for row in list_engines():
        state = f"{row['version']} in {row['where']}" if row["installed"] else "not installed"
        print(f"{row['engine']}: {state}; workloads {', '.join(row['workloads'])}; modes {row['modes']}")
    return 0
