"""Argument types the subcommands share: comma-separated lists of counts and of names.

>>> number_list("1,2, 5")
(1, 2, 5)
>>> name_list("allreduce-join, ps-central-async,")
('allreduce-join', 'ps-central-async')
"""

from __future__ import annotations

import argparse

__all__ = ["name_list", "number_list"]


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
