"""How a technique declares what a run may set: :class:`Setting` (a flag and API setting, for a technique
the run's own settings turn on a :class:`~scaletrain.config.TrainConfig` field too) and :func:`option` (an
option of a technique chosen with ``--technique``: ``-T name=value``, and a flag if it names one).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from scaletrain.errors import ConfigError

__all__ = ["Setting", "converted", "option", "option_fields"]


@dataclass(frozen=True)
class Setting:
    """A run setting a technique reads, declared once on its class: ``name`` is the API keyword (and, for
    a technique the run's own settings turn on, the :class:`~scaletrain.config.TrainConfig` field and TOML
    key), ``--name-with-dashes`` its flag on ``train`` and ``bench``, with ``help``, ``type`` (how the
    flag's text is read; ``None``: kept as text; ``bool``: a switch that takes no value), ``choices`` and
    ``metavar``. ``option``: for a
    technique chosen with ``--technique``, the option the setting gives (``--lasso-ratio`` is PruneTrain's
    ``ratio``); the setting then goes into ``technique_options``.

    >>> Setting("ghost_batch", "ghost batches of N samples", type=int, metavar="N").flag
    '--ghost-batch'
    """

    name: str
    help: str
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    option: str | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


def option(default: Any, *, help: str = "", flag: str | None = None) -> Any:
    """A technique's option: a dataclass field given as ``-T name=value``; with ``flag``, also a flag and an
    API setting of that name (``option(0.2, flag="lasso_ratio", help=...)``: ``--lasso-ratio``)."""
    return field(default=default, metadata={"help": help, "flag": flag})


def option_fields(kind: type) -> dict[str, dataclasses.Field]:
    """A technique class's options: its dataclass fields given to its constructor."""
    return {f.name: f for f in dataclasses.fields(kind) if f.init} if dataclasses.is_dataclass(kind) else {}


def converted(name: str, key: str, value: Any, kind: type) -> Any:
    if not isinstance(value, str) or kind is str:
        return value
    try:
        return kind(value)
    except ValueError:
        raise ConfigError(f"technique {name}: option {key} must be a {kind.__name__}, got {value!r}") from None
