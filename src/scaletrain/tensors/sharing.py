"""Handing a Python object to fresh processes on this machine, its tensors shared rather than copied.

The object is pickled with cloudpickle, so that a class or function defined in a notebook's or a
script's ``__main__`` travels by value (a class in an importable module travels by name, as pickle
does it). Every CPU tensor of at least :data:`SHARED_BYTES` that the object holds (a dataset's
inputs and labels, say) is left out of the pickle: its storage is written once, to one file beside
it, and every process that loads the object maps that file (``mmap``, private: what a process writes
stays its own, as after ``fork``). N processes then share the page cache's one copy of the data
instead of unpickling N copies of it. A tensor that is a view shares its storage's place in the file.

>>> import tempfile
>>> folder = Path(tempfile.mkdtemp())
>>> data = {"inputs": torch.arange(100_000.0).view(1000, 100)[::2], "small": torch.ones(3)}
>>> back = load(dump(data, folder))
>>> torch.equal(back["inputs"], data["inputs"]), torch.equal(back["small"], data["small"])
(True, True)
>>> (folder / TENSORS_NAME).stat().st_size  # the inputs' storage; the small tensor is inside the pickle
400000
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import IO, Any

import cloudpickle
import torch

__all__ = ["PICKLE_NAME", "SHARED_BYTES", "TENSORS_NAME", "dump", "load"]

PICKLE_NAME = "object.pickle"
TENSORS_NAME = "tensors.bin"
#: Smaller tensors (a model's parameters, a few constants) travel inside the pickle.
SHARED_BYTES = 64 * 1024
#: Every storage starts at a multiple of this in the file, so any dtype's elements are aligned.
ALIGNMENT = 64
_TENSOR = "tensor"


def dump(obj: Any, folder: Path) -> Path:
    """Pickle ``obj`` into ``folder`` (its tensors into a file beside it); the pickle's path, for :func:`load`.

    Raises what pickling raises (``pickle.PicklingError``, ``TypeError`` …) for an object that cannot be
    pickled; the caller says what to do.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / PICKLE_NAME
    with (folder / TENSORS_NAME).open("wb") as tensors:
        buffer = io.BytesIO()
        _SharingPickler(buffer, tensors).dump(obj)
    path.write_bytes(buffer.getvalue())
    return path


def load(path: Path) -> Any:
    """The object :func:`dump` wrote to ``path``, its large tensors mapped from the file beside it."""
    tensors = path.parent / TENSORS_NAME
    size = tensors.stat().st_size if tensors.exists() else 0
    storage = torch.UntypedStorage.from_file(str(tensors), shared=False, nbytes=size) if size else None
    with path.open("rb") as file:
        return _SharingUnpickler(file, storage).load()


class _SharingPickler(cloudpickle.Pickler):
    """cloudpickle, with each large CPU tensor's storage written once to ``tensors`` and named in the pickle."""

    def __init__(self, file: IO[bytes], tensors: IO[bytes]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self._tensors = tensors
        self._offsets: dict[tuple[int, int], int] = {}  # (address, bytes) of a storage → where it is in the file

    def persistent_id(self, obj: Any) -> Any:
        if not _shareable(obj):
            return None
        storage = obj.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in self._offsets:
            self._offsets[key] = self._append(storage)
        dtype = str(obj.dtype).removeprefix("torch.")
        return (_TENSOR, self._offsets[key], dtype, tuple(obj.shape), obj.stride(), obj.storage_offset())

    def _append(self, storage: torch.UntypedStorage) -> int:
        offset = self._tensors.tell()
        padding = -offset % ALIGNMENT
        self._tensors.write(b"\0" * padding)
        # The storage's bytes as they are, through a byte view of it: no copy of a large dataset here.
        self._tensors.write(memoryview(torch.empty(0, dtype=torch.uint8).set_(storage).numpy()))
        return offset + padding


def _shareable(obj: Any) -> bool:
    # exactly torch.Tensor: a Parameter (or another subclass) pickles itself, its .data then comes here
    if type(obj) is not torch.Tensor or obj.device.type != "cpu" or obj.layout != torch.strided:
        return False
    if obj.requires_grad or obj.is_quantized or obj.is_conj() or obj.is_neg():
        return False
    return obj.untyped_storage().nbytes() >= SHARED_BYTES


class _SharingUnpickler(pickle.Unpickler):
    """Makes each tensor :class:`_SharingPickler` named a view of the one mapped ``storage``."""

    def __init__(self, file: IO[bytes], storage: torch.UntypedStorage | None) -> None:
        super().__init__(file)
        self._storage = storage

    def persistent_load(self, pid: Any) -> torch.Tensor:
        kind, offset, dtype_name, shape, stride, storage_offset = pid
        if kind != _TENSOR or self._storage is None:
            raise pickle.UnpicklingError(f"the pickle names a {kind} that is not in {TENSORS_NAME}")
        dtype = getattr(torch, dtype_name)
        element = torch.empty((), dtype=dtype).element_size()
        start = offset // element + storage_offset
        return torch.empty(0, dtype=dtype).set_(self._storage, start, shape, stride)
