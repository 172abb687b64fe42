"""Where a run reports: ``metrics.jsonl``, TensorBoard event files, and the terminal."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = ["MetricsLog", "Progress", "TensorBoardLog", "write_json"]

METRICS_NAME = "metrics.jsonl"


def write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as indented JSON (NaN/inf become null so any reader can parse it)."""
    Path(path).write_text(json.dumps(_finite(payload), indent=2, sort_keys=False) + "\n", encoding="utf-8")


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_finite(item) for item in value]
    return value


class MetricsLog:
    """Append-only JSON lines, one object per logged step or epoch.

    On resume, records after the checkpoint's step are dropped first: they describe work the
    resumed run will do again.
    """

    def __init__(self, out_dir: Path, *, resume_step: int | None = None) -> None:
        self.path = Path(out_dir) / METRICS_NAME
        if resume_step is None:
            self.path.write_text("", encoding="utf-8")
        elif self.path.exists():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and _step_of(line) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        self._file = self.path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(_finite(record)) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 1 << 62  # an unreadable (torn) last line is dropped


class TensorBoardLog:
    """Scalars under ``tb/``; a no-op when turned off. Imported lazily: TensorBoard is slow to load."""

    def __init__(self, out_dir: Path, *, enabled: bool, purge_step: int | None = None) -> None:
        self._writer = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(Path(out_dir) / "tb"), purge_step=purge_step)

    def scalars(self, values: dict[str, float | None], step: int) -> None:
        if self._writer is None:
            return
        for tag, value in values.items():
            if value is not None:
                self._writer.add_scalar(tag, value, step)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


class Progress:
    """A progress bar on a terminal, plain log lines elsewhere (CI, files), or nothing.

    ``mode``: ``auto`` (bar when ``stream`` is a terminal, else plain), ``bar``, ``plain``, ``off``.
    """

    def __init__(self, total_steps: int, *, mode: str = "auto", stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr
        if mode == "auto":
            mode = "bar" if self.stream.isatty() else "plain"
        self.mode = mode
        self.total = total_steps
        self._last_draw = 0.0

    def update(self, step: int, epoch: int, loss: float | None, rate: float | None, *, periodic: bool) -> None:
        """Report step ``step``; plain mode only prints when ``periodic`` (every ``log_every`` steps)."""
        text = f"epoch {epoch + 1} step {step}/{self.total}"
        if loss is not None:
            text += f" loss {loss:.4f}"
        if rate is not None:
            text += f" {rate:.1f} batches/s"
        if self.mode == "bar":
            # Redrawing costs a write per step; ten redraws a second are enough for a person.
            if step != self.total and time.monotonic() - self._last_draw < 0.1:
                return
            self._last_draw = time.monotonic()
            width = 30
            filled = int(width * step / max(self.total, 1))
            self.stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {text}   ")
            self.stream.flush()
        elif self.mode == "plain" and periodic:
            print(text, file=self.stream, flush=True)

    def message(self, text: str) -> None:
        if self.mode == "off":
            return
        if self.mode == "bar":
            self.stream.write("\r\033[K")
        print(text, file=self.stream, flush=True)

    def close(self) -> None:
        if self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()
