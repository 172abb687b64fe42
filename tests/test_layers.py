"""The house's structure: the import-linter contracts in pyproject.toml hold and catch an upward import,
no module imports its way back to itself (function-level and TYPE_CHECKING imports included), and no
module is over 400 lines as the formatter lays it out (``# fmt: skip`` kept only on data tables)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "scaletrain"
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"
RUFF = Path(sys.executable).parent / "ruff"
MAX_LINES = 400
#: the modules whose ``# fmt: skip`` markers are kept when their lines are counted: each holds a data table the
#: formatter would take apart (one field a line), laid out as rows for reading
DATA_TABLES = {
    # CASES: one Case(...) row per validation case, with the comments that say when each was held out
    "measure/cases.py",
}
FMT_SKIP = re.compile(r"[ \t]*# fmt: skip[ \t]*$", re.MULTILINE)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the repository's contracts over the package under ``root/src`` and the repository's
    benchmarks."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "src"), str(REPO)])}
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_layer_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "importer", "imported"),
    [
        # a function-level import that climbs from config to the API
        (
            "config.py",
            "\n\ndef _planted() -> None:\n    from scaletrain.api import train  # noqa: F401\n",
            "scaletrain.config",
            "scaletrain.api",
        ),
        # a TYPE_CHECKING import that climbs from the leaf to the training loop
        (
            "tensors/flat.py",
            "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from scaletrain.train.loop import Trainer\n",
            "scaletrain.tensors.flat",
            "scaletrain.train.loop",
        ),
        # the package reaching up into the benchmarks, which sit above it
        (
            "api.py",
            "\n\ndef _planted() -> None:\n    from benchmarks.loop_overhead import main  # noqa: F401\n",
            "scaletrain.api",
            "benchmarks.loop_overhead",
        ),
    ],
)
def test_an_upward_import_breaks_the_contract(
    tmp_path: Path, module: str, planted: str, importer: str, imported: str
) -> None:
    copy = tmp_path / "src" / "scaletrain"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text(encoding="utf-8") + planted, encoding="utf-8")
    result = lint_imports(tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
    assert f"{importer} -> {imported}" in result.stdout


def strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.find_modules_directly_imported_by(successor)))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def test_no_module_imports_its_way_back_to_itself() -> None:
    graph = grimp.build_graph("scaletrain", exclude_type_checking_imports=False)
    assert "scaletrain.train.loop" in graph.modules  # the graph is the package's, not an empty one
    assert strongly_connected(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.b", "a.c", "a.d"):
        graph.add_module(module)
    graph.add_import(importer="a.b", imported="a.c")
    graph.add_import(importer="a.c", imported="a.b")
    graph.add_import(importer="a.d", imported="a.b")
    assert strongly_connected(graph) == [["a.b", "a.c"]]


def test_no_module_is_over_400_lines(tmp_path: Path) -> None:
    copy = tmp_path / "scaletrain"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert {name for name in DATA_TABLES if not (copy / name).is_file()} == set()  # the allowlist names real modules
    for path in copy.rglob("*.py"):
        if path.relative_to(copy).as_posix() not in DATA_TABLES:
            path.write_text(FMT_SKIP.sub("", path.read_text(encoding="utf-8")), encoding="utf-8")
    result = subprocess.run(
        [str(RUFF), "format", "--config", str(REPO / "pyproject.toml"), "--no-cache", "--quiet", str(copy)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    sizes = {
        path.relative_to(tmp_path): len(path.read_text(encoding="utf-8").splitlines()) for path in copy.rglob("*.py")
    }
    assert len(sizes) > 50
    assert {str(path): lines for path, lines in sizes.items() if lines > MAX_LINES} == {}
