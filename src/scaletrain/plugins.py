"""Your own strategies, techniques, wire codecs and workloads, without editing scaletrain.

Two kinds of plug-in, found the same way by every entry point of a run — the ``scaletrain`` command,
each worker process, each profiling probe, each sweep run:

- modules named in ``SCALETRAIN_PLUGINS`` (comma-separated, importable from ``PYTHONPATH``), imported by
  :func:`load_plugins`, each adding its things to the registries with one line
  (``STRATEGIES["mine"] = Mine()``, ``TECHNIQUES["mine"] = Mine``, ``CODECS["mine"] = Mine``,
  ``WORKLOADS["mine"] = Mine``);
- workloads an installed package declares in the entry-point group ``scaletrain.workloads``
  (``[project.entry-points."scaletrain.workloads"] name = "pkg.mod:make_workload"``), read by
  :func:`installed_workloads`: the workload registry offers each name and makes it from its
  ``module:attribute`` reference when asked, so a package is imported only when its workload is used.

From Python, import your module yourself and set the variable for the processes a run starts; an
installed package needs nothing. See ``docs/extending.md``.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import os
from collections.abc import Mapping

from scaletrain.errors import ConfigError

__all__ = ["ENV_PLUGINS", "WORKLOAD_ENTRY_POINTS", "installed_workloads", "load_plugins"]

ENV_PLUGINS = "SCALETRAIN_PLUGINS"
#: The entry-point group in which an installed package names its workloads: name → ``module:attribute``.
WORKLOAD_ENTRY_POINTS = "scaletrain.workloads"


def load_plugins(environ: Mapping[str, str] | None = None) -> list[str]:
    """Import the modules ``SCALETRAIN_PLUGINS`` names (once each: Python keeps them); their names.

    >>> load_plugins({"SCALETRAIN_PLUGINS": " json, "})
    ['json']
    """
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
    return names


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
