"""MXNet 1.9 program, ``gpt``'s optimizer: AdamW and scaletrain's rate schedule as MXNet objects.

MXNet 1.9 has no AdamW optimizer; it has the operator ``contrib.adamw_update``
(``w ← w − η·(lr·m / (√v + ε) + λ·w)``, no bias correction). :class:`AdamW` calls it with η the scheduled rate,
lr ``√(1−β₂ᵗ)/(1−β₁ᵗ)`` (the correction folded into the rate, as MXNet's own ``Adam`` does) and ε times
``√(1−β₂ᵗ)``, which makes it torch's AdamW exactly: ``w ← w − η·λ·w − η/(1−β₁ᵗ) · m / (√v/√(1−β₂ᵗ) + ε)``.
:class:`Schedule` is the rate of ``gpt_common.learning_rate``. Both are pickled to the servers of a ``dist_async``
run, which import this module from the program's folder while ``import mxnet`` is still running: so they are defined
at the top level from MXNet's submodules, and the programs import this module only once the threads are set.
Elsewhere (scaletrain's doctests import every module) it defines nothing.
"""

from __future__ import annotations

import math

try:  # from the submodules: a server unpickles these while ``import mxnet`` is still running
    import gpt_common  # beside this file
    from mxnet.lr_scheduler import LRScheduler
    from mxnet.ndarray import zeros
    from mxnet.ndarray.contrib import adamw_update
    from mxnet.optimizer import Optimizer
except ImportError:  # not in MXNet's environment, or not from the program's folder
    Optimizer = None


if Optimizer is not None:

    class Schedule(LRScheduler):
        """scaletrain's schedule for the spec: MXNet's ``num_update`` counts from 1, scaletrain's updates from 0."""

        def __init__(self, spec: dict) -> None:
            super().__init__(base_lr=spec["lr"])
            self.spec = {"lr": spec["lr"], "schedule": spec["schedule"]}

        def __call__(self, num_update: int) -> float:
            return gpt_common.learning_rate(self.spec, num_update - 1)

    class AdamW(Optimizer):
        """torch's AdamW through ``contrib.adamw_update`` (the module's docstring says how)."""

        def __init__(self, beta1: float, beta2: float, epsilon: float, **kwargs) -> None:
            super().__init__(**kwargs)
            self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

        def create_state(self, index, weight):
            return tuple(zeros(weight.shape, weight.context, dtype=weight.dtype) for _ in range(2))

        def update(self, index, weight, grad, state) -> None:
            self._update_count(index)
            rate, decay = self._get_lr(index), self._get_wd(index)
            t = self._index_update_count[index]
            root = math.sqrt(1.0 - self.beta2**t)  # √(1−β₂ᵗ)
            mean, variance = state
            adamw_update(
                weight, grad, mean, variance, rescale_grad=self.rescale_grad, lr=root / (1.0 - self.beta1**t),
                eta=rate, beta1=self.beta1, beta2=self.beta2, epsilon=self.epsilon * root, wd=decay, out=weight,
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
