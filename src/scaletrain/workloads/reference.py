"""Workloads named by import reference, ``module:attribute``, as uvicorn and gunicorn take ``module:app``.

``scaletrain train my_pkg.tasks:make_workload`` trains what ``make_workload`` returns. Only the string
travels: every process of a run (the local launcher's, torchrun's, a sweep's, the profiler's probes, a
cluster's pods) imports the reference itself. The attribute (dotted for a nested one) may be

- a :class:`~scaletrain.workloads.base.Workload` subclass: called with the workload options, as a
  registered workload is;
- a function, or any callable, returning a workload: called with the options when it takes one
  argument, with nothing when it takes none;
- a workload object: used as it is (it takes no options).

The module is found on ``PYTHONPATH`` (or installed), as ``python -c 'import my_pkg.tasks'`` finds it.
Whatever is wrong — a module that cannot be imported (its own message is shown), no such attribute,
not callable, a function that needs more than one argument, a result that is not a workload — is
one :class:`~scaletrain.errors.ConfigError` naming the reference and the fix, with the traceback of the
user's code in its ``details`` (the command writes them to a file, never to the terminal).

>>> make_from_reference("scaletrain.workloads.lenet:LeNetWorkload", {}).name
'lenet'
>>> make_from_reference("scaletrain.workloads.lenet:LeNet", {})
Traceback (most recent call last):
...
scaletrain.errors.ConfigError: workload ...:LeNet: ... has no attribute 'LeNet'; it has LeNetWorkload; name an ...
"""

from __future__ import annotations

import importlib
import inspect
import traceback
from collections.abc import Callable
from typing import Any

from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.workloads.base import Workload

__all__ = ["is_reference", "make_from_reference", "workload_label"]

SEPARATOR = ":"
EXAMPLE = "my_pkg.tasks:make_workload"
LONGEST_MESSAGE = 300  # characters of a module's own error message shown on the one line


def is_reference(name: str) -> bool:
    """Whether ``name`` is a ``module:attribute`` reference rather than a registered name.

    >>> is_reference("my_pkg.tasks:make_workload"), is_reference("lenet")
    (True, False)
    """
    return SEPARATOR in name


def workload_label(name: str) -> str:
    """``name`` fit for folder and Kubernetes object names: a reference's last module and attribute.

    >>> workload_label("lenet"), workload_label("my_pkg.tasks:make_Workload")
    ('lenet', 'tasks-make-workload')
    """
    if not is_reference(name):
        return name
    module, _, attribute = name.partition(SEPARATOR)
    words = f"{module.rpartition('.')[2]}-{attribute}".lower()
    return "-".join("".join(c if c.isalnum() else " " for c in words).split()) or "workload"


def make_from_reference(reference: str, options: dict[str, Any], *, known_as: str | None = None) -> Workload:
    """The workload ``reference`` (``module:attribute``) makes with ``options``; see the module's docstring.

    ``known_as`` names where the reference came from in messages (an installed entry point).
    """
    where = known_as or f"workload {reference}"
    module_name, attribute = _split(reference, where)
    target = _import(module_name, attribute, where)
    if isinstance(target, Workload):
        if options:
            raise ConfigError(
                f"{where}: {attribute} is a workload object, which takes no options, but got {_listed(options)}; "
                "drop the options, or name a function that takes them (options: dict) and returns the workload"
            )
        return target
    if not callable(target):
        raise ConfigError(
            f"{where}: {attribute} is {_a(target)}, not a Workload subclass, a function returning "
            "a workload or a workload object; name one of those"
        )
    workload = _call(target, attribute, options, where)
    if not isinstance(workload, Workload):
        raise ConfigError(
            f"{where}: {attribute}() returned {_a(workload)}, not a workload; return a scaletrain.Workload "
            "(e.g. scaletrain.ClassificationWorkload.from_tensors(...))"
        )
    return workload


def _split(reference: str, where: str) -> tuple[str, str]:
    module_name, _, attribute = reference.partition(SEPARATOR)
    dotted = [*module_name.split("."), *attribute.split(".")]
    if not module_name or not attribute or not all(part.isidentifier() for part in dotted):
        raise ConfigError(f"{where}: a reference must look like module:attribute, e.g. {EXAMPLE}")
    return module_name, attribute


def _import(module_name: str, attribute: str, where: str) -> Any:
    try:
        target = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing and (module_name == missing or module_name.startswith(f"{missing}.")):
            raise ConfigError(
                f"{where}: there is no module {missing!r} to import; put the folder that holds it on PYTHONPATH "
                f"(e.g. PYTHONPATH=. scaletrain ...) or install its package"
            ) from None
        raise _failed(f"{where}: importing {module_name} failed:", exc, _import_fix(module_name)) from None
    except (Exception, SystemExit) as exc:  # whatever the module raises while it runs
        raise _failed(f"{where}: importing {module_name} failed:", exc, _import_fix(module_name)) from None
    for depth, part in enumerate(attribute.split(".")):
        try:
            target = getattr(target, part)
        except AttributeError:
            inside = module_name if depth == 0 else f"{module_name}:{'.'.join(attribute.split('.')[:depth])}"
            present = _workload_like(target) if depth == 0 else []
            hint = f"; it has {', '.join(present)}" if present else ""
            raise ConfigError(
                f"{where}: {inside} has no attribute {part!r}{hint}; name an attribute that is there"
            ) from None
    return target


def _import_fix(module_name: str) -> str:
    return f"fix the module (`python -c 'import {module_name}'` shows where)"


def _call(target: Callable[..., Any], attribute: str, options: dict[str, Any], where: str) -> Any:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # a callable whose signature Python cannot read: try it with the options
        signature = None
    takes_options = signature is None or _binds(signature, {})
    if not takes_options and not _binds(signature, None):
        raise ConfigError(
            f"{where}: {attribute}({', '.join(signature.parameters)}) needs arguments scaletrain cannot give; "
            "a workload factory takes no arguments, or one: the workload options (a dict, from -o KEY=VALUE)"
        )
    if not takes_options and options:
        raise ConfigError(
            f"{where}: {attribute}() takes no options, but got {_listed(options)}; drop the options or give "
            f"{attribute} a parameter (options: dict)"
        )
    try:
        return target(options) if takes_options else target()
    except ScaletrainError:
        raise
    except Exception as exc:
        raise _failed(f"{where}: {attribute}() raised", exc, f"fix {attribute}") from None


def _binds(signature: inspect.Signature, options: dict[str, Any] | None) -> bool:
    try:
        signature.bind(*([] if options is None else [options]))
    except TypeError:
        return False
    return True


def _failed(what: str, exc: BaseException, fix: str) -> ConfigError:
    """One line: what failed, the exception's own words, the fix; the traceback in ``details``."""
    said = " ".join(str(exc).split())
    if len(said) > LONGEST_MESSAGE:
        said = f"{said[: LONGEST_MESSAGE - 1]}…"
    error = ConfigError(f"{what} {type(exc).__name__}" + (f": {said}" if said else "") + f"; {fix}")
    error.details = "".join(traceback.format_exception(exc))
    return error


def _workload_like(module: Any) -> list[str]:
    """The module's own attributes a reference could name: workload classes, functions, workload objects."""
    names = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        own = getattr(value, "__module__", None) == module.__name__
        is_class = inspect.isclass(value) and issubclass(value, Workload) and not inspect.isabstract(value)
        if isinstance(value, Workload) or (own and (is_class or inspect.isfunction(value))):
            names.append(name)
    return sorted(names)[:8]


def _listed(options: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in options.items())


def _a(value: Any) -> str:
    """``None``, ``an int``, ``a dict``: what a value is, in words."""
    if value is None:
        return "None"
    kind = type(value).__name__
    return f"{'an' if kind[0].lower() in 'aeiou' else 'a'} {kind}"
