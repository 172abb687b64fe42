"""Mixed precision: the forward pass in bfloat16 or float16 under ``torch.autocast``, float32 master
weights, and dynamic loss scaling whose skip decisions every process shares.

**Method card** (Micikevicius et al. 2018, "Mixed Precision Training"; Dortmund thesis, SPEC §5:
~28 % per epoch on one GPU). Autocast runs matrix products and convolutions in the narrow type and
keeps reductions and the weights in float32. float16's 5 exponent bits underflow small gradients, so
the loss is multiplied by a scale *S* before the backward pass and the gradients divided by *S*
after it; a step whose gradients overflowed (inf or nan) is skipped and *S* halved, and after
``growth_interval`` clean steps *S* doubles (the defaults of ``torch.amp.GradScaler``: *S* = 2¹⁶,
×2 after 2,000 steps, ×½ on overflow). bfloat16 has float32's exponent range and needs no scaling.

**Why not ``GradScaler`` itself.** It decides from the gradients of the process it runs in. In a
data-parallel run the step is taken on the *exchanged* gradient — by every worker after an
all-reduce, or by a parameter server — so the decision has to follow what was exchanged: each
worker unscales its own gradients before the exchange and, if any value overflowed, fills all of
them with nan; the exchange carries the nan to every worker (an all-reduce sum) or to every owner
(each parameter-server shard); whoever steps skips a non-finite gradient, and the workers learn the
outcome (all-reduce: their own identical gradients; parameter server: a flag in the reply). Every
process then updates *S* from the same decision, so the scales never drift apart and the weights
stay equal across workers.

**Where it runs.** bfloat16 on CPUs (AVX-512 BF16 makes conv nets about twice as fast here) and
GPUs; float16 on GPUs only. The scaling works under any precision (``--loss-scale`` with float32
or bfloat16 is allowed; it is how the tests force an overflow on a CPU).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import nn

from scaletrain.efficient.base import Technique
from scaletrain.efficient.settings import Setting
from scaletrain.errors import ConfigError
from scaletrain.tensors.flat import finite

__all__ = ["DTYPES", "LossScale", "Precision", "parse_loss_scale", "poison_if_overflowed"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
#: ``torch.amp.GradScaler``'s defaults.
INITIAL_SCALE, GROWTH_INTERVAL = 2.0**16, 2000


def parse_loss_scale(value: str | float | None, precision: str) -> float | None:
    """``--loss-scale`` → the initial dynamic scale, or ``None`` for none. Unset: dynamic for fp16 only.

    >>> parse_loss_scale(None, "fp16"), parse_loss_scale("off", "fp16"), parse_loss_scale("1e4", "bf16")
    (65536.0, None, 10000.0)
    """
    if value is None:
        return INITIAL_SCALE if precision == "fp16" else None
    if value in ("off", "none"):
        return None
    if value == "dynamic":
        return INITIAL_SCALE
    try:
        scale = float(value)
    except (TypeError, ValueError):
        scale = math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise ConfigError(f"--loss-scale must be off, dynamic or a starting scale > 0, got {value!r}")
    return scale


def poison_if_overflowed(gradients: list[torch.Tensor]) -> bool:
    """If any gradient holds inf or nan, fill every one with nan (so that the exchange carries the
    overflow to every process); whether it did. One reduction per tensor.

    >>> g = [torch.ones(2), torch.tensor([1.0, float("inf")])]
    >>> poison_if_overflowed(g), g[0]
    (True, tensor([nan, nan]))
    """
    if finite(gradients):
        return False
    for gradient in gradients:
        gradient.fill_(math.nan)
    return True


@dataclass
class LossScale:
    """Dynamic loss scaling's state: the scale, clean steps since the last change, steps skipped.

    >>> scale = LossScale(8.0, growth_interval=2)
    >>> scale.update(skipped=True); scale.value
    4.0
    >>> scale.update(skipped=False); scale.update(skipped=False); scale.value, scale.skipped
    (8.0, 1)
    """

    value: float
    growth_interval: int = GROWTH_INTERVAL
    clean: int = 0
    skipped: int = 0

    def update(self, *, skipped: bool) -> None:
        if skipped:
            self.value, self.clean, self.skipped = self.value / 2, 0, self.skipped + 1
            return
        self.clean += 1
        if self.clean >= self.growth_interval:
            self.value, self.clean = self.value * 2, 0


@dataclass
class Precision(Technique):
    """``--precision`` and ``--loss-scale`` as a technique; see the module's method card."""

    name: ClassVar[str] = "precision"
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(
            "precision",
            "the forward pass's type under autocast; weights stay float32 (fp16: CUDA only)",
            choices=tuple(sorted(DTYPES)),
        ),
        Setting(
            "loss_scale",
            "dynamic loss scaling, starting at SCALE (dynamic: 65536); overflowed steps are skipped on every "
            "process (default: dynamic for fp16, else off)",
            metavar="off|dynamic|SCALE",
        ),
    )

    precision: str = "fp32"
    initial_scale: float | None = None  # the dynamic loss scale to start from; None: no scaling
    device_type: str = "cpu"
    growth_interval: int = GROWTH_INTERVAL
    scale: LossScale | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        _refuse_unless_runs(self.precision, self.device_type)
        if self.initial_scale is not None:
            self.scale = LossScale(self.initial_scale, self.growth_interval)

    @classmethod
    def check(cls, settings: Mapping[str, Any]) -> None:
        """``--loss-scale``, then ``--precision``: fp16 only where the workers' device can be a GPU."""
        parse_loss_scale(settings["loss_scale"], settings["precision"])
        device = settings.get("device", "auto")
        on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
        _refuse_unless_runs(settings["precision"], "cpu" if on_cpu else "cuda")

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any], device_type: str = "cpu") -> Precision | None:
        """What ``precision`` and ``loss_scale`` ask for; ``None`` for plain float32.

        >>> Precision.from_settings({"precision": "bf16", "loss_scale": None}).precision
        'bf16'
        """
        scale = parse_loss_scale(settings["loss_scale"], settings["precision"])
        if settings["precision"] == "fp32" and scale is None:
            return None
        return cls(precision=settings["precision"], initial_scale=scale, device_type=device_type)

    @classmethod
    def summary_fields(
        cls, settings: Mapping[str, Any], device_type: str, technique: Technique | None
    ) -> dict[str, Any]:
        return {"precision": settings["precision"]}

    @classmethod
    def label(cls, settings: Mapping[str, Any]) -> str:
        """``bf16, no loss scaling``: the settings a checkpoint must be resumed with (they decide whether
        this technique is stacked, and so how the stack's saved state is laid out)."""
        scaling = parse_loss_scale(settings["loss_scale"], settings["precision"]) is not None
        return f"{settings['precision']}, {'dynamic loss scaling' if scaling else 'no loss scaling'}"

    @property
    def skips_nonfinite(self) -> bool:
        """The step is skipped, not failed, when the exchanged gradient overflowed."""
        return self.scale is not None

    @property
    def loss_scale(self) -> float | None:
        return None if self.scale is None else self.scale.value

    def forward_context(self) -> contextlib.AbstractContextManager:
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=DTYPES[self.precision])

    def objective(self, loss: torch.Tensor, model: nn.Module) -> torch.Tensor:
        return loss if self.scale is None else loss * self.scale.value

    def after_backward(self, model: nn.Module) -> None:
        if self.scale is None:
            return
        gradients = [p.grad for p in model.parameters() if p.grad is not None]
        if not poison_if_overflowed(gradients):
            torch._foreach_mul_(gradients, 1.0 / self.scale.value)

    def after_exchange(self, skipped: bool) -> None:
        if self.scale is not None:
            self.scale.update(skipped=skipped)

    def state_dict(self) -> dict[str, Any]:
        if self.scale is None:
            return {}
        return {"scale": self.scale.value, "clean": self.scale.clean, "skipped": self.scale.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scale is not None and state:
            self.scale.value, self.scale.clean, self.scale.skipped = state["scale"], state["clean"], state["skipped"]


def _refuse_unless_runs(precision: str, device_type: str) -> None:
    if precision not in DTYPES:
        raise ConfigError(f"--precision must be one of {', '.join(DTYPES)}, got {precision!r}")
    if precision == "fp16" and device_type != "cuda":
        raise ConfigError(
            "--precision fp16 runs on CUDA devices only (float16 autocast on a CPU is slow and not supported "
            "here); on a CPU use --precision bf16"
        )
