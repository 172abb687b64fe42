"""The run's optimizer (``--optimizer``, ``-O key=value``): SGD by default, any ``torch.optim`` class by name
(``adamw``, ``adam``, ``rmsprop`` …) or a user's own as ``module:attribute``; built the same way on a worker, a
central server and every owner of a sharded server, so that their steps agree bit for bit.

``--lr`` is every optimizer's rate; ``--momentum`` is given only to a class that takes a ``momentum`` (SGD,
RMSprop); ``--weight-decay`` to one that takes a ``weight_decay`` (otherwise the class's own default holds,
AdamW's 0.01 included). ``-O`` holds the rest (``betas=0.9,0.95``, ``eps=1e-8``, ``nesterov=true``).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import sys
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch
import torch._compile

from scaletrain.errors import ConfigError

__all__ = [
    "build_optimizer",
    "check_optimizer",
    "optimizer_class",
    "optimizer_label",
    "parse_optimizer_options",
    "requested_momentum",
    "set_momentum",
    "state_layout",
]

#: The classes of torch.optim that take parameters and a rate, by the names users type (``adamw``, ``sgd``).
_TORCH = {
    name.lower(): value
    for name, value in vars(torch.optim).items()
    if isinstance(value, type) and issubclass(value, torch.optim.Optimizer) and value is not torch.optim.Optimizer
}
#: Settings the run's own flags give (``-O`` would give them twice).
_FLAGGED = {"lr": "--lr", "momentum": "--momentum"}


def optimizer_class(name: str) -> type[torch.optim.Optimizer]:
    """``adamw`` → :class:`torch.optim.AdamW`; ``pkg.mod:Attr`` → that class.

    >>> optimizer_class("AdamW").__name__, optimizer_class("torch.optim:RMSprop").__name__
    ('AdamW', 'RMSprop')
    """
    if ":" not in name:
        found = _TORCH.get(name.lower())
        if found is None:
            raise ConfigError(
                f"unknown optimizer {name!r}; give a torch.optim class (sgd, adamw, adam, rmsprop, …) or "
                "module:attribute for one of your own"
            )
        return found
    module_name, _, attribute = name.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--optimizer {name}: cannot import it ({exc}); check the module:attribute") from None
    if not (isinstance(found, type) and issubclass(found, torch.optim.Optimizer)):
        raise ConfigError(f"--optimizer {name} is not a torch.optim.Optimizer subclass; give one")
    return found


def parse_optimizer_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``-O`` values as the constructor takes them: text from the command line read as a bool, a number or a
    tuple of numbers (``0.9,0.95``); a list from a config file as a tuple.

    >>> parse_optimizer_options({"betas": "0.9,0.95", "eps": "1e-8", "amsgrad": "true", "foreach": False})
    {'betas': (0.9, 0.95), 'eps': 1e-08, 'amsgrad': True, 'foreach': False}
    """
    return {key: _value(value) for key, value in options.items()}


def _value(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_value(item) for item in value)
    if not isinstance(value, str):
        return value
    text = value.strip()
    if "," in text:
        return tuple(_value(part) for part in text.split(","))
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _takes(kind: type, name: str) -> bool:
    return name in inspect.signature(kind.__init__).parameters


def build_optimizer(
    name: str,
    options: Mapping[str, Any],
    parameters: Iterable[torch.Tensor],
    *,
    lr: float,
    momentum: float | None,
    weight_decay: float,
) -> torch.optim.Optimizer:
    """The optimizer ``name`` over ``parameters``; fused where the class offers it and ``-O`` does not say
    otherwise (one pass per tensor: SGD's step 3x faster than per-op on large tensors here)."""
    kind = optimizer_class(name)
    given = parse_optimizer_options(options)
    settings: dict[str, Any] = {"lr": lr}
    if momentum is not None and _takes(kind, "momentum"):
        settings["momentum"] = momentum
    if weight_decay and _takes(kind, "weight_decay"):
        settings["weight_decay"] = weight_decay
    if _takes(kind, "fused") and not {"fused", "foreach"} & set(given):
        settings["fused"] = True
    return kind(list(parameters), **settings, **given)


def check_optimizer(
    name: str, options: Mapping[str, Any], *, momentum: float | None, weight_decay: float, lr: float | None
) -> None:
    """Refuse, in one line naming the fix, an optimizer that cannot be made or settings it would not read;
    builds it once over a stand-in tensor (nothing of the run's)."""
    kind = optimizer_class(name)
    for key, flag in _FLAGGED.items():
        if key in options:
            raise ConfigError(f"-O {key}=… is {flag}; give it as {flag}")
    if momentum and not _takes(kind, "momentum"):
        raise ConfigError(
            f"--momentum is not a setting of {kind.__name__}"
            + ("; its first-moment rate is -O betas=0.9,0.999" if _takes(kind, "betas") else "")
            + "; drop --momentum"
        )
    if weight_decay and "weight_decay" in options:
        raise ConfigError("--weight-decay and -O weight_decay=… say the same; give one of them")
    if weight_decay and not _takes(kind, "weight_decay"):
        raise ConfigError(f"--weight-decay is not a setting of {kind.__name__}; drop it")
    stand_in = torch.zeros(2, requires_grad=True)
    try:
        with _uncompiled(kind):
            build_optimizer(name, options, [stand_in], lr=lr or 1e-3, momentum=momentum, weight_decay=weight_decay)
    except (TypeError, ValueError, RuntimeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"--optimizer {name} refuses its settings (-O …): {reason}") from None


@contextlib.contextmanager
def _uncompiled(kind: type) -> Iterator[None]:
    """Run ``kind``'s methods that torch keeps torch.compile out of (``add_param_group``, which every constructor
    calls) as written while a stand-in is built: torch's wrapper imports ``torch._dynamo`` on its first call, 1.0 to
    1.3 s here, in the launcher that only checks the settings and never compiles. Afterwards they are torch's again;
    where torch._dynamo is loaded already, or torch wraps them some other way, nothing is changed."""
    plain = []
    if "torch._dynamo" not in sys.modules:
        marker = torch._compile._disable_dynamo(lambda: None).__code__  # the code of every such wrapper
        wrapped = (value for klass in kind.__mro__ for value in vars(klass).values())
        plain = list(
            dict.fromkeys(  # once each, should two classes of the MRO hold the same method
                value.__wrapped__
                for value in wrapped
                if getattr(value, "__code__", None) is marker and not hasattr(value.__wrapped__, "__dynamo_disable")
            )
        )
    for function in plain:
        setattr(function, "__dynamo_disable", function)  # what the wrapper calls once it has one
    try:
        yield
    finally:
        for function in plain:
            delattr(function, "__dynamo_disable")


def optimizer_label(optimizer: torch.optim.Optimizer) -> str:
    """``AdamW`` — the class a run stepped with, for ``summary.json`` and checkpoints."""
    return type(optimizer).__name__


def state_layout(optimizer: torch.optim.Optimizer) -> tuple[list[str], dict[str, torch.dtype]]:
    """What ``optimizer`` keeps for each parameter once it has stepped: the keys of tensors shaped like the
    parameter (SGD's ``momentum_buffer``; Adam's ``exp_avg`` and ``exp_avg_sq``) and of scalar tensors with
    their types (Adam's ``step``); learned from one step of a like optimizer over a stand-in tensor.

    >>> state_layout(torch.optim.AdamW([torch.zeros(1, requires_grad=True)]))
    (['exp_avg', 'exp_avg_sq'], {'step': torch.float32})
    """
    stand_in = torch.zeros(2, requires_grad=True)
    kind = type(optimizer)
    taken = {key: value for key, value in optimizer.defaults.items() if _takes(kind, key)}
    like = kind([stand_in], **taken)
    stand_in.grad = torch.ones(2)
    like.step()
    state = like.state[stand_in]
    whole = [key for key, value in state.items() if torch.is_tensor(value) and value.shape == stand_in.shape]
    scalars = {
        key: value.dtype
        for key, value in state.items()
        if torch.is_tensor(value) and value.shape != stand_in.shape and value.numel() == 1
    }
    return whole, scalars


def requested_momentum(optimizer: torch.optim.Optimizer) -> float:
    """The momentum ``optimizer`` was made with: SGD's ``momentum``, or the first-moment rate (``betas[0]``) of
    Adam and its kin; 0 for one with neither. Asynchronous compensation lowers it (:func:`set_momentum`)."""
    defaults = optimizer.defaults
    if "momentum" in defaults:
        return float(defaults["momentum"])
    return float(defaults["betas"][0]) if "betas" in defaults else 0.0


def set_momentum(group: dict[str, Any], momentum: float) -> None:
    """Use ``momentum`` in a parameter group: SGD's ``momentum``, or the ``betas[0]`` of Adam and its kin."""
    if "momentum" in group:
        group["momentum"] = momentum
    elif "betas" in group:
        group["betas"] = (momentum, *tuple(group["betas"])[1:])
