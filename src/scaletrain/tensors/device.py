"""Where a process computes: ``--device auto|cpu|cuda|cuda:K``, and moving batches there.

``auto`` is the process's GPU when torch sees one (``cuda:LOCAL_RANK`` under a launcher, so the
processes of one machine take one GPU each), else the CPU. A parameter server process always
computes on the CPU: its work is an optimizer step over flat buffers that gloo sends from host
memory. Clocks are read after :func:`synchronize`, because CUDA work runs asynchronously (Dortmund
thesis §3.1.2); on the CPU it is free.

An H200 ran these paths on 2026-11-26 (tests/gpu, results/h200-2026-11-26); CI runs the CPU paths only.

>>> resolve_device("cpu"), resolve_device("auto", cuda_available=False)
(device(type='cpu'), device(type='cpu'))
>>> resolve_device("auto", local_rank=1, cuda_available=True, cuda_count=2)
device(type='cuda', index=1)
>>> to_device((torch.zeros(1), [torch.ones(1)]), torch.device("cpu"))[1][0]
tensor([1.])
"""

from __future__ import annotations

from typing import Any

import torch

from scaletrain.errors import ConfigError

__all__ = ["DEVICE_CHOICES", "backend_for", "check_device", "resolve_device", "synchronize", "to_device"]

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device(spec: str) -> None:
    """Refuse a ``--device`` that is no device name at all (whether it exists is checked where it runs)."""
    kind, _, index = spec.partition(":")
    if kind not in DEVICE_CHOICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ConfigError(f"--device must be auto, cpu, cuda or cuda:K (K a GPU number), got {spec!r}")


def resolve_device(
    spec: str, *, local_rank: int = 0, cuda_available: bool | None = None, cuda_count: int | None = None
) -> torch.device:
    """The device ``spec`` names for this process; a CUDA device torch cannot see is one clear error."""
    check_device(spec)
    available = torch.cuda.is_available() if cuda_available is None else cuda_available
    if spec == "cpu" or (spec == "auto" and not available):
        return torch.device("cpu")
    if not available:
        raise ConfigError(
            f"--device {spec}: torch sees no CUDA device here (torch.cuda.is_available() is False: no GPU, no "
            "driver, or a CPU-only torch); use --device cpu or --device auto"
        )
    count = torch.cuda.device_count() if cuda_count is None else cuda_count
    index = int(spec.partition(":")[2]) if ":" in spec else local_rank % max(count, 1)
    if index >= count:
        raise ConfigError(f"--device {spec}: this machine has {count} CUDA device(s), numbered 0 to {count - 1}")
    return torch.device("cuda", index)


def backend_for(device: torch.device) -> str:
    """The process group's backend: gloo for CPU tensors, and NCCL for CUDA tensors when the device is a
    GPU (all-reduce of gradients on the GPU; the parameter server's point-to-point links stay on gloo)."""
    return "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"


def to_device(value: Any, device: torch.device) -> Any:
    """``value`` (a tensor, or tuples, lists and dicts of them) on ``device``; the same object on the CPU."""
    if device.type == "cpu":
        return value
    if torch.is_tensor(value):
        return value.to(device, non_blocking=True)
    if isinstance(value, tuple | list):
        moved = [to_device(item, device) for item in value]
        return type(value)(*moved) if hasattr(value, "_fields") else type(value)(moved)
    if isinstance(value, dict):
        return {key: to_device(item, device) for key, item in value.items()}
    return value


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (before reading a clock); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
