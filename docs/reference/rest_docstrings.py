"""A Griffe extension (mkdocs.yml loads it) that shows our reST-flavoured docstrings as Markdown.

The docstrings are written for ``help()`` and doctest, with reST habits Markdown does not read:

- doctest paragraphs (``>>>`` lines and their output) become ``pycon`` code blocks; Markdown would
  read ``>>>`` as nested quotes and ``['a', 'b']`` in the output as links;
- a literal block (a paragraph ending in ``::``, then an indented block) becomes a code block;
- Sphinx roles (``:class:`Workload```, ``:meth:`Technique.start```) become code that links to the
  object when it is on a page of the site, and stays plain code when it is not, without a warning;
- ``#:`` comments above an attribute (Sphinx's attribute docs) become its docstring.

The source stays as it is: doctest and ``help()`` read the same text they always did.
"""

from __future__ import annotations

import html
import re
import textwrap
from typing import Any

from griffe import Docstring, Extension, GriffeLoader, NameResolutionError, Object

_ROLE = re.compile(r":(?:py:)?(?:attr|class|data|exc|func|meth|mod|obj):`(~?)([^`]+)`")
_DOCTEST_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")


class RestDocstrings(Extension):
    """Rewrite every docstring of the loaded package before mkdocstrings renders it."""

    def on_object(self, *, obj: Object, loader: GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is None and obj.is_attribute and (comment := _comment_above(obj)):
            obj.docstring = Docstring(
                comment, parent=obj, parser=loader.docstring_parser, parser_options=loader.docstring_options
            )
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value, obj)


def markdown_docstring(text: str, obj: Object | None = None) -> str:
    """``text`` with doctest paragraphs and literal blocks fenced, and roles outside them as links."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = _indent(line)
        if line.lstrip().startswith("```"):  # a Markdown fence already: kept as it is
            end = i + 1
            while end < len(lines) and not lines[end].lstrip().startswith("```"):
                end += 1
            out += lines[i : end + 1]
            i = end + 1
        elif line.strip().startswith(">>>"):
            end = i
            while end < len(lines) and lines[end].strip():
                end += 1
            out += _fenced(lines[i:end], " " * indent)
            i = end
        elif line.rstrip().endswith("::") and i + 1 < len(lines) and not lines[i + 1].strip():
            head = line.rstrip()[:-2]
            if head.strip():
                out.append(_linked(head.rstrip() + ("" if head.endswith(" ") else ":"), obj))
            end = i + 1
            while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
                end += 1
            block = textwrap.dedent("\n".join(lines[i + 1 : end])).strip("\n").splitlines()
            out += ["", *_fenced(block, " " * indent), ""]
            i = end
        else:
            out.append(_linked(line, obj))
            i += 1
    return "\n".join(out)


def _comment_above(obj: Object) -> str:
    """The ``#:`` lines right above ``obj``'s first line, without their ``#:``."""
    if obj.lineno is None:
        return ""
    lines = obj.module.lines
    start = obj.lineno - 1
    while start > 0 and lines[start - 1].lstrip().startswith("#:"):
        start -= 1
    return "\n".join(line.lstrip()[2:].strip() for line in lines[start : obj.lineno - 1])


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _fenced(block: list[str], prefix: str) -> list[str]:
    body = textwrap.dedent("\n".join(block)).splitlines()
    language = "pycon" if body and body[0].startswith(">>>") else "python"
    return [f"{prefix}```{language}", *(prefix + _DOCTEST_DIRECTIVE.sub("", line) for line in body), f"{prefix}```"]


def _linked(line: str, obj: Object | None) -> str:
    def replace(match: re.Match[str]) -> str:
        short, name = match.group(1) == "~", match.group(2)
        title = name.rsplit(".", 1)[-1] if short else name
        identifier = _resolved(name, obj)
        return f'<autoref identifier="{html.escape(identifier)}" optional><code>{html.escape(title)}</code></autoref>'

    return _ROLE.sub(replace, line)


def _resolved(name: str, obj: Object | None) -> str:
    """The full path of ``name`` as Python would find it from ``obj`` (``Technique.start`` in
    ``scaletrain.efficient.base`` is ``scaletrain.efficient.base.Technique.start``); ``name`` as given
    when it is a full path already or cannot be found."""
    if obj is None:
        return name
    first, dot, rest = name.partition(".")
    try:
        return obj.resolve(first) + dot + rest
    except NameResolutionError:
        return name
