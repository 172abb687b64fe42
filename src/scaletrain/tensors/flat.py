"""Packing tensors into one flat buffer for transfer, views back into it, their mean over processes, and an inf/nan
check."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

__all__ = ["finite", "flatten", "mean_over", "unflatten_into", "views_of"]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One contiguous float buffer holding ``tensors`` back to back."""
    if not tensors:
        return torch.zeros(0)
    return torch.cat([tensor.reshape(-1) for tensor in tensors])


def mean_over(
    tensors: Sequence[torch.Tensor], all_reduce: Callable[[torch.Tensor], None], processes: int
) -> torch.Tensor | None:
    """``tensors`` in float32 in one flat buffer (:func:`flatten`), summed over ``processes`` by ``all_reduce`` and
    divided by their count: every process's mean; None for no tensors.

    >>> mean_over([torch.ones(2), torch.full((1,), 3.0)], lambda flat: flat.mul_(2), 2)  # two processes alike
    tensor([1., 1., 3.])
    """
    if not tensors:
        return None
    flat = flatten([tensor.detach().float() for tensor in tensors])
    all_reduce(flat)
    return flat.div_(processes)


def unflatten_into(buffer: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``buffer`` (as made by :func:`flatten`) back into ``tensors`` in place."""
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(buffer[offset : offset + count].view_as(tensor))
        offset += count
    if offset != buffer.numel():
        raise ValueError(f"buffer holds {buffer.numel()} values but the tensors take {offset}")


def views_of(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``like``, back to back (the layout of :func:`flatten`)."""
    views, offset = [], 0
    for tensor in like:
        views.append(flat[offset : offset + tensor.numel()].view_as(tensor))
        offset += tensor.numel()
    return views


def finite(tensors: list[torch.Tensor]) -> bool:
    """No inf or nan in any of ``tensors`` (one sum per tensor: an overflowing sum counts as inf too)."""
    return not tensors or bool(torch.isfinite(torch.stack([t.sum() for t in tensors])).all())
