"""Techniques that change the model, the batch or the precision while training (SPEC §5).

Each technique is one module with pure functions and a thin :class:`~scaletrain.efficient.base.Technique`
adapter; :data:`TECHNIQUES` lists them by name. Adding one = one module + one line here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scaletrain.efficient.base import EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.narrow import Narrow
from scaletrain.efficient.rebatch import Rebatch
from scaletrain.errors import ConfigError

__all__ = ["TECHNIQUES", "EpochEnd", "Reconfiguration", "Technique", "create_technique"]

TECHNIQUES: dict[str, type[Technique]] = {
    "narrow": Narrow,
    "rebatch": Rebatch,
}


def create_technique(name: str, options: dict[str, Any]) -> Technique:
    """The technique ``name`` with its options (strings from the command line are converted).

    >>> create_technique("narrow", {"layer": "fc", "fraction": "0.25"}).fraction
    0.25
    """
    try:
        kind = TECHNIQUES[name]
    except KeyError:
        raise ConfigError(f"unknown technique {name!r}; choose one of {', '.join(sorted(TECHNIQUES))}") from None
    fields = {f.name: f for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else {}
    values = {}
    for key, value in options.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise ConfigError(f"technique {name} has no option {key!r}; its options: {known}")
        values[key] = _converted(name, key, value, type(fields[key].default))
    return kind(**values)


def _converted(name: str, key: str, value: Any, kind: type) -> Any:
    if not isinstance(value, str) or kind is str:
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"technique {name}: option {key} must be a {kind.__name__}, got {value!r}") from None
