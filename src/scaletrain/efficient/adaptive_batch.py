"""``--batch-budget``: the largest batch whose training step fits a memory budget, found again whenever
the network changes.

The Dortmund thesis's batch-size adaptation (seed 004 §3.2.2): find the largest batch that fits the memory by binary
search on real training steps (free-memory readings are unreliable under fragmentation), and after each
reconfiguration that changes the network (a pruned network needs less memory per sample) raise the batch to what
fits the new one, the learning rate scaled with it (linear, Goyal et al. 2017; ``sqrt``, Krizhevsky 2014; or
``none``), optionally over a warm-up of ``--batch-warmup`` updates. A log-log fit of batch against parameter count
over the searches so far says where the next search starts. The first search runs after the first epoch.

The budget on a CPU is the peak resident memory (RSS) of a forked copy of the process during one step
(:func:`forked_peak_rss`), so the search never disturbs training and a step that does not fit fails in the copy
only; on a GPU ``torch.cuda.max_memory_allocated`` during a step of a copy of the network, an out-of-memory error
meaning "does not fit". The batch searched is each process's share (``--batch-size`` for ``join`` and for one
process, ``--batch-size / N`` for ``split``); the new global ``--batch-size`` reaches every process at once through
the agreed reconfiguration, under every strategy.

It keeps the hardware full as PruneTrain shrinks the network, and fits a container's memory limit without trial and
error. A larger batch changes the optimisation, though; ghost batch norm (``--ghost-batch``) keeps the small batch's
batch-norm statistics. docs/techniques.md has the measurements, on a CPU and on a GPU.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import resource
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import torch
from torch import nn

from scaletrain.efficient.base import Context, EpochEnd, Reconfiguration, Technique
from scaletrain.efficient.net2net import applied
from scaletrain.efficient.settings import Setting
from scaletrain.errors import ConfigError, ScaletrainError

__all__ = [
    "AdaptBatch",
    "BatchFit",
    "available_memory",
    "cuda_peak",
    "forked_peak_rss",
    "largest_batch",
    "parse_bytes",
    "trial_step",
]

SCALINGS = ("linear", "sqrt", "none")
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_bytes(text: str | int) -> int:
    """``"600MB"``, ``"1.5GiB"`` or a number of bytes.

    >>> parse_bytes("1.5GiB"), parse_bytes("600MB"), parse_bytes(4096)
    (1610612736, 600000000, 4096)
    """
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise ConfigError(f"--batch-budget {text!r}: give bytes with a unit, e.g. 600MB or 1.5GiB")
        value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ConfigError(f"--batch-budget must be positive, got {text!r}")
    return value


def largest_batch(fits: Callable[[int], bool], start: int, limit: int) -> tuple[int, list[tuple[int, bool]]]:
    """The largest batch in ``[1, limit]`` for which ``fits`` holds (assumed monotone), and the probes
    made: from ``start``, doubling up while it fits (or halving down while it does not), then bisecting.
    0 when not even a batch of 1 fits.

    >>> largest_batch(lambda b: b <= 37, start=8, limit=1000)[0]
    37
    """
    probes: list[tuple[int, bool]] = []

    def probe(batch: int) -> bool:
        result = fits(batch)
        probes.append((batch, result))
        return result

    start = min(max(start, 1), limit)
    if probe(start):
        low, high = start, None
        while high is None:
            if low == limit:
                return low, probes
            candidate = min(2 * low, limit)
            if probe(candidate):
                low = candidate
            else:
                high = candidate
    else:
        low, high = 0, start
        while low == 0:
            if high == 1:
                return 0, probes
            candidate = high // 2
            if probe(candidate):
                low = candidate
            else:
                high = candidate
    while high - low > 1:
        middle = (low + high) // 2
        if probe(middle):
            low = middle
        else:
            high = middle
    return low, probes


def forked_peak_rss(step: Callable[[], None], timeout: float = 300.0) -> int | None:
    """The peak resident bytes of a forked copy of this process while it runs ``step`` once (``None``
    when the step fails for lack of memory there): the whole process's peak, as a container's memory
    limit counts it. The copy first hands the heap's free memory back to the system (``malloc_trim``)
    and restarts its peak counter (``/proc/self/clear_refs``), so what an earlier, larger batch left
    free in this process's heap does not count. The copy may map at most 80 % of the memory the
    machine has available beyond what this process maps (``RLIMIT_AS``), so a trial far too large
    fails at once in the copy instead of waking the OOM killer."""
    ceiling = _address_space() + int(0.8 * available_memory())
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the copy: one thread, the step, out without cleaning up (no atexit, no flushes)
        os.close(reader)
        code, peak = 0, 0
        try:
            resource.setrlimit(resource.RLIMIT_AS, (ceiling, ceiling))
            torch.set_num_threads(1)
            _fresh_peak()
            step()
            peak = _status_kilobytes("/proc/self/status", "VmHWM:") * 1024
        except (MemoryError, torch.OutOfMemoryError):
            code = 3
        except RuntimeError as exc:  # torch's CPU allocator: "can't allocate memory"
            code = 3 if "allocate" in str(exc) else 4
        except BaseException:  # any other failure of the copy is reported by its exit code
            code = 4
        os.write(writer, str(peak).encode("ascii"))
        os._exit(code)
    os.close(writer)
    deadline = time.monotonic() + timeout
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.wait4(pid, 0)
            raise ScaletrainError(f"a trial training step took over {timeout:.0f} s; the batch search gave up")
        time.sleep(0.005)
    with os.fdopen(reader, "rb") as pipe:
        reported = pipe.read().decode("ascii")
    code = os.waitstatus_to_exitcode(status)
    if code == 3 or code == -signal.SIGKILL:  # out of memory (the kernel's OOM killer sends SIGKILL)
        return None
    if code != 0:
        raise ScaletrainError(f"a trial training step failed in its forked copy (exit status {code})")
    return int(reported) if reported.strip() not in ("", "0") else usage.ru_maxrss * 1024  # kilobytes on Linux


def _fresh_peak() -> None:
    """Return the heap's free memory to the system and restart the peak-RSS counter (Linux ≥ 4.0); where
    either is refused the peak counts from the fork (a larger figure, never a smaller one)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
        refs.write("5")


def _address_space() -> int:
    """This process's mapped bytes (``VmSize``)."""
    return _status_kilobytes("/proc/self/status", "VmSize:") * 1024


def available_memory() -> int:
    """The machine's available memory in bytes (``MemAvailable``)."""
    return _status_kilobytes("/proc/meminfo", "MemAvailable:") * 1024


def _status_kilobytes(path: str, key: str) -> int:
    with open(path, encoding="ascii") as lines:
        return next(int(line.split()[1]) for line in lines if line.startswith(key))


def trial_step(
    model: nn.Module,
    workload: Any,
    batch: Any,
    rows: int,
    forward_context: Callable[[], Any],
    optimizer_of: Callable[[list[nn.Parameter]], torch.optim.Optimizer],
) -> Callable[[], None]:
    """One training step of ``model`` on ``batch`` as the loop takes it: forward under the technique's
    context, backward, and a step of the run's optimizer (``optimizer_of``, at rate 0) that creates its state
    (SGD's momentum, Adam's two moments)."""

    def step() -> None:
        model.train()
        state = workload.initial_state(model, rows)
        with forward_context():
            objective, _, _ = workload.training_loss(model, batch, state)
        model.zero_grad(set_to_none=True)
        objective.backward()
        optimizer_of(list(model.parameters())).step()

    return step


def cuda_peak(step: Callable[[], None], device: torch.device) -> int | None:
    """Peak allocated device memory of ``step`` (``None`` on out-of-memory). Not yet run on a GPU."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        step()
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    torch.cuda.empty_cache()
    return peak


@dataclass
class BatchFit:
    """Batch against parameter count, fitted in log-log space over the points measured so far."""

    points: list[tuple[int, int]] = field(default_factory=list)  # (parameters, batch)

    def predict(self, parameters: int) -> int | None:
        """The fitted batch for ``parameters`` (``None`` before two distinct points).

        >>> BatchFit([(1000, 64), (4000, 16)]).predict(2000)
        32
        """
        distinct = {p: b for p, b in self.points if p > 0 and b > 0}
        if len(distinct) < 2:
            return None
        xs = [math.log(p) for p in distinct]
        ys = [math.log(b) for b in distinct.values()]
        mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mean_x) ** 2 for x in xs
        )
        return max(1, round(math.exp(mean_y + slope * (math.log(parameters) - mean_x))))


@dataclass
class AdaptBatch(Technique):
    """The adapter (stacked after ``--technique``, before ``--precision``): amends each epoch's decision."""

    budget: int = 0
    scaling: str = "linear"
    warmup: int = 0
    limit: int = 8192  # the largest per-process batch tried
    name = "adapt-batch"
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(
            "batch_budget",
            "after the first epoch and every reconfiguration, the largest batch whose step fits SIZE of memory "
            "(e.g. 600MB; peak RSS on a CPU, device memory on a GPU)",
            metavar="SIZE",
        ),
        Setting("batch_scaling", "--batch-budget: the rate's rule", choices=SCALINGS),
        Setting("batch_warmup", "--batch-budget: reach the new rate over N updates", type=int, metavar="N"),
    )
    searches: list[dict[str, Any]] = field(default_factory=list)  # every search: epoch, parameters, batch, peak
    _context: Context = field(default_factory=Context, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.budget <= 0:
            raise ConfigError("batch adaptation needs a budget: --batch-budget 600MB")
        _refuse_rule(self.scaling, self.warmup)

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        budget, scaling, warmup = settings["batch_budget"], settings["batch_scaling"], settings["batch_warmup"]
        if budget is None and scaling == "linear" and not warmup:
            return
        if budget is None:
            raise ConfigError("--batch-scaling and --batch-warmup go with --batch-budget; add --batch-budget SIZE")
        parse_bytes(budget)
        _refuse_rule(scaling, warmup)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> AdaptBatch | None:
        """What ``batch_budget`` (with ``batch_scaling`` and ``batch_warmup``) asks for, or ``None``."""
        if settings["batch_budget"] is None:
            return None
        budget = parse_bytes(settings["batch_budget"])
        return cls(budget=budget, scaling=settings["batch_scaling"], warmup=settings["batch_warmup"])

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        """``batch_budget`` as given and ``batch_searches``: each search and its probes."""
        searches = technique.searches if isinstance(technique, AdaptBatch) else None
        return {"batch_budget": settings["batch_budget"], "batch_searches": searches}

    def start(self, model: nn.Module, context: Context) -> None:
        self._context = context

    def amend(self, decision: Reconfiguration | None, end: EpochEnd, model: nn.Module) -> Reconfiguration | None:
        if decision is not None and decision.batch_size is not None:
            return decision  # another technique chose the batch
        if self.searches and (decision is None or not decision.changes_network):
            return decision  # the network the last search measured is still the one
        network = model if decision is None or not decision.changes_network else applied(model, decision)
        parameters = sum(p.numel() for p in network.parameters())
        share = self._context.batch_share
        current = max(1, round(end.batch_size * share))
        predicted = BatchFit([(s["parameters"], s["rows"]) for s in self.searches]).predict(parameters)
        peaks: dict[int, int | None] = {}

        def fits(rows: int) -> bool:
            peaks[rows] = self._context.step_peak(network, rows)
            return peaks[rows] is not None and peaks[rows] <= self.budget

        rows, probes = largest_batch(fits, predicted or current, self.limit)
        if rows == 0:
            raise ConfigError(
                f"--batch-budget {self.budget:,} bytes: not even a batch of 1 fits ({peaks.get(1)} bytes at "
                "its peak); give a larger budget"
            )
        batch = max(1, round(rows / share))
        self.searches.append(
            {
                "epoch": end.epoch,
                "parameters": parameters,
                "rows": rows,
                "batch_size": batch,
                "peak_bytes": peaks[rows],
                "budget_bytes": self.budget,
                "probes": [(r, fit, peaks[r]) for r, fit in probes],
                "predicted_rows": predicted,
            }
        )
        if batch == end.batch_size:
            return decision
        ratio = batch / end.batch_size
        scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.scaling]
        return replace(decision or Reconfiguration(), batch_size=batch, lr_scale=scale, lr_warmup_steps=self.warmup)

    def state_dict(self) -> dict[str, Any]:
        return {"searches": self.searches}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.searches = list(state.get("searches", []))


def _refuse_rule(scaling: str, warmup: int) -> None:
    if scaling not in SCALINGS:
        raise ConfigError(f"--batch-scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    if warmup < 0:
        raise ConfigError(f"--batch-warmup must be ≥ 0 updates, got {warmup}")
