"""``--compile``: the training forward pass (and the backward made from it) under ``torch.compile``.

The training forward calls ``torch.compile(model)``, a wrapper around the run's model; the model itself stays
the plain module, so its ``state_dict`` (checkpoints, ``model.pt``, a parameter server's flat buffers, surgery)
is the eager one. Not ``model.compile()``: it compiles the module's ``_call_impl``, which dynamo skips as torch
code, so a model whose top module is a torch container (an ``nn.Sequential``) came out not compiled at all; and
every call of the module would be compiled, the techniques' eval-mode passes with their layer hooks included
(dynamo does not guard on a module's hooks: one added after compiling was never called). Evaluation, those
passes and the memory probe call the plain module: eager. Dynamo's RNN support is turned on (without it a
network with an LSTM ran wholly eager); inductor lays out the convolutions as ``--memory-format`` says
(:func:`~scaletrain.efficient.channels_last.inductor_layout_optimization`), the channels-last hooks stay off.

A reconfiguration rebuilds modules inside the model: :meth:`TrainingForward.reconfigured` drops the compiled
code (``torch.compiler.reset``; dynamo's guards see the new parameters' sizes too and compile again, but keep
the old network's code and count each change towards their limit of 8 recompilations, past which the forward
runs eager) and wraps the new network, compiled on its first step. A compiled run starts with a reset too: an
earlier run in the process leaves neither code nor recompilations.

Compile time is measured directly: the seconds between the start and end of each of dynamo's compilations
(``torch._dynamo.callback``: tracing, inductor's code generation and the C++ compiler's, a backward compiled on
its first use), summed over the run.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from scaletrain.efficient.channels_last import inductor_layout_optimization

__all__ = ["TrainingForward"]


class _CompileClock:
    """The seconds this process spent in dynamo's compilations, from the callbacks dynamo runs at the start
    and end of each (nested ones count once). ``torch.compiler.reset`` removes the callbacks: they are
    installed again after each."""

    def __init__(self) -> None:
        self.total = 0.0
        self._began: float | None = None

    def install(self) -> None:
        from torch._dynamo import callback

        callback.on_compile_start(self._start)
        callback.on_compile_end(self._end)

    def _start(self, _: object) -> None:
        self._began = time.perf_counter()

    def _end(self, _: object) -> None:
        if self._began is not None:
            self.total += time.perf_counter() - self._began
            self._began = None


_CLOCK = _CompileClock()


class TrainingForward:
    """What the training forward pass calls: ``torch.compile(model)`` when ``compiled``, else the model.
    ``memory_format`` (``--memory-format``) and ``device_type`` say how inductor lays out the convolutions
    (:func:`~scaletrain.efficient.channels_last.inductor_layout_optimization`).

    >>> model = nn.Linear(2, 1)
    >>> TrainingForward(model, compiled=False).module is model
    True
    """

    def __init__(
        self, model: nn.Module, *, compiled: bool, memory_format: str = "auto", device_type: str = "cpu"
    ) -> None:
        self.compiled, self.memory_format, self.device_type = compiled, memory_format, device_type
        self._clock_at_start = _CLOCK.total
        self.module = self._wrapped(model)

    def _wrapped(self, model: nn.Module) -> nn.Module:
        if not self.compiled:
            return model
        torch.compiler.reset()  # no compiled code of another network (or run) is looked at again
        _CLOCK.install()
        # dynamo's support of RNN modules (experimental): without it a network with an LSTM runs wholly eager
        torch._dynamo.config.allow_rnn = True
        layout = inductor_layout_optimization(model, self.memory_format, self.device_type)
        return torch.compile(model, options={"layout_optimization": layout})

    def reconfigured(self, model: nn.Module) -> None:
        """After ``model`` changed shape: its next training forward compiles the new network."""
        self.module = self._wrapped(model)

    @property
    def compile_seconds(self) -> float | None:
        """The seconds spent compiling since this run began; ``None`` when it is not compiled."""
        return _CLOCK.total - self._clock_at_start if self.compiled else None
