"""``--help`` that shows every flag's default: argparse formatters for the subcommands.

A flag whose help text already names its default (the word "default") keeps its text as written;
one whose default is not worth saying (None, False, an empty list) gets nothing added.

>>> parser = argparse.ArgumentParser(prog="demo", formatter_class=DefaultsHelpFormatter)
>>> _ = parser.add_argument("--workers", type=int, default=2, help="worker processes")
>>> _ = parser.add_argument("--sizes", default=(1, 2), help="batch sizes")
>>> _ = parser.add_argument("--out", help="output folder (default: runs/NAME)")
>>> text = parser.format_help()
>>> "worker processes (default: 2)" in text, "batch sizes (default: 1,2)" in text, text.count("default") == 3
(True, True, True)
"""

from __future__ import annotations

import argparse
import textwrap
from pathlib import PurePath

__all__ = ["DefaultsHelpFormatter", "RawDescriptionDefaultsHelpFormatter", "shown_default"]


def shown_default(value: object) -> str | None:
    """How a default reads in help text, or None where it says nothing (None, False, empty)."""
    if value is None or value is False or value is argparse.SUPPRESS:
        return None
    if isinstance(value, (list, tuple, set, frozenset)):
        return ",".join(str(item) for item in value) if value else None
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


class DefaultsHelpFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to a flag's help unless the help already says its default.

    Lines break at spaces only, so flag names and file names in the help stay whole.
    """

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or text is argparse.SUPPRESS or not action.option_strings or "default" in text.lower():
            return text
        if isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._VersionAction)):
            return text  # a switch's default is to be off (or, for --no-X, on); saying so adds nothing
        shown = shown_default(action.default)
        if shown is None:
            return text
        return f"{text} (default: {shown.replace('%', '%%')})"


class RawDescriptionDefaultsHelpFormatter(DefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`DefaultsHelpFormatter` that keeps the description's line breaks (lists, paragraphs)."""
