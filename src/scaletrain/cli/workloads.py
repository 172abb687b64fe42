"""``scaletrain workloads``: the built-in workloads, then those installed packages declare, with their
parameter counts and datasets."""

from __future__ import annotations

import argparse
import json

from scaletrain.api import list_workloads


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("workloads", help="list the workloads: built in, and those installed packages add")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    rows = list_workloads()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'workload':<12} {'parameters':>12}  {'metric':<16} dataset")
    for row in rows:
        print(f"{row['name']:<12} {row['parameters']:>12,}  {row['metric']:<16} {row['dataset']}")
    return 0
