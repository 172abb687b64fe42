"""What the results were measured on, recorded with every result row."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

__all__ = ["machine_info"]


def machine_info(network: str | None = None) -> dict[str, object]:
    """CPU model, cores, torch version, host and network setting.

    >>> sorted(machine_info())
    ['cores', 'cpu_model', 'host', 'network', 'torch_version']
    """
    return {
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "torch_version": torch.__version__,
        "host": platform.node(),
        "network": network or "loopback (unlimited)",
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
