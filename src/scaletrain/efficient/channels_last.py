"""Channels-last activations: every 2-D convolution reads and writes NHWC tensors during training.

**Method card.** PyTorch stores image tensors as NCHW; oneDNN (CPUs) and cuDNN's tensor-core kernels
(GPUs) work on NHWC, so an NCHW convolution pays a reorder of its input and output on every call, in
the forward and in both backward passes. Keeping the activations channels-last removes those
reorders (PyTorch's channels-last tutorial; NVIDIA's mixed-precision guide recommends NHWC with
float16 on tensor cores). Measured on this project's CPU (AMD EPYC, AVX-512 BF16, 1 thread,
``benchmarks/precision.py``): 7–36 % shorter steps for LeNet, ResNet-20 and SqueezeNet in float32 and
bfloat16; docs/precision-and-devices.md has the table.

**How.** Only the activations change layout: inside the training forward pass, every ``nn.Conv2d``
gets its input as channels-last (a no-op when it already is) and hands its output on as
channels-last (this matters for a first convolution over one input channel, whose layout is
otherwise ambiguous and stays NCHW). Batch norm, ReLU, pooling and the residual sums keep the layout
they are given. The parameters are left alone: their layout does not change the result, a
parameter server's workers keep their weights as views of the received buffer, and a network that
PruneTrain, Net2Net or MorphNet rebuilds needs nothing redone, because the hooks are installed for
the duration of each forward pass (``torch.nn.modules.module.register_module_forward_*_hook``) and
see whatever convolutions the network has at that moment. Evaluation and the tracers that read the
network's structure run outside the training forward pass and see plain NCHW.

``--memory-format auto`` (the default) is channels-last on a CPU and channels-first on a GPU, where
neither layout has been measured with scaletrain yet.

Usable in any loop::

    >>> import torch
    >>> from torch import nn
    >>> model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU())
    >>> with channels_last_activations():
    ...     out = model(torch.ones(2, 1, 8, 8))
    >>> out.is_contiguous(memory_format=torch.channels_last), model(torch.ones(2, 1, 8, 8)).is_contiguous()
    (True, True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.nn.modules import module as module_hooks

from scaletrain.efficient.base import Technique
from scaletrain.efficient.settings import Setting
from scaletrain.errors import ConfigError

__all__ = [
    "MEMORY_FORMATS",
    "ChannelsLast",
    "channels_last_activations",
    "memory_format_technique",
    "resolved_memory_format",
]

MEMORY_FORMATS = ("auto", "contiguous", "channels_last")


def _as_channels_last(tensor: Any) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def _input_hook(module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if isinstance(module, nn.Conv2d) and inputs:
        return (_as_channels_last(inputs[0]), *inputs[1:])
    return None


def _output_hook(module: nn.Module, inputs: tuple[Any, ...], output: Any) -> Any:
    return _as_channels_last(output) if isinstance(module, nn.Conv2d) else None


@contextlib.contextmanager
def channels_last_activations() -> Iterator[None]:
    """Within this block, every ``nn.Conv2d`` of any model reads and writes channels-last activations."""
    before = module_hooks.register_module_forward_pre_hook(_input_hook)
    after = module_hooks.register_module_forward_hook(_output_hook)
    try:
        yield
    finally:
        before.remove()
        after.remove()


def resolved_memory_format(memory_format: str, device_type: str = "cpu") -> str:
    """``--memory-format`` on a device of ``device_type``: ``auto`` is ``channels_last`` on a CPU (measured
    faster here for every convolutional workload, in float32 and bfloat16) and ``contiguous`` elsewhere
    (not measured on a GPU yet).

    >>> resolved_memory_format("auto"), resolved_memory_format("auto", "cuda")
    ('channels_last', 'contiguous')
    """
    if memory_format not in MEMORY_FORMATS:
        raise ConfigError(f"--memory-format must be one of {', '.join(MEMORY_FORMATS)}, got {memory_format!r}")
    if memory_format == "auto":
        return "channels_last" if device_type == "cpu" else "contiguous"
    return memory_format


def memory_format_technique(memory_format: str, device_type: str = "cpu") -> ChannelsLast | None:
    """``--memory-format`` as a technique: :class:`ChannelsLast`, or ``None`` for channels-first.

    >>> memory_format_technique("contiguous") is None, memory_format_technique("channels_last").name
    (True, 'channels_last')
    """
    return ChannelsLast.from_settings({"memory_format": memory_format}, device_type)


@dataclass
class ChannelsLast(Technique):
    """``--memory-format channels_last`` as a technique; see the module's method card. It keeps no state and
    stays out of the checkpointed stack, so a run may resume in another layout."""

    name: ClassVar[str] = "channels_last"
    checkpointed: ClassVar[bool] = False
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(
            "memory_format",
            "the convolutions' activations while training: channels_last (NHWC: no reorders around oneDNN's "
            "kernels), contiguous (NCHW) or auto (channels_last on a CPU, contiguous on a GPU)",
            choices=MEMORY_FORMATS,
        ),
    )

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        resolved_memory_format(settings["memory_format"])

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> ChannelsLast | None:
        return cls() if resolved_memory_format(settings["memory_format"], device_type) == "channels_last" else None

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        return {"memory_format": resolved_memory_format(settings["memory_format"], device_type)}

    def forward_context(self) -> contextlib.AbstractContextManager:
        return channels_last_activations()
