"""What goes on the wire: the one place where exchanges pack gradients and weights into flat buffers.

Every exchange (all-reduce, a parameter-server worker and its server) packs through a
:class:`WireCodec` and unpacks through the same one, so a codec that sends fewer bytes (bf16 or
fp16, with error feedback) is one new class and one line in :data:`CODECS`; the master copies stay
float32. :class:`TensorLayout` is the fingerprint of a list of tensors' shapes that travels with
every message, so two processes that disagree about the network fail with both layouts named
instead of a gloo size error, a hang or a silent mis-read.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch

from scaletrain.errors import ScaletrainError
from scaletrain.parallel.sharding import unflatten_into

__all__ = ["CODECS", "LayoutMismatch", "TensorLayout", "WireCodec"]


class LayoutMismatch(ScaletrainError):
    """Two processes hold networks of different shapes."""


@dataclass(frozen=True)
class TensorLayout:
    """``layout_id``: a CRC-32 of the tensors' shapes in order; ``numel``: their element count.

    >>> TensorLayout.of([torch.zeros(3, 2), torch.zeros(4)])
    TensorLayout(layout_id=4037939134, numel=10)
    >>> str(TensorLayout.of([torch.zeros(3, 2), torch.zeros(4)]))
    '#f0ae0fbe (10 elements)'
    """

    layout_id: int
    numel: int

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> TensorLayout:
        shapes = ";".join(",".join(str(size) for size in t.shape) for t in tensors)
        return cls(zlib.crc32(shapes.encode()), sum(t.numel() for t in tensors))

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.layout_id, self.numel], dtype=torch.int64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> TensorLayout:
        layout_id, numel = (int(v) for v in tensor.tolist())
        return cls(layout_id, numel)

    def __str__(self) -> str:
        return f"#{self.layout_id:08x} ({self.numel} elements)"


class WireCodec:
    """float32 on the wire: packing is a copy into one flat buffer, unpacking none at all."""

    name = "fp32"
    dtype = torch.float32

    def buffer(self, numel: int) -> torch.Tensor:
        """A reusable flat buffer of what travels, for ``numel`` values."""
        return torch.zeros(numel, dtype=self.dtype)

    def pack(self, tensors: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """``tensors`` back to back in one flat wire buffer (``out`` when given)."""
        flat = [t.reshape(-1) for t in tensors]
        if out is None:
            return torch.cat(flat).to(self.dtype)
        return torch.cat(flat, out=out)

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat float32 buffer as it travels (itself when nothing is encoded: no copy per message)."""
        return flat if flat.dtype == self.dtype else flat.to(self.dtype)

    def receive_buffer(self, out: torch.Tensor) -> torch.Tensor:
        """Where to receive what will be unpacked into ``out`` (``out`` itself when nothing is encoded)."""
        return out if out.dtype == self.dtype else self.buffer(out.numel())

    def unpack(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The float32 values of ``wire`` in ``out`` (the same tensor when nothing is encoded)."""
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        return out

    def encode_gradients(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        return self.pack(gradients)

    def decode_mean_into(self, wire: torch.Tensor, gradients: list[torch.Tensor], count: int) -> None:
        """The all-reduced sum in ``wire`` ÷ ``count``, written back into ``gradients``."""
        wire /= count
        unflatten_into(wire, gradients)

    @classmethod
    def of(cls, name: str = "fp32") -> WireCodec:
        try:
            return CODECS[name]()
        except KeyError:
            raise ScaletrainError(f"unknown wire codec {name!r}; choose one of {', '.join(CODECS)}") from None


#: Codecs by name; add a class above and a line here.
CODECS: dict[str, type[WireCodec]] = {"fp32": WireCodec}
