"""What both engines' probes share (``tensorflow_probe.py``, ``mxnet_probe.py``): the spec's ``probe`` block, a
barrier of files among the processes that time t_grad at once, and writing the samples.

Like the programs it needs only the standard library.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

BARRIER_SECONDS = 300.0


def barrier(spec: dict, index: int) -> None:
    """Wait until every one of the ``probe["processes"]`` processes timing t_grad at once has reached here."""
    probe, out = spec["probe"], Path(spec["out"])
    (out / f"probe-ready-{index}").write_text("", encoding="utf-8")
    deadline = time.monotonic() + BARRIER_SECONDS
    while sum(1 for _ in out.glob("probe-ready-*")) < probe["processes"]:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the other probe processes did not start within {BARRIER_SECONDS:.0f} s")
        time.sleep(0.01)


def write_samples(spec: dict, index: int, samples: dict) -> None:
    """``probe-worker-<index>.json`` with the timed samples, through a temporary file."""
    path = Path(spec["out"]) / f"probe-worker-{index}.json"
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(samples) + "\n", encoding="utf-8")
    partial.replace(path)
