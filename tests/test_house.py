"""House rules a reader of the code relies on: module docstrings say what and why in a few lines (no more than
25), neither the code nor the pages a user reads name a project issue (history lives in the commits and results/),
docs/ holds pages and the measurements live in results/, no function takes its trainer as ``Any``, and nothing
outside the strategy registry compares a strategy's name: it asks the strategy's capabilities instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from scaletrain.parallel.strategies import STRATEGIES, all_specs

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "scaletrain"
REGISTRY = PACKAGE / "parallel" / "strategies"
MAX_DOCSTRING_LINES = 25


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_docstring_is_longer_than_25_lines() -> None:
    long = {}
    for path in modules():
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False) or ""
        if len(docstring.splitlines()) > MAX_DOCSTRING_LINES:
            long[str(path.relative_to(PACKAGE))] = len(docstring.splitlines())
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines (move the rest to docs/): {long}"


def test_the_docs_hold_pages_and_no_measured_results() -> None:
    """Measurements live in results/ (dated folders the pages name); docs/ is what a user reads."""
    others = [
        str(path.relative_to(REPO))
        for path in (REPO / "docs").rglob("*")
        if path.is_file() and path.suffix != ".md" and path.parent != REPO / "docs" / "reference"
    ]
    assert not others, others
    assert (REPO / "results" / "validation").is_dir()


def test_the_code_names_no_issue_of_this_project() -> None:
    # another project's issue is cited with its name and '#' (oneDNN issue #6035), which this does not match
    named = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in modules()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bissues? \d", line, re.IGNORECASE)
    ]
    assert not named, named


def test_the_pages_name_no_issue_of_this_project() -> None:
    """A reader of docs/ and README.md never saw our issues: a page says the goal or the change itself."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    pattern = re.compile(r"\b(issues? \d|stop \d|the issue\b)", re.IGNORECASE)
    named = [
        f"{path.relative_to(REPO)}:{number}"
        for path in pages
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if pattern.search(line)
    ]
    assert not named, named


def test_no_function_takes_an_undeclared_trainer() -> None:
    """An object's methods stay on it, or the interface they need is declared (a Protocol), never ``Any``."""
    loose = [str(path.relative_to(PACKAGE)) for path in modules() if "trainer: Any" in path.read_text(encoding="utf-8")]
    assert not loose, loose


def _compared_names(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, text) of each comparison of a string that is a strategy's name or spec."""
    names = set(STRATEGIES) | set(all_specs())
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for operand in [node.left, *node.comparators]:
            items = operand.elts if isinstance(operand, ast.Tuple | ast.List | ast.Set) else [operand]
            literals = [item.value for item in items if isinstance(item, ast.Constant)]
            other = [o for o in [node.left, *node.comparators] if o is not operand]
            # a foreign engine's mode ("local", "sync", "async") is the engine's word, not a strategy's name
            about_strategy = any(
                re.search(r"strateg|spec|label", t) and "mode" not in t for t in map(ast.unparse, other)
            )
            if about_strategy and any(value in names for value in literals):
                found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_strategy_name_is_compared_outside_the_strategy_registry() -> None:
    compared = {
        f"{path.relative_to(PACKAGE)}:{line}": text
        for path in modules()
        if REGISTRY not in path.parents
        for line, text in _compared_names(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert not compared, f"ask the strategy (its capability flags), not its name: {compared}"


def test_the_comparison_check_catches_one() -> None:
    planted = ast.parse('if config.strategy not in ("allreduce", "local"):\n    pass\nif mode == "local":\n    pass\n')
    assert [line for line, _ in _compared_names(planted)] == [1]
