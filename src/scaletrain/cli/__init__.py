"""The ``scaletrain`` command: a small dispatcher over one module per subcommand.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``; errors the user
can fix (:class:`~scaletrain.errors.ScaletrainError`) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from scaletrain.cli import bench, compare, deploy, estimate, profile, train, workloads
from scaletrain.errors import Interrupted, ScaletrainError

__all__ = ["main"]

SUBCOMMANDS = (train, workloads, bench, compare, profile, estimate, deploy)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scaletrain",
        description="Train neural networks on many workers, measure and predict how training scales.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except Interrupted as exc:
        print(f"scaletrain: {exc}", file=sys.stderr)
        return exc.exit_code
    except ScaletrainError as exc:
        print(f"scaletrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # outside a run (a run says what it kept)
        print("scaletrain: interrupted", file=sys.stderr)
        return 130
