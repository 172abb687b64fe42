"""``scaletrain compare RESULTS_A RESULTS_B …``: overlay result sets in the same pictures."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.api import compare

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "compare", help="overlay two or more bench result sets (e.g. two networks or two machines)"
    )
    parser.add_argument("results", nargs="+", type=Path, help="bench output folders or results.jsonl/.csv files")
    parser.add_argument("--names", help="comma-separated names for the sets (default: folder names)")
    parser.add_argument("--out", type=Path, default=Path("bench-results/compare"), help="output folder")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    names = [name.strip() for name in args.names.split(",")] if args.names else None
    result = compare(args.results, out=args.out, names=names)
    print(f"report: {result['report']}")
    return 0
