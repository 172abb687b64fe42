"""Your own strategies, techniques, wire codecs and workloads, without editing scaletrain.

Plug-ins are found the same way by every entry point of a run — the ``scaletrain`` command, each
worker process, each profiling probe, each sweep run, and :func:`scaletrain.train` from Python:

- plug-in modules, imported by :func:`load_plugins`, each adding its things to the registries with one
  line (``STRATEGIES["mine"] = Mine()``, ``TECHNIQUES["mine"] = Mine``, ``CODECS["mine"] = Mine``,
  ``WORKLOADS["mine"] = Mine``): those installed packages declare in the entry-point group
  ``scaletrain.plugins`` (``[project.entry-points."scaletrain.plugins"] name = "pkg.module"``), then
  those named in ``SCALETRAIN_PLUGINS`` (comma-separated, importable from ``PYTHONPATH``);
- workloads an installed package declares in the entry-point group ``scaletrain.workloads``
  (``[project.entry-points."scaletrain.workloads"] name = "pkg.mod:make_workload"``), read by
  :func:`installed_workloads`: the workload registry offers each name and makes it from its
  ``module:attribute`` reference when asked, so a package is imported only when its workload is used.

From Python, :func:`scaletrain.train` (:func:`~scaletrain.parallel.run.make_config`) loads them as the
command does; an installed package needs nothing more. See ``docs/extending.md``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
from collections.abc import Mapping

from scaletrain.errors import ConfigError

__all__ = [
    "ENV_PLUGINS",
    "PLUGIN_ENTRY_POINTS",
    "WORKLOAD_ENTRY_POINTS",
    "installed_plugins",
    "installed_workloads",
    "load_plugins",
]

ENV_PLUGINS = "SCALETRAIN_PLUGINS"
#: The entry-point group in which an installed package names its plug-in modules: name → ``module``.
PLUGIN_ENTRY_POINTS = "scaletrain.plugins"
#: The entry-point group in which an installed package names its workloads: name → ``module:attribute``.
WORKLOAD_ENTRY_POINTS = "scaletrain.workloads"


def load_plugins(environ: Mapping[str, str] | None = None) -> list[str]:
    """Import the plug-in modules of the installed packages, then those ``SCALETRAIN_PLUGINS`` names
    (each once: Python keeps them); their module names.

    >>> load_plugins({"SCALETRAIN_PLUGINS": " json, "})[-1]
    'json'
    """
    imported = []
    for entry in installed_plugins():
        package = entry.dist.name if entry.dist is not None else "an installed package"
        try:
            importlib.import_module(entry.module)
        except Exception as exc:  # the package's own code: any error, in one line
            message = " ".join(str(exc).split())
            raise ConfigError(
                f"{package} declares the scaletrain plug-in {entry.module!r}, whose import failed "
                f"({type(exc).__name__}: {message}); fix or uninstall {package}"
            ) from None
        imported.append(entry.module)
    value = (os.environ if environ is None else environ).get(ENV_PLUGINS, "")
    names = [name.strip() for name in value.split(",") if name.strip()]
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigError(
                f"{ENV_PLUGINS} names {name!r}, which cannot be imported ({exc}); put its folder on PYTHONPATH "
                f"or take it out of {ENV_PLUGINS}"
            ) from None
    return imported + names


@functools.cache
def installed_plugins() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The plug-in modules installed packages declare (group ``scaletrain.plugins``), read once per process.

    >>> isinstance(installed_plugins(), tuple)
    True
    """
    return tuple(importlib.metadata.entry_points(group=PLUGIN_ENTRY_POINTS))


@functools.cache
def installed_workloads() -> dict[str, importlib.metadata.EntryPoint]:
    """The workloads installed packages declare (group ``scaletrain.workloads``): name → entry point.

    Read once per process (the installed packages do not change while it runs); nothing is imported.
    Where two packages declare one name, the first found wins, as Python's own lookup would.

    >>> isinstance(installed_workloads(), dict)
    True
    """
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for entry in importlib.metadata.entry_points(group=WORKLOAD_ENTRY_POINTS):
        found.setdefault(entry.name, entry)
    return found
