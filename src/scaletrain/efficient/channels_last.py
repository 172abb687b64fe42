"""Channels-last activations: every 2-D convolution reads and writes NHWC tensors during training.

**Method card.** oneDNN (CPUs) and cuDNN's tensor-core kernels work on NHWC, so an NCHW convolution pays
a reorder of its input and output on every call; keeping the activations channels-last removes them
(PyTorch's channels-last tutorial). Only the activations change layout, and only inside the training
forward pass: global module hooks hand each ``nn.Conv2d`` its input channels-last and pass its output on
channels-last. Parameters keep their layout (a parameter server's workers keep them as views of the
received buffer), a network a technique rebuilds needs nothing redone, and evaluation sees NCHW.
``--memory-format auto`` (the default) is channels-last on a CPU, channels-first on a GPU. Under ``--compile``
the hooks stay off (new ones each step would make dynamo compile again each step): inductor lays the compiled
convolutions out itself, as :func:`inductor_layout_optimization` tells it.

**A library defect worked around.** Where oneDNN runs below AVX-512, its 1x1 backward-weights kernel
(``jit_1x1:avx2``) writes past its workspace for a strided NHWC input of fewer than 8 channels (oneDNN
issue #6035): wrong weight gradients, then a corrupted heap. Those convolutions alone
(:func:`hits_onednn_1x1_defect`) take their input channels-first. docs/precision-and-devices.md has the
measurements of both.

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
import functools
import os
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
    "hits_onednn_1x1_defect",
    "inductor_layout_optimization",
    "memory_format_technique",
    "onednn_below_avx512",
    "resolved_memory_format",
]

MEMORY_FORMATS = ("auto", "contiguous", "channels_last")

#: The environment variables that cap oneDNN's instruction set (its current name and its former one).
ONEDNN_ISA_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
#: oneDNN's AVX2 kernels block input channels by 8: fewer than that is where the 1x1 defect lies.
_AVX2_CHANNEL_BLOCK = 8


@functools.cache
def onednn_below_avx512() -> bool:
    """Whether oneDNN runs its AVX2 (or older) kernels here: a CPU without AVX-512, or one whose oneDNN is
    capped below it by ``ONEDNN_MAX_CPU_ISA`` (read once, as oneDNN reads it)."""
    for name in ONEDNN_ISA_VARIABLES:
        cap = os.environ.get(name, "").strip().upper()
        if cap and not cap.startswith(("AVX512", "AVX10", "ALL", "DEFAULT")):
            return True
    return not torch.cpu._is_avx512_supported()


def hits_onednn_1x1_defect(module: nn.Module, inputs: torch.Tensor, below_avx512: bool | None = None) -> bool:
    """Whether ``module`` on ``inputs`` would run oneDNN's defective AVX2 1x1 backward-weights kernel in
    channels-last (the module's card): a 2-D convolution with a 1x1 kernel, a stride above 1 and fewer than 8
    input channels per group, on a CPU whose oneDNN runs below AVX-512.

    >>> shortcut = nn.Conv2d(4, 16, 1, stride=2)
    >>> x = torch.ones(2, 4, 8, 8)
    >>> hits_onednn_1x1_defect(shortcut, x, True), hits_onednn_1x1_defect(shortcut, x, False)
    (True, False)
    >>> hits_onednn_1x1_defect(nn.Conv2d(4, 16, 1), x, True), hits_onednn_1x1_defect(nn.Conv2d(8, 16, 1, 2), x, True)
    (False, False)
    """
    if not isinstance(module, nn.Conv2d) or inputs.device.type != "cpu":
        return False
    if tuple(module.kernel_size) != (1, 1) or max(module.stride) == 1:
        return False
    if module.in_channels // module.groups >= _AVX2_CHANNEL_BLOCK:
        return False
    return onednn_below_avx512() if below_avx512 is None else below_avx512


def inductor_layout_optimization(model: nn.Module, memory_format: str, device_type: str = "cpu") -> bool:
    """Whether inductor may lay out ``model``'s compiled convolutions channels-last (its ``layout_optimization``,
    which on a CPU makes every convolution NHWC): as ``--memory-format`` resolves, except below AVX-512 for a
    network with a convolution the oneDNN 1x1 defect hits (the module's card), which then runs channels-first.

    >>> shortcut = nn.Sequential(nn.Conv2d(16, 32, 1, stride=2))  # 16 channels: the defect's kernel never runs
    >>> inductor_layout_optimization(shortcut, "auto"), inductor_layout_optimization(shortcut, "contiguous")
    (True, False)
    """
    if resolved_memory_format(memory_format, device_type) != "channels_last":
        return False
    if device_type != "cpu" or not onednn_below_avx512():
        return True
    probe = torch.empty(0)  # a CPU tensor: the defect's test asks only where the inputs are
    return not any(hits_onednn_1x1_defect(module, probe, True) for module in model.modules())


def _as_channels_last(tensor: Any) -> Any:
    if isinstance(tensor, torch.Tensor) and tensor.dim() == 4:
        return tensor.contiguous(memory_format=torch.channels_last)
    return tensor


def _input_hook(module: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...] | None:
    if not isinstance(module, nn.Conv2d) or not inputs:
        return None
    first = inputs[0]
    if isinstance(first, torch.Tensor) and hits_onednn_1x1_defect(module, first):
        return (first.contiguous(), *inputs[1:])  # channels-first: see the module's card
    return (_as_channels_last(first), *inputs[1:])


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
        if settings.get("compile"):  # inductor lays the convolutions out (inductor_layout_optimization)
            return None
        return cls() if resolved_memory_format(settings["memory_format"], device_type) == "channels_last" else None

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        return {"memory_format": resolved_memory_format(settings["memory_format"], device_type)}

    def forward_context(self) -> contextlib.AbstractContextManager:
        return channels_last_activations()
