"""Techniques that change the model, the batch or the precision while training (SPEC §5).

Each technique is one module with pure functions and a thin :class:`~scaletrain.efficient.base.Technique`
adapter that declares how a run asks for it, and one line in a registry: :data:`TECHNIQUES` for those
chosen by name (``--technique``), :data:`STANDING` for those the run's own settings turn on
(``--precision``, ``--memory-format``, ``--ghost-batch``, ``--sync-batchnorm``, ``--batch-budget``). Their flags, their
checks, how they are built and stacked, and what ``summary.json`` says about them all come from the
classes (:func:`all_settings`, :func:`check_techniques`, :func:`techniques_for`,
:func:`summary_fields`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scaletrain.efficient.adaptive_batch import AdaptBatch
from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Stack, Technique, stacked
from scaletrain.efficient.channels_last import ChannelsLast
from scaletrain.efficient.ghost import GhostBatch
from scaletrain.efficient.morphnet import MorphNet
from scaletrain.efficient.narrow import Narrow
from scaletrain.efficient.net2net import Net2Net
from scaletrain.efficient.precision import Precision
from scaletrain.efficient.prunetrain import PruneTrain
from scaletrain.efficient.rebatch import Rebatch
from scaletrain.efficient.settings import Setting, option, option_fields
from scaletrain.efficient.sync_batchnorm import SyncBatchStatistics
from scaletrain.errors import ConfigError

__all__ = [
    "STANDING",
    "TECHNIQUES",
    "Context",
    "EpochEnd",
    "Reconfiguration",
    "Setting",
    "Stack",
    "Technique",
    "all_settings",
    "check_techniques",
    "create_technique",
    "option",
    "stacked",
    "summary_fields",
    "technique_flags",
    "techniques_for",
    "with_flagged_options",
]

#: The techniques ``--technique NAME`` chooses from, with ``-T`` options (a plugin adds its own here).
TECHNIQUES: dict[str, type[Technique]] = {
    "morphnet": MorphNet,
    "narrow": Narrow,
    "net2net": Net2Net,
    "prunetrain": PruneTrain,
    "rebatch": Rebatch,
}

#: The techniques a run's own settings turn on (each :class:`Setting` a TrainConfig field and a flag), in
#: the order they are stacked after the ``--technique`` choice. Those that keep no state
#: (:attr:`~Technique.checkpointed` False) form a stack of their own, entered first around each forward
#: pass; of the others, precision comes last: its loss scale covers every objective before it.
STANDING: dict[str, type[Technique]] = {
    "channels_last": ChannelsLast,
    "ghost_batch": GhostBatch,
    "sync_batchnorm": SyncBatchStatistics,
    "adapt-batch": AdaptBatch,
    "precision": Precision,
}


def create_technique(name: str, options: Mapping[str, Any]) -> Technique:
    """The technique ``name`` with its options (strings from the command line are converted).

    >>> create_technique("narrow", {"layer": "fc", "fraction": "0.25"}).fraction
    0.25
    """
    return _chosen(name).from_options(options)


def _chosen(name: str) -> type[Technique]:
    try:
        return TECHNIQUES[name]
    except KeyError:
        raise ConfigError(f"unknown technique {name!r}; choose one of {', '.join(sorted(TECHNIQUES))}") from None


def check_techniques(settings: Mapping[str, Any]) -> None:
    """Refuse run settings (TrainConfig's fields by name) that the ``--technique`` choice or a standing
    technique cannot run with; nothing is built. :class:`~scaletrain.config.TrainConfig` calls it."""
    if settings.get("technique") is None and settings.get("technique_options"):
        given = " ".join(f"-T {key}={value}" for key, value in settings["technique_options"].items())
        raise ConfigError(
            f"technique options ({given}) need the technique they are for; add --technique NAME "
            f"(one of {', '.join(sorted(TECHNIQUES))}) or drop them"
        )
    if settings.get("technique") is not None:
        kind = _chosen(settings["technique"])
        given = kind.option_values(settings.get("technique_options") or {})
        kind.check_options({name: f.default for name, f in option_fields(kind).items()} | given)
    for kind in STANDING.values():
        kind.check(settings)


def techniques_for(settings: Mapping[str, Any], device_type: str = "cpu") -> tuple[Technique | None, Technique | None]:
    """What the run's settings ask for, for workers computing on ``device_type``: the checkpointed stack
    (the ``--technique`` choice, then :data:`STANDING`'s in order) and the stack of those that keep no
    state (the activations' layout, ghost batches), each ``None`` when empty.

    >>> stack, layout = techniques_for({"technique": None, "memory_format": "auto", "ghost_batch": None,
    ...     "batch_budget": None, "precision": "bf16", "loss_scale": None})
    >>> stack.name, layout.name
    ('precision', 'channels_last')
    """
    name, options = settings.get("technique"), settings.get("technique_options") or {}
    chosen = _chosen(name).from_options(options) if name is not None else None
    built = [chosen, *(kind.from_settings(settings, device_type) for kind in STANDING.values())]
    kept = [technique for technique in built if technique is not None]
    return (
        stacked(*(technique for technique in kept if technique.checkpointed)),
        stacked(*(technique for technique in kept if not technique.checkpointed)),
    )


def summary_fields(settings: Mapping[str, Any], device_type: str, *stacks: Technique | None) -> dict[str, Any]:
    """What ``summary.json`` says about the standing techniques, from their classes and the techniques of
    ``stacks`` (those the run built)."""
    members = [m for stack in stacks if stack is not None for m in getattr(stack, "members", [stack])]
    fields: dict[str, Any] = {}
    for kind in STANDING.values():
        built = next((member for member in members if type(member) is kind), None)
        fields.update(kind.summary_fields(settings, device_type, built))
    return fields


def all_settings() -> dict[str, tuple[type[Technique], Setting]]:
    """Every technique's settings by name, as the flags list them: the standing techniques' (TrainConfig
    fields) in stack order, then each ``--technique`` choice's own flags.

    >>> all_settings()["ghost_batch"][1].flag, all_settings()["lasso_ratio"][1].option
    ('--ghost-batch', 'ratio')
    """
    kinds = (*STANDING.values(), *TECHNIQUES.values())
    return {setting.name: (kind, setting) for kind in kinds for setting in kind.declared_settings()}


def technique_flags() -> dict[str, tuple[str, str, type]]:
    """Each ``--technique`` choice's own flags: ``{setting: (technique, option, type)}``, e.g. ``lasso_ratio``
    (``--lasso-ratio``) is PruneTrain's option ``ratio``.

    >>> technique_flags()["reconfigure_every"][:2]
    ('prunetrain', 'every')
    """
    return {
        setting.name: (name, setting.option, setting.type)
        for name, kind in TECHNIQUES.items()
        for setting in kind.declared_settings()
        if setting.option is not None
    }


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
        owner, option_name, _ = flags[key]
        if rest.get("technique") != owner:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} is an option of --technique {owner}; add --technique {owner}")
        options[option_name] = value
    return {**rest, "technique_options": options}
