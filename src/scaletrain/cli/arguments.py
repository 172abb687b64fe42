"""Argument types the subcommands share: comma-separated lists of counts and of names, a workload.

>>> number_list("1,2, 5")
(1, 2, 5)
>>> name_list("allreduce-join, ps-central-async,")
('allreduce-join', 'ps-central-async')
"""

from __future__ import annotations

import argparse

from scaletrain.errors import ConfigError
from scaletrain.workloads import check_workload_name, workload_names

__all__ = ["name_list", "number_list", "workload_argument", "workloads_offered"]


def number_list(text: str) -> tuple[int, ...]:
    """``"1,2,5"`` → ``(1, 2, 5)``; anything else is argparse's one-line error.

    >>> number_list("1,x")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: '1,x' is not a comma-separated list of whole numbers
    """
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers") from None
    if not values:
        raise argparse.ArgumentTypeError("the list is empty")
    return values


def name_list(text: str) -> tuple[str, ...]:
    """``"a, b"`` → ``("a", "b")``: the names, stripped, empty ones left out."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def workload_argument(text: str) -> str:
    """A workload's name or ``module:attribute`` reference; an unknown name is argparse's one-line error.

    >>> workload_argument("lenet")
    'lenet'
    >>> workload_argument("lenett")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: unknown workload 'lenett'; choose one of: lenet, ...
    """
    try:
        return check_workload_name(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def workloads_offered() -> str:
    """The workloads a positional WORKLOAD takes, for its help: the names, then a reference's form."""
    return f"{', '.join(workload_names())}, or module:attribute naming your own (e.g. my_pkg.tasks:make_workload)"
