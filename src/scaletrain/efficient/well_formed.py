"""What a change of the network leaves behind is well formed: every parameter, buffer and optimizer state a
reconfiguration produces is contiguous, owns a storage exactly as large as it needs and shares it with none of
the others. A view into a buffer its old owner frees (a parameter server's flat buffer of the old network) or a
deep copy that drags a whole flat buffer along are what this catches, where the network changes."""

from __future__ import annotations

import copy
from collections.abc import Iterable

import torch
from torch import nn

__all__ = ["check_well_formed", "own_copy", "owns_storage"]


def check_well_formed(tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Raise ``RuntimeError`` naming each tensor that is not well formed: not contiguous (the layout every
    parameter, buffer and optimizer state keeps; channels-last changes only the activations), a view into a
    larger storage or at an offset (a copy of a flat buffer, a slice of a freed tensor), or sharing its storage
    with another of them (a tensor named twice counts once). Called after every change of the network, on what
    the change produced.

    >>> check_well_formed([("weight", torch.zeros(4, 3))])
    >>> check_well_formed([("weight", torch.zeros(4, 6)[:, :3])])
    Traceback (most recent call last):
    RuntimeError: surgery left malformed tensors: weight is not contiguous
    """
    problems, owners, seen = [], {}, set()
    for name, tensor in tensors:
        if id(tensor) in seen:  # the same tensor reached twice (a module inside another that was produced)
            continue
        seen.add(id(tensor))
        storage = tensor.untyped_storage()
        needed = tensor.numel() * tensor.element_size()
        if not tensor.is_contiguous():
            problems.append(f"{name} is not contiguous")
        elif tensor.storage_offset() != 0 or storage.nbytes() != needed:
            problems.append(
                f"{name} is a view at offset {tensor.storage_offset()} into {storage.nbytes()} bytes (needs {needed})"
            )
        elif needed and storage.data_ptr() in owners:
            problems.append(f"{name} shares its storage with {owners[storage.data_ptr()]}")
        owners.setdefault(storage.data_ptr(), name)
    if problems:
        raise RuntimeError("surgery left malformed tensors: " + "; ".join(problems))


def own_copy(module: nn.Module) -> nn.Module:
    """``copy.deepcopy(module)`` whose every tensor has a storage of its own: deepcopy copies a view's whole
    storage (a parameter server's flat buffer, say) and keeps the view into it."""
    new = copy.deepcopy(module)
    for owner in new.modules():
        for name, buffer in list(owner.named_buffers(recurse=False)):
            if buffer is not None and (buffer.storage_offset() or not owns_storage(buffer)):
                owner.register_buffer(name, buffer.clone(), persistent=name not in owner._non_persistent_buffers_set)
        for name, parameter in list(owner.named_parameters(recurse=False)):
            if parameter.storage_offset() or not owns_storage(parameter):
                setattr(owner, name, nn.Parameter(parameter.detach().clone(), requires_grad=parameter.requires_grad))
    return new


def owns_storage(tensor: torch.Tensor) -> bool:
    return tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size() and tensor.is_contiguous()
