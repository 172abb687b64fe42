"""MXNet 1.9 program, ``gpt``'s optimizer: AdamW and scaletrain's rate schedule as MXNet objects.

MXNet 1.9 has no AdamW optimizer; it has the operator ``contrib.adamw_update``
(``w ← w − η·(lr·m / (√v + ε) + λ·w)``, no bias correction). :class:`AdamW` calls it with η the scheduled rate and
lr ``√(1−β₂ᵗ)/(1−β₁ᵗ)``, the correction folded into the rate as MXNet's own ``Adam`` does, so ε is added to the
uncorrected ``√v`` where torch adds it to the corrected one (ε/√(1−β₂ᵗ) in torch's terms: 3.2e-7 at the first
update, 1e-8 once ``t`` is large); everything else is torch's AdamW. :class:`Schedule` is the rate of
``gpt_common.learning_rate``. Both are pickled to the servers of a ``dist_async`` run, which import this module
from the program's folder: so they are defined at the top level, MXNet imported there, and the programs import this
module only once the threads are set. Elsewhere (scaletrain's doctests import every module) it defines nothing.
"""

from __future__ import annotations

import math

try:
    import gpt_common  # beside this file
    import mxnet as mx
except ImportError:  # not in MXNet's environment, or not from the program's folder
    mx = None


if mx is not None:

    class Schedule(mx.lr_scheduler.LRScheduler):
        """scaletrain's schedule for the spec: MXNet's ``num_update`` counts from 1, scaletrain's updates from 0."""

        def __init__(self, spec: dict) -> None:
            super().__init__(base_lr=spec["lr"])
            self.spec = {"lr": spec["lr"], "schedule": spec["schedule"]}

        def __call__(self, num_update: int) -> float:
            return gpt_common.learning_rate(self.spec, num_update - 1)

    class AdamW(mx.optimizer.Optimizer):
        """AdamW through ``contrib.adamw_update`` (the module's docstring says where it departs from torch's)."""

        def __init__(self, beta1: float, beta2: float, epsilon: float, **kwargs) -> None:
            super().__init__(**kwargs)
            self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

        def create_state(self, index, weight):
            return tuple(mx.nd.zeros(weight.shape, weight.context, dtype=weight.dtype) for _ in range(2))

        def update(self, index, weight, grad, state) -> None:
            self._update_count(index)
            rate, decay = self._get_lr(index), self._get_wd(index)
            t = self._index_update_count[index]
            correction = math.sqrt(1.0 - self.beta2**t) / (1.0 - self.beta1**t)
            mean, variance = state
            mx.nd.contrib.adamw_update(
                weight, grad, mean, variance, rescale_grad=self.rescale_grad, lr=correction, eta=rate,
                beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon, wd=decay, out=weight,
            )  # fmt: skip

    def optimizer(spec: dict) -> AdamW:
        """The spec's AdamW at its schedule; the gradient it is given is already the mean over the batch's words."""
        settings = spec["optimizer"]
        beta1, beta2 = settings["betas"]
        return AdamW(
            beta1,
            beta2,
            settings["eps"],
            learning_rate=spec["lr"],
            lr_scheduler=Schedule(spec),
            wd=settings["weight_decay"],
        )
