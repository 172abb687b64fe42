"""What the results were measured on, recorded with every result row, profile and validation."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

import torch

__all__ = ["NOT_RECORDED", "machine_info", "machine_label", "machine_note"]

#: what a result says of a machine it did not record (profiles written before the machine was)
NOT_RECORDED = "machine not recorded"


def machine_info(network: str | None = None) -> dict[str, object]:
    """CPU model, the instruction set torch's kernels use on it (``AVX512``, ``AVX2``, ``DEFAULT``), cores, torch
    version and build (``cpu``, ``cuda 12.8``), host and network setting.

    >>> sorted(machine_info())
    ['cores', 'cpu_model', 'host', 'isa', 'network', 'torch_build', 'torch_version']
    """
    return {
        "cpu_model": _cpu_model(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "torch_version": torch.__version__,
        "torch_build": _torch_build(),
        "host": platform.node(),
        "network": network or "loopback (unlimited)",
    }


def machine_label(info: Mapping[str, object] | None) -> str:
    """The machine in a few words, as reports name it; :data:`NOT_RECORDED` where ``info`` holds no CPU.

    >>> machine_label({"cpu_model": "AMD EPYC", "isa": "AVX2", "cores": 2, "torch_version": "2.13.0+cpu"})
    'AMD EPYC (AVX2), 2 cores, torch 2.13.0+cpu'
    >>> machine_label({}), machine_label({"cpu_model": "AMD EPYC", "cores": 2})
    ('machine not recorded', 'AMD EPYC (ISA not recorded), 2 cores')
    """
    if not info or not info.get("cpu_model"):
        return NOT_RECORDED
    parts = [f"{_cpu(info)}"]
    parts += [f"{info['cores']} cores"] if info.get("cores") else []
    parts += [f"torch {info['torch_version']}"] if info.get("torch_version") else []
    return ", ".join(parts)


def machine_note(recorded: Mapping[str, object] | None, here: Mapping[str, object]) -> str | None:
    """One line where a profile measured on ``recorded`` is used on another CPU (``here``): the models or the
    instruction sets differ. None where they agree or the profile did not record its machine.

    >>> machine_note({"cpu_model": "Xeon", "isa": "AVX512"}, {"cpu_model": "AMD EPYC", "isa": "AVX2"})
    'note: this profile was measured on Xeon (AVX512), this machine is AMD EPYC (AVX2)'
    >>> machine_note({"cpu_model": "AMD EPYC"}, {"cpu_model": "AMD EPYC", "isa": "AVX2"}) is None
    True
    """
    if not recorded or not recorded.get("cpu_model"):
        return None
    same_model = recorded.get("cpu_model") == here.get("cpu_model")
    same_isa = not recorded.get("isa") or recorded.get("isa") == here.get("isa")
    if same_model and same_isa:
        return None
    return f"note: this profile was measured on {_cpu(recorded)}, this machine is {_cpu(here)}"


def _cpu(info: Mapping[str, object]) -> str:
    return f"{info.get('cpu_model') or 'an unknown CPU'} ({info.get('isa') or 'ISA not recorded'})"


def _torch_build() -> str:
    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    if getattr(torch.version, "hip", None):
        return f"rocm {torch.version.hip}"
    return "cpu"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
