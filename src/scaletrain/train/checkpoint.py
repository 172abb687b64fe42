"""Checkpoints: their format, and atomic writes (a temporary file, flushed, then renamed into place).

A run killed at any moment leaves either the previous checkpoint or the new one, never half a file.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from scaletrain.config import TrainConfig
from scaletrain.errors import ConfigError, ScaletrainError
from scaletrain.train.schedule import Position

if TYPE_CHECKING:
    from scaletrain.train.state import Prepared
    from scaletrain.workloads import Workload

#: ``(strategy, server, sync, workers)`` → ``"allreduce-join, 2 workers"``: how a run's strategy is named
#: in checkpoints, summaries and the bench (given by the parallel layer, which knows the strategies).
StrategyLabel = Callable[[str, str, str, int], str]

__all__ = [
    "CHECKPOINT_FORMAT",
    "CHECKPOINT_NAME",
    "EXCHANGE_NAME",
    "StrategyLabel",
    "atomic_save",
    "check_compatible",
    "check_writable",
    "checkpoint_payload",
    "load_checkpoint",
    "make_folder",
    "refuse_overwrite",
    "resume_advice",
    "unwritable",
]

CHECKPOINT_NAME = "checkpoint.pt"
#: Each worker's exchange state (a wire codec's residuals and factors) at the checkpoint's step.
EXCHANGE_NAME = "exchange-rank{rank}.pt"


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically.

    A full disk or any other write error leaves the old file untouched and raises an error that
    says so.

    >>> import tempfile, pathlib
    >>> target = pathlib.Path(tempfile.mkdtemp()) / "x.pt"
    >>> atomic_save({"a": 1}, target); torch.load(target)["a"]
    1
    """
    path = Path(path)
    temporary = None
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(handle, "wb") as file:
            torch.save(obj, file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except (OSError, RuntimeError) as exc:
        if temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
        if path.exists():
            kept = f"the previous {path.name} is intact; free space (or make the folder writable) and use --resume"
        else:
            kept = f"no {path.name} was written; free space (or make the folder writable) and start the run again"
        raise ScaletrainError(f"could not write {path}: {_reason(exc)}; {kept}") from exc


def _reason(exc: BaseException) -> str:
    """The OS's words for a failed write (``No space left on device``), else the error's first line."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def resume_advice(out: Path | None) -> str:
    """What a user can do after a run stopped early, true to what is on disk in ``out``.

    >>> import tempfile
    >>> resume_advice(Path(tempfile.mkdtemp())).startswith("no checkpoint was written")
    True
    """
    if out is None:
        return "no checkpoint was written"
    path = Path(out) / CHECKPOINT_NAME
    if path.exists():
        return f"the last checkpoint is kept: continue with --resume --out {out}"
    return f"no checkpoint was written yet ({path}); start the run again to train from the beginning"


def make_folder(out: Path) -> None:
    """Create the run folder ``out``, or fail with one line that says why and what to do."""
    try:
        Path(out).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(unwritable(out, exc.strerror or str(exc))) from None


def check_writable(folder: Path, *, what: str = "the run folder") -> None:
    """Fail now, before any work, if ``folder`` could not be created and written later.

    Nothing is created: the nearest existing ancestor must be a writable folder on real storage.
    """
    path = Path(folder).absolute()
    existing = path
    while not existing.exists():
        if existing.is_symlink():
            raise ConfigError(unwritable(folder, f"{existing} is a broken link", what=what))
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(unwritable(folder, f"{existing} is a file, not a folder", what=what))
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(unwritable(folder, f"{existing} is not writable (read-only or not yours)", what=what))
    if existing.parts[1:2] in (("proc",), ("sys",)):
        raise ConfigError(unwritable(folder, f"{existing} is a kernel interface, not storage", what=what))


def unwritable(out: Path, why: str, *, what: str = "the run folder") -> str:
    """The message for a run folder that cannot be written."""
    return f"cannot write {what} {out}: {why}; choose another --out"


def refuse_overwrite(out: Path, *, resume: bool) -> None:
    """A run folder that holds a checkpoint is only ever continued (``--resume``), never overwritten."""
    if not resume and (Path(out) / CHECKPOINT_NAME).exists():
        raise ConfigError(
            f"{out} already holds a run (checkpoint.pt); pass --resume to continue it, or choose another --out"
        )


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Load a checkpoint written by :func:`atomic_save`, with a clear error if it is unusable."""
    path = Path(path)
    if not path.exists():
        raise ScaletrainError(
            f"--resume given but there is no checkpoint at {path}; run without --resume to start afresh"
        )
    fix = "delete it (or choose another --out) and run without --resume to start afresh"
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ScaletrainError(f"checkpoint {path} cannot be read ({_reason(exc)}); check its permissions") from None
    if size == 0:
        raise ScaletrainError(f"checkpoint {path} is empty (0 bytes): it was never completely written; {fix}")
    try:
        content = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises several types for a damaged file; its advice does not apply here
        content = None
    if not isinstance(content, dict):
        raise ScaletrainError(
            f"checkpoint {path} is damaged or is not a scaletrain checkpoint ({size} bytes that do not load as one); "
            f"{fix}"
        )
    return content


# -- the format -------------------------------------------------------------------------------------

CHECKPOINT_FORMAT = 1


def check_compatible(
    checkpoint: dict[str, Any], config: TrainConfig, workload: Workload, label_of: StrategyLabel, batch_split: int = 1
) -> None:
    """Refuse to resume a checkpoint written with other settings. ``batch_split``: over how many workers this run
    divides each batch into updates (the strategy's :meth:`~scaletrain.parallel.strategies.Strategy.batch_split`)."""
    if checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise ConfigError("the checkpoint was written by an incompatible scaletrain version; start afresh")
    expected_strategy = label_of(config.strategy, config.server, config.sync, config.workers)
    for key, expected, saved in (
        ("workload", workload.name, checkpoint.get("workload")),
        ("batch size", config.batch_size, checkpoint.get("batch_size")),
        ("seed", config.seed, checkpoint.get("seed")),
        ("strategy", expected_strategy, _saved_strategy(checkpoint, expected_strategy, label_of)),
        # the technique's saved state is laid out for the techniques in force (precision is one)
        ("precision", _precision_label(config), checkpoint.get("precision", "fp32, no loss scaling")),
    ):
        if saved != expected:
            raise ConfigError(
                f"cannot resume: the checkpoint was written with {key} {saved} but this run asks for "
                f"{expected}; use the same settings or another --out"
            )
    saved_split = _saved_split(checkpoint, config)  # how asynchronous workers divide the batch sets the schedule
    if saved_split != batch_split:
        made = {n: "one update" if n == 1 else f"{n} workers' updates" for n in (saved_split, batch_split)}
        raise ConfigError(
            f"cannot resume: the checkpoint's run made each batch {made[saved_split]} but this run makes it "
            f"{made[batch_split]} (--async-batches); use the same settings or another --out"
        )


def _saved_split(checkpoint: dict[str, Any], config: TrainConfig) -> int:
    """Over how many workers the checkpoint's run divided each batch; earlier files named the mode (split: the
    workers of an asynchronous run), and files older still had whole batches."""
    if "batch_split" in checkpoint:
        return int(checkpoint["batch_split"])
    asynchronous = config.sync in ("async", "none") and config.workers > 1
    return config.workers if asynchronous and checkpoint.get("async_batches") == "split" else 1


def _precision_label(config: TrainConfig) -> str:
    """``bf16, no loss scaling`` — the precision settings a checkpoint must be resumed with."""
    from scaletrain.efficient.precision import Precision

    return Precision.label(vars(config))


def _saved_strategy(checkpoint: dict[str, Any], expected: str, label_of: StrategyLabel) -> str:
    """The checkpoint's strategy label; files of 0.1.0 wrote ``strategy/server/sync/workers``."""
    saved = checkpoint.get("strategy", expected)
    parts = saved.split("/") if isinstance(saved, str) else []
    if len(parts) == 4 and parts[3].isdigit():
        strategy, server, sync, workers = parts
        return label_of(strategy, server, sync, int(workers))
    return saved


def checkpoint_payload(
    prepared: Prepared, model: nn.Module, optimizer: torch.optim.Optimizer, position: Position, state: Any
) -> dict[str, Any]:
    """What ``checkpoint.pt`` holds; every strategy's coordinator writes this shape.

    ``architecture``: the modules resized by reconfigurations so far (a resumed run rebuilds them
    before loading the weights); ``schedule``: the batch size and steps per epoch of each stretch of
    epochs; ``batch_size`` stays the one the run was started with; ``decided_epochs``: through which
    epoch's end the technique has decided; ``technique``: the technique's own state; ``first_losses``:
    the losses the divergence bound measures from (empty where the writer has not seen them yet).
    """
    config = prepared.config
    technique = prepared.technique
    return {
        "format": CHECKPOINT_FORMAT,
        "workload": prepared.workload.name,
        "batch_size": config.batch_size,
        "seed": config.seed,
        "precision": _precision_label(config),
        "batch_split": prepared.async_split,
        "strategy": prepared.strategy_label,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "rng": torch.get_rng_state(),
        "position": asdict(position),
        "workload_state": state,
        "architecture": prepared.architecture,
        "schedule": prepared.schedule.to_list(),
        "decided_epochs": prepared.decided_epochs,
        "technique": technique.state_dict() if technique is not None else None,
        "first_losses": list(prepared.first_losses),
    }
