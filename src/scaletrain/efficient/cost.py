"""What a network costs: parameters, and floating-point operations per sample of a forward pass.

FLOPs count a multiply-add as two operations, for convolutions and linear layers only (batch norm,
activations and pooling add a few per cent on a ResNet; the literature's counts leave them out too).

>>> from torch import nn
>>> flops_per_sample(nn.Sequential(nn.Linear(10, 5)), torch.zeros(3, 10))
100.0
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

__all__ = [
    "channels_per_layer",
    "flops_per_sample",
    "layer_flops",
    "layers_run",
    "network_figures",
    "resource",
    "traced_forward",
]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def layers_run(model: nn.Module, example_inputs: Any) -> list[tuple[nn.Module, torch.Tensor]]:
    """Every convolution and linear layer one forward pass over ``example_inputs`` runs, in order, with
    its output (eval mode, no gradients; the model's mode is restored)."""
    ran: list[tuple[nn.Module, torch.Tensor]] = []
    layers = [m for m in model.modules() if isinstance(m, (*_CONVS, nn.Linear))]
    traced_forward(
        model, example_inputs, [layer.register_forward_hook(lambda m, i, o: ran.append((m, o))) for layer in layers]
    )
    return ran


def traced_forward(model: nn.Module, example_inputs: Any, hooks: list[RemovableHandle]) -> None:
    """One forward pass over ``example_inputs`` in eval mode without gradients, for ``hooks`` to watch;
    the model's mode is restored and the hooks removed afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example_inputs)
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()


def flops_per_sample(model: nn.Module, example_inputs: Any) -> float:
    """Forward FLOPs of one sample, counted over one eval-mode pass over ``example_inputs``."""
    return sum(layer_flops(model, example_inputs).values())


def layer_flops(model: nn.Module, example_inputs: Any) -> dict[str, float]:
    """Forward FLOPs of one sample per convolution and linear layer (by path; a layer run twice counts twice).

    >>> layer_flops(nn.Sequential(nn.Linear(10, 5), nn.Linear(5, 1)), torch.zeros(2, 10))
    {'0': 100.0, '1': 10.0}
    """
    names = {module: name for name, module in model.named_modules()}
    flops: dict[str, float] = {}
    for module, output in layers_run(model, example_inputs):
        if isinstance(module, _CONVS):
            per_output = module.in_channels // module.groups * int(torch.tensor(module.kernel_size).prod())
        else:
            per_output = module.in_features
        path = names[module]
        flops[path] = flops.get(path, 0.0) + 2.0 * per_output * output.numel() / output.shape[0]
    return flops


def resource(model: nn.Module, example_inputs: Any, kind: str) -> float:
    """FLOPs per sample or trainable parameters of ``model``."""
    if kind == "flops":
        return sum(layer_flops(model, example_inputs).values())
    return float(sum(p.numel() for p in model.parameters() if p.requires_grad))


def channels_per_layer(model: nn.Module) -> dict[str, int]:
    """Output channels (features) of every convolution and linear layer, by module path."""
    return {
        name: module.out_channels if isinstance(module, _CONVS) else module.out_features
        for name, module in model.named_modules()
        if isinstance(module, (*_CONVS, nn.Linear))
    }


def network_figures(model: nn.Module, example_inputs: Any) -> dict[str, Any]:
    """``parameters``, ``flops_per_sample`` and ``channels`` (per layer) of ``model``."""
    return {
        "parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "flops_per_sample": flops_per_sample(model, example_inputs),
        "channels": channels_per_layer(model),
    }
