"""Handing a workload object to the processes the local launcher starts.

``scaletrain.train(obj, workers=N)`` starts N fresh interpreters, which rebuild ``obj`` from what this
process sends them:

- its import reference, when :func:`~scaletrain.workloads.create_workload` made it (``obj.origin``): each
  process makes it again as the command line's processes do, and nothing else travels;
- otherwise the object itself, pickled with cloudpickle into ``OUT/workload/`` (a class defined in a
  notebook's or a script's ``__main__`` travels by value), its large tensors in one memory-mapped file
  beside the pickle (:mod:`scaletrain.tensors.sharing`), so the processes share one copy of the data.
  The folder goes when the run ends.

An object that can be neither is one line saying why and what to do, before any process starts.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from scaletrain.errors import ConfigError
from scaletrain.tensors.sharing import dump, load
from scaletrain.workloads import Workload

__all__ = ["HANDOVER_DIR", "receive_workload", "remove_handover", "send_workload"]

#: The folder of the run folder that holds a pickled workload object while the run lasts.
HANDOVER_DIR = "workload"
_BY_REFERENCE = (
    "make it with a module-level function and pass 'module:function' "
    "(or scaletrain.create_workload('module:function')), so that every process imports it"
)


def send_workload(workload: Workload, out: Path) -> Path:
    """Pickle ``workload`` into ``OUT/workload/``; the file each process gives :func:`receive_workload`."""
    folder = out / HANDOVER_DIR
    try:
        return dump(workload, folder)
    except Exception as exc:  # pickle's PicklingError, TypeError, AttributeError … from the object's parts
        shutil.rmtree(folder, ignore_errors=True)
        said = " ".join(str(exc).split())
        raise ConfigError(
            f"the workload object {workload.name!r} cannot reach the worker processes: scaletrain did not make it "
            f"from an import reference, and it cannot be pickled ({type(exc).__name__}: {said}); {_BY_REFERENCE}, "
            "or keep what cannot be pickled (open files, locks, generators) out of it"
        ) from None


def receive_workload(path: Path) -> Workload:
    """The workload object :func:`send_workload` pickled, its tensors mapped from the shared file."""
    try:
        workload = load(path)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"the workload object needs module {exc.name!r}, which this process cannot import; put its folder on "
            f"PYTHONPATH, or {_BY_REFERENCE}"
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read the workload object at {path}: {exc.strerror or exc}") from None
    except Exception as exc:
        said = " ".join(str(exc).split())
        raise ConfigError(
            f"the workload object could not be rebuilt in this process ({type(exc).__name__}: {said}); {_BY_REFERENCE}"
        ) from None
    if not isinstance(workload, Workload):
        raise ConfigError(f"{path} holds {type(workload).__name__}, not a workload; a defect in scaletrain")
    return workload


def remove_handover(out: Path) -> None:
    """Delete ``OUT/workload/`` once the processes are done with it: a copy of the data kept for nothing."""
    shutil.rmtree(out / HANDOVER_DIR, ignore_errors=True)
