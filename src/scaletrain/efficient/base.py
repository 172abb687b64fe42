"""The technique interface: hooks in the order a step runs, and the reconfiguration a technique asks for.

A technique only *decides*; the training loop applies (composer's ``core/event.py`` and
``algorithms/`` show the split). The hooks, in order:

1. :meth:`Technique.prepare_model` — once, on the network as built (surgery that keeps the parameters);
2. :meth:`Technique.start` — once, before the first step (and after a resume), with a :class:`Context`;
3. each step: :meth:`Technique.forward_context` around the forward pass (autocast),
   :meth:`Technique.objective` for the loss to differentiate (add a regulariser here) and
   :meth:`Technique.after_backward` with the gradients in place, before the exchange;
4. :meth:`Technique.after_update` — each optimizer step, on the process that made it (the worker, or the
   parameter server), with the tensors it updated; then :meth:`Technique.after_exchange` on every worker,
   told whether the step was skipped (an overflowed gradient, when :attr:`Technique.skips_nonfinite`);
5. :meth:`Technique.epoch_end` — ``None`` or a :class:`Reconfiguration`, which :meth:`Technique.amend` may
   change (every technique, in order), decided once, agreed by every process and applied at this step
   boundary by every strategy; then :meth:`Technique.reconfigured` with the rebuilt network;
6. :meth:`Technique.state_dict` / :meth:`Technique.load_state_dict` — kept in checkpoints when
   :attr:`Technique.checkpointed`.

One chosen by name (``--technique``, :data:`scaletrain.efficient.TECHNIQUES`) is a dataclass whose fields are
its options (``-T name=value``; :func:`~scaletrain.efficient.settings.option` with a ``flag`` makes one a flag
and an API setting too), checked by :meth:`Technique.check_options`, built by :meth:`Technique.from_options`.
One the run's own settings turn on (:data:`scaletrain.efficient.STANDING`) declares :attr:`Technique.settings`,
:meth:`Technique.check`, :meth:`Technique.from_settings` and :meth:`Technique.summary_fields`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient.settings import Setting, converted, option_fields
from scaletrain.errors import ConfigError

__all__ = ["Context", "EpochEnd", "Reconfiguration", "Stack", "Technique", "stacked"]


@dataclass(frozen=True)
class Reconfiguration:
    """A new architecture and/or batch size, as the loop applies it.

    ``keep`` names modules (``model.get_submodule`` paths) and, per dimension, which of the old
    channels each new channel is made from: ``{"classifier.1": {"out": [0, 1, ...]}, "classifier.3":
    {"in": [0, 1, ...]}}`` keeps those output units of one layer and the matching inputs of the next.
    An index may repeat (a copied channel, for widening). ``remove`` names residual blocks (modules
    with ``residual`` and ``shortcut`` children) whose residual branch goes: each becomes its shortcut
    followed by its activation. ``scale``: per module and dimension of ``keep``, a factor per new
    channel that multiplies its weights and their momentum (Net2WiderNet divides a copied input by its
    copy count). ``noise``: the standard deviation, relative to each layer's weights, of noise added
    to the copies of output channels (a repeated index after its first use), drawn from ``seed`` so
    every process adds the same. ``insert``: new modules by the path they will have (inside an
    ``nn.Sequential``; later siblings move up one), each ``{"kind": "conv"|"linear"|"block",
    "channels": C, "kernel": k, "relu": 0|1}`` (see :mod:`scaletrain.efficient.net2net`); a decision
    inserts, or resizes and removes, not both. ``batch_size``: the new ``--batch-size`` from the next
    step on; ``lr_scale``: the factor on the learning rate that goes with it, reached over
    ``lr_warmup_steps`` updates.

    >>> decision = Reconfiguration(keep={"fc": {"out": [0, 2]}})
    >>> Reconfiguration.from_json(decision.to_json()) == decision
    True
    """

    keep: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    batch_size: int | None = None
    lr_scale: float = 1.0
    remove: list[str] = field(default_factory=list)
    scale: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    noise: float = 0.0
    seed: int = 0
    insert: dict[str, dict[str, int | str]] = field(default_factory=dict)
    lr_warmup_steps: int = 0

    @property
    def changes_network(self) -> bool:
        return bool(self.keep or self.remove or self.insert)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Reconfiguration:
        return cls(**json.loads(text))


@dataclass(frozen=True)
class EpochEnd:
    """What a technique is told when an epoch ends: which one (0-based), the ``--batch-size`` in force,
    and the updates so far."""

    epoch: int
    batch_size: int
    step: int


@dataclass(frozen=True)
class Context:
    """What the loop offers a technique. ``example_inputs()``: a couple of inputs as the model takes
    them; ``mean(name, value, weight)``: the ``weight``-weighted mean of ``value`` over every worker of
    the run, the same number on each (each worker calls it once per ``name``, at the same point; a
    parameter server may call it too, its own value left out); ``computes_loss``: False on a
    parameter server, whose technique sees updates but no loss; ``momentum``: the optimizer's;
    ``step_peak`` and ``batch_share`` for batch adaptation; ``batch_group`` for synchronised batch norm."""

    example_inputs: Callable[[], Any] = lambda: None
    mean: Callable[[str, float, float], float] = lambda name, value, weight: value
    computes_loss: bool = True
    momentum: float = 0.0
    #: ``step_peak(model, rows)``: the peak memory (bytes) of one training step of ``model`` on a batch of
    #: ``rows`` samples in this process (``None`` when it does not fit, or the epoch has no such batch)
    step_peak: Callable[[nn.Module, int], int | None] = lambda model, rows: None
    #: the rows each process trains on per unit of ``--batch-size`` (1; 1/N for a split run of N)
    batch_share: float = 1.0
    #: the epoch (0-based) being trained: a worker's, or on a parameter server the epoch of its updates
    epoch: Callable[[], int] = lambda: 0
    #: the process group of the workers that compute parts of one global batch (a synchronous run of several
    #: workers), for collectives over the batch (``--sync-batchnorm``); ``None`` in one process, or when the
    #: run's settings ask for none
    batch_group: dist.ProcessGroup | None = None


class Technique:
    """Base class: every hook does nothing. Subclass and override what the method needs.

    A subclass chosen with ``--technique`` is a dataclass whose fields are its options, with its rules in
    :meth:`check_options` (a ``__post_init__`` of its own calls ``super().__post_init__()``); one that the
    run's own settings turn on (``--precision``) declares :attr:`settings` and overrides :meth:`check`,
    :meth:`from_settings` and :meth:`summary_fields`.
    """

    name: ClassVar[str]
    #: The flags and API settings of this technique (see :class:`Setting`); for a ``--technique`` choice
    #: they come from its options' ``flag`` (see :meth:`declared_settings`).
    settings: ClassVar[tuple[Setting, ...]] = ()
    #: Whether its state is part of the checkpointed stack. ``False`` for a technique that only shapes how
    #: a step computes (the activations' layout, ghost batches) and keeps no state, so that a checkpoint's
    #: technique state does not depend on it and a run may resume with it changed.
    checkpointed: ClassVar[bool] = True

    @classmethod
    def declared_settings(cls) -> tuple[Setting, ...]:
        """:attr:`settings` and, for a ``--technique`` choice, a setting for each option with a ``flag``."""
        flagged = []
        for f in option_fields(cls).values():
            if f.metadata.get("flag"):
                said = f"{f.metadata.get('help') or 'its ' + f.name} (-T {f.name}; default: {f.default})"
                flagged.append(
                    Setting(f.metadata["flag"], f"--technique {cls.name}: {said}", type(f.default), option=f.name)
                )
        return cls.settings + tuple(flagged)

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        """A technique the run's settings turn on: refuse settings (TrainConfig's fields by name) it cannot
        run with, with a :class:`~scaletrain.errors.ConfigError` naming the fix, without building it."""

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> Technique | None:
        """A technique the run's settings turn on: itself as they ask for it, for workers computing on
        ``device_type`` (``cpu``, ``cuda``), or ``None`` when they do not."""
        return None

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        """What ``summary.json`` says about this technique, given the run's settings and the technique the
        run built (``None`` when they did not ask for it)."""
        return {}

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """A ``--technique`` choice: refuse option values it cannot run with (every option, typed, defaults
        filled in); its dataclass calls this on construction too, so the rules live here once."""

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Technique:
        """A ``--technique`` choice with its options (text from ``-T`` read as each option's type)."""
        return cls(**cls.option_values(options))

    def __post_init__(self) -> None:
        type(self).check_options({name: getattr(self, name) for name in option_fields(type(self))})

    @classmethod
    def option_values(cls, options: Mapping[str, Any]) -> dict[str, Any]:
        """``options`` checked against the option fields, text (from ``-T``) read as each field's type.

        >>> class Halve(Technique):
        ...     name = "halve"
        >>> Halve.option_values({"fraction": "0.5"})
        Traceback (most recent call last):
        scaletrain.errors.ConfigError: technique halve has no option 'fraction'; its options: none
        """
        fields = option_fields(cls)
        values = {}
        for key, value in options.items():
            if key not in fields:
                raise ConfigError(
                    f"technique {cls.name} has no option {key!r}; its options: {', '.join(fields) or 'none'}"
                )
            values[key] = converted(cls.name, key, value, type(fields[key].default))
        return values

    @property
    def skips_nonfinite(self) -> bool:
        """Whether a step whose exchanged gradient overflowed is skipped (loss scaling) instead of applied."""
        return False

    @property
    def loss_scale(self) -> float | None:
        """The dynamic loss scale now, if this technique scales the loss."""
        return None

    def prepare_model(self, model: nn.Module) -> None:
        """Once, on the network as built (every process, before a resumed run's architecture and the
        optimizer): surgery that keeps every parameter and buffer."""

    def start(self, model: nn.Module, context: Context) -> None:
        """Before the first step."""

    def forward_context(self) -> contextlib.AbstractContextManager:
        """Entered around each step's forward pass and loss."""
        return contextlib.nullcontext()

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        """The loss to differentiate this step (``loss`` plus any regulariser)."""
        return loss

    def after_backward(self, model: nn.Module) -> None:
        """Gradients are in ``model``; the exchange has not run yet."""

    def after_update(self, parameters: dict[str, torch.Tensor], lr: float) -> None:
        """An optimizer step with learning rate ``lr`` changed ``parameters`` (named as in
        ``model.named_parameters()``; a sharded server's own tensors only). Runs where the step is taken —
        the worker, or the parameter server — so what it does to the weights reaches every worker."""

    def after_exchange(self, skipped: bool) -> None:
        """Every worker, after each step's exchange: whether the step was skipped (see :attr:`skips_nonfinite`)."""

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        """After epoch ``end.epoch`` (0-based): a reconfiguration to apply now, or ``None``."""
        return None

    def amend(self, decision: Reconfiguration | None, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        """After every technique's :meth:`epoch_end`: the decision as this technique would have it (batch
        adaptation sets the batch that fits the network the decision leaves)."""
        return decision

    def reconfigured(self, model: nn.Module) -> None:
        """The loop applied a reconfiguration: ``model`` is the rebuilt network."""

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""


class Stack(Technique):
    """Several techniques as one (``--precision`` beside ``--technique``): each hook calls every member in
    order, except :meth:`after_backward`, which runs in reverse (the last to change the objective —
    loss scaling — is the first to undo it). At most one member may reconfigure at an epoch's end."""

    name: ClassVar[str] = "stack"

    def __init__(self, members: list[Technique]) -> None:
        self.members = members

    @property
    def skips_nonfinite(self) -> bool:
        return any(member.skips_nonfinite for member in self.members)

    @property
    def loss_scale(self) -> float | None:
        return next((m.loss_scale for m in self.members if m.loss_scale is not None), None)

    def prepare_model(self, model: nn.Module) -> None:
        for member in self.members:
            member.prepare_model(model)

    def start(self, model: nn.Module, context: Context) -> None:
        for member in self.members:
            member.start(model, context)

    def forward_context(self) -> contextlib.AbstractContextManager:
        stack = contextlib.ExitStack()
        for member in self.members:
            stack.enter_context(member.forward_context())
        return stack

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        for member in self.members:
            loss = member.objective(loss, model)
        return loss

    def after_backward(self, model: nn.Module) -> None:
        for member in reversed(self.members):
            member.after_backward(model)

    def after_update(self, parameters: dict[str, torch.Tensor], lr: float) -> None:
        for member in self.members:
            member.after_update(parameters, lr)

    def after_exchange(self, skipped: bool) -> None:
        for member in self.members:
            member.after_exchange(skipped)

    def epoch_end(self, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        decisions = [d for d in (member.epoch_end(end, model) for member in self.members) if d is not None]
        if len(decisions) > 1:
            raise ValueError(f"{len(decisions)} techniques reconfigured the network after the same epoch")
        return decisions[0] if decisions else None

    def amend(self, decision: Reconfiguration | None, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        for member in self.members:
            decision = member.amend(decision, end, model)
        return decision

    def reconfigured(self, model: nn.Module) -> None:
        for member in self.members:
            member.reconfigured(model)

    def state_dict(self) -> dict[str, Any]:
        return {member.name: member.state_dict() for member in self.members}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for member in self.members:
            member.load_state_dict(state.get(member.name, {}))


def stacked(*techniques: Technique | None) -> Technique | None:
    """The techniques given (``None`` left out) as one: none, the one itself, or a :class:`Stack`."""
    members = [t for t in techniques if t is not None]
    if len(members) <= 1:
        return members[0] if members else None
    return Stack(members)
