"""The ``scaletrain`` command: a small dispatcher over one module per subcommand.

Every subcommand module has ``add_parser(subparsers)`` and ``run(args) -> int``; errors the user
can fix (:class:`~scaletrain.errors.ScaletrainError`) become one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
import tempfile
import tomllib
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from scaletrain.cli import bench, compare, deploy, engines, estimate, profile, train, workloads
from scaletrain.cli.formatter import DefaultsHelpFormatter
from scaletrain.cli.supervise import log_faults, supervised
from scaletrain.errors import Interrupted, ScaletrainError
from scaletrain.plugins import load_plugins

__all__ = ["console", "main"]

SUBCOMMANDS = (train, workloads, bench, compare, profile, estimate, deploy, engines)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="scaletrain",
        description="Train neural networks on many workers, measure and predict how training scales.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_SubcommandParser)
    for module in SUBCOMMANDS:
        module.add_parser(subparsers)
    return parser


class _OneLineErrors(argparse.ArgumentParser):
    """A parser whose errors are one line that names the fix (argparse would print the usage block first)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


class _SubcommandParser(_OneLineErrors):
    """A subcommand's parser: its ``--help`` shows every flag's default unless it asks for another formatter."""

    def __init__(
        self, *args: Any, formatter_class: type[argparse.HelpFormatter] = DefaultsHelpFormatter, **kwargs: Any
    ) -> None:
        super().__init__(*args, formatter_class=formatter_class, **kwargs)


def package_version() -> str:
    """The installed package's version; from a source checkout that is not installed, pyproject.toml's."""
    try:
        return importlib.metadata.version("scaletrain")
    except importlib.metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        project = tomllib.loads(pyproject.read_text(encoding="utf-8")).get("project", {})
    except (OSError, tomllib.TOMLDecodeError):
        project = {}
    if project.get("name") == "scaletrain" and project.get("version"):
        return f"{project['version']} (source checkout, not installed)"
    return "unknown (not installed; pip install -e . sets it)"


def console() -> int:
    """The ``scaletrain`` command: :func:`main`, with a one-process run watched by this process
    (:mod:`scaletrain.cli.supervise`) unless this process is the watched one."""
    if supervised():
        log_faults()
        return main()
    return main(supervise=True)


def main(argv: Sequence[str] | None = None, *, supervise: bool = False) -> int:
    """Run the command line; returns the exit code. ``supervise``: run a one-process training as a child
    process that this one watches (the ``scaletrain`` command does; a caller in Python gets the run in-process)."""
    try:
        load_plugins()  # before the parser: its choices come from the registries
    except ScaletrainError as exc:
        print(f"scaletrain: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = build_parser().parse_args(argv)
    args.argv, args.supervise = list(sys.argv[1:] if argv is None else argv), supervise
    try:
        return args.handler(args)
    except Interrupted as exc:
        print(f"scaletrain: {exc}", file=sys.stderr)
        return exc.exit_code
    except ScaletrainError as exc:
        where = _save_traceback(exc.details) if exc.details else None  # the user's code failed: its traceback
        print(f"scaletrain: error: {exc}" + (f" (traceback in {where})" if where else ""), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:  # outside a run (a run says what it kept)
        print("scaletrain: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # a file or folder the command could not use, where no check foresaw it
        where = f" {exc.filename}" if exc.filename else ""
        print(
            f"scaletrain: error: cannot use{where}: {exc.strerror or exc}; check the path, its permissions "
            "and the free space, or choose another",
            file=sys.stderr,
        )
        return 2
    except Exception as exc:  # a bug, or a failure nobody foresaw: one line here, the traceback in a file
        where = _save_traceback()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(
            f"scaletrain: internal error: {type(exc).__name__}"
            + (f": {first}" if first else "")
            + (f"; the traceback is in {where}" if where else "")
            + "; please report it with the command you ran",
            file=sys.stderr,
        )
        return 1


def _save_traceback(text: str | None = None) -> str | None:
    """Write ``text``, or the current exception's traceback, to a file in the temporary folder; its path, or None."""
    try:
        handle, path = tempfile.mkstemp(prefix="scaletrain-error-", suffix=".log")
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            if text is None:
                traceback.print_exc(file=file)
            else:
                file.write(text)
    except OSError:
        return None
    return path
