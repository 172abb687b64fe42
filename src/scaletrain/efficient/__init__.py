"""Techniques that change the model, the batch or the precision while training (SPEC §5).

Each technique is one module with pure functions and a thin :class:`~scaletrain.efficient.base.Technique`
adapter; :data:`TECHNIQUES` lists them by name. Adding one = one module + one line here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Stack, Technique, stacked
from scaletrain.efficient.morphnet import MorphNet
from scaletrain.efficient.narrow import Narrow
from scaletrain.efficient.net2net import Net2Net
from scaletrain.efficient.prunetrain import PruneTrain
from scaletrain.efficient.rebatch import Rebatch
from scaletrain.errors import ConfigError

__all__ = [
    "TECHNIQUES",
    "Context",
    "EpochEnd",
    "Reconfiguration",
    "Stack",
    "Technique",
    "create_technique",
    "stacked",
    "technique_flags",
    "with_flagged_options",
]

TECHNIQUES: dict[str, type[Technique]] = {
    "morphnet": MorphNet,
    "narrow": Narrow,
    "net2net": Net2Net,
    "prunetrain": PruneTrain,
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
    fields = {f.name: f for f in dataclasses.fields(kind) if f.init} if dataclasses.is_dataclass(kind) else {}
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


def technique_flags() -> dict[str, tuple[str, str, type]]:
    """Each technique's own flags: ``{setting: (technique, option, type)}``, e.g. ``lasso_ratio``
    (``--lasso-ratio``) is PruneTrain's option ``ratio``.

    >>> technique_flags()["reconfigure_every"][:2]
    ('prunetrain', 'every')
    """
    flags = {}
    for name, kind in TECHNIQUES.items():
        defaults = {f.name: f.default for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else {}
        for setting, option in getattr(kind, "flags", {}).items():
            flags[setting] = (name, option, type(defaults[option]))
    return flags


def with_flagged_options(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with any technique flag (``lasso_ratio=0.3``) moved into ``technique_options``;
    a flag of another technique than ``settings["technique"]`` is an error naming the right one.

    >>> with_flagged_options({"technique": "prunetrain", "lasso_ratio": 0.3})["technique_options"]
    {'ratio': 0.3}
    """
    flags = technique_flags()
    given = {key: value for key, value in settings.items() if key in flags and value is not None}
    if not given:
        return {key: value for key, value in settings.items() if key not in flags}
    rest = {key: value for key, value in settings.items() if key not in flags}
    options = dict(rest.get("technique_options") or {})
    for key, value in given.items():
        owner, option, _ = flags[key]
        if rest.get("technique") != owner:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is an option of --technique {owner}; add --technique {owner}")
        options[option] = value
    return {**rest, "technique_options": options}
