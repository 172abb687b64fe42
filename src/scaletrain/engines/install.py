"""``scaletrain engines install NAME``: each foreign engine in a Python environment of its own.

The environments live in the engines folder (``SCALETRAIN_ENGINES``, default ``~/.cache/scaletrain/engines``),
one venv per engine, with the engine's pinned packages and a ``scaletrain-engine.json`` that says what was
installed. TensorFlow and MXNet cannot share one environment (MXNet 1.9 needs ``numpy<1.24``), and
neither enters scaletrain's own: its programs import nothing of scaletrain.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from scaletrain.engines.base import Engine
from scaletrain.engines.registry import ENGINES
from scaletrain.errors import ConfigError, ScaletrainError

__all__ = ["ENV_ENGINES", "engine_named", "engines_folder", "install", "installed", "python_of", "status"]

ENV_ENGINES = "SCALETRAIN_ENGINES"
MARKER = "scaletrain-engine.json"
INSTALL_TIMEOUT_S = 1800.0
#: what each engine's environment imports to show it works, and prints its version
_CHECK = "import importlib, sys; module = importlib.import_module(sys.argv[1]); print(module.__version__)"


def engines_folder(environ: Mapping[str, str] | None = None) -> Path:
    """Where the engines' environments live.

    >>> engines_folder({"SCALETRAIN_ENGINES": "/opt/engines"})
    PosixPath('/opt/engines')
    """
    env = os.environ if environ is None else environ
    return Path(env[ENV_ENGINES]) if env.get(ENV_ENGINES) else Path.home() / ".cache" / "scaletrain" / "engines"


def engine_named(name: str) -> Engine:
    """The engine called ``name``; a :class:`ConfigError` naming those there are otherwise."""
    if name not in ENGINES:
        raise ConfigError(f"no engine called {name!r}: the engines are {', '.join(ENGINES)}")
    return ENGINES[name]


def python_of(engine: Engine, folder: Path | None = None) -> Path:
    return (folder or engines_folder()) / engine.name / "bin" / "python"


def installed(engine: Engine, folder: Path | None = None) -> dict[str, Any] | None:
    """What ``engine``'s environment holds, or None when it is missing, broken or holds other versions."""
    root = (folder or engines_folder()) / engine.name
    try:
        marker = json.loads((root / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if tuple(marker.get("packages", ())) != engine.packages or not python_of(engine, folder).exists():
        return None
    return marker


def require(engine: Engine, folder: Path | None = None) -> Path:
    """The python of ``engine``'s environment; a :class:`ConfigError` naming the install command when missing."""
    if installed(engine, folder) is None:
        raise ConfigError(
            f"the {engine.name} engine is not installed (looked in {(folder or engines_folder()) / engine.name}): "
            f"run 'scaletrain engines install {engine.name}'"
        )
    return python_of(engine, folder)


def install(
    engine: Engine, folder: Path | None = None, *, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Make ``engine``'s environment afresh (a venv, its pinned packages, a check that it imports); its marker.

    A failed install leaves no environment behind that :func:`installed` would take for a working one.
    """
    say = progress or (lambda line: None)
    root = (folder or engines_folder()) / engine.name
    began = time.monotonic()
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    say(f"creating {root} …")
    _run([sys.executable, "-m", "venv", str(root)], engine, "create its environment")
    python = python_of(engine, folder)
    say(f"installing {' '.join(engine.packages)} …")
    command = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *engine.packages]
    _run(command, engine, "install " + " ".join(engine.packages))
    said = _run([str(python), "-c", _CHECK, engine.module], engine, f"import {engine.module}")
    version = said.strip().splitlines()[-1]
    marker = {
        "engine": engine.name,
        "packages": list(engine.packages),
        "version": version,
        "python": str(python),
        "seconds": round(time.monotonic() - began, 1),
    }
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
    return marker


def status(folder: Path | None = None) -> list[dict[str, Any]]:
    """Each engine: installed or not, its version and where."""
    rows = []
    for engine in ENGINES.values():
        marker = installed(engine, folder)
        rows.append(
            {
                "engine": engine.name,
                "installed": marker is not None,
                "version": marker["version"] if marker else None,
                "packages": list(engine.packages),
                "where": str((folder or engines_folder()) / engine.name),
                "workloads": list(engine.workloads),
                "modes": engine.describe_modes(),
            }
        )
    return rows


def _run(command: list[str], engine: Engine, what: str) -> str:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        limit = f"{INSTALL_TIMEOUT_S:.0f} s"
        raise ScaletrainError(f"could not {what} for the {engine.name} engine within {limit}") from None
    if result.returncode != 0:
        said = [line.strip() for line in result.stderr.splitlines() if line.strip() and "WARNING" not in line]
        offline = any(word in result.stderr for word in ("NewConnectionError", "No matching distribution", "Network"))
        hint = (
            "; the package index cannot be reached or does not have it: install on a machine that reaches it, "
            "or point pip at an index that has it (PIP_INDEX_URL)"
            if offline
            else ""
        )
        raise ScaletrainError(f"could not {what} for the {engine.name} engine: {(said or ['no message'])[-1]}{hint}")
    return result.stdout
