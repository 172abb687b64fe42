"""Your own strategies, techniques, wire codecs and workloads, without editing scaletrain: modules named
in ``SCALETRAIN_PLUGINS`` (comma-separated, importable from ``PYTHONPATH``) are imported by every
entry point of a run — the ``scaletrain`` command, each worker process, each profiling probe, each
sweep run — each module adding its things to the registries with one line
(``STRATEGIES["mine"] = Mine()``, ``TECHNIQUES["mine"] = Mine``, ``CODECS["mine"] = Mine``,
``WORKLOADS["mine"] = Mine``). From Python, import your module yourself and set the variable for the
processes a run starts. See ``docs/extending.md``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping

from scaletrain.errors import ConfigError

__all__ = ["ENV_PLUGINS", "load_plugins"]

ENV_PLUGINS = "SCALETRAIN_PLUGINS"


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
