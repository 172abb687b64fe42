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
from scaletrain.tensors.flat import unflatten_into

__all__ = ["CODECS", "BFloat16Codec", "Float16Codec", "LayoutMismatch", "TensorLayout", "WireCodec", "wire_codec"]


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
    """float32 on the wire: packing is a copy into one flat buffer, unpacking none at all.

    A narrower codec sets ``name`` and ``dtype``; with ``error_feedback`` each gradient stream keeps the
    rounding error of its last message and adds it to the next one (Seide et al. 2014; Karimireddy et
    al. 2019), so what is lost to rounding arrives later instead of never. Weights (a parameter
    server's replies) are rounded afresh each time and need none.

    >>> codec = WireCodec.of("bf16", error_feedback=True)
    >>> first = codec.encode_gradient(torch.tensor([1.0 + 2**-10]), stream="g")
    >>> float(first), float(codec.encode_gradient(torch.tensor([0.0]), stream="g"))
    (1.0, 0.0009765625)
    """

    name = "fp32"
    dtype = torch.float32

    def __init__(self, error_feedback: bool = False) -> None:
        self.error_feedback = error_feedback
        self._residuals: dict[object, torch.Tensor] = {}

    @property
    def bytes_per_value(self) -> int:
        """Bytes one float32 value takes on the wire."""
        return self.dtype.itemsize

    def buffer(self, numel: int) -> torch.Tensor:
        """A reusable flat buffer of what travels, for ``numel`` values."""
        return torch.zeros(numel, dtype=self.dtype)

    def pack(self, tensors: list[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
        """``tensors`` back to back in one flat float32 buffer (``out`` when given)."""
        flat = [t.reshape(-1) for t in tensors]
        if out is None:
            return torch.cat(flat).float()
        return torch.cat(flat, out=out)

    def encode(self, flat: torch.Tensor) -> torch.Tensor:
        """A flat float32 buffer as it travels (itself when nothing is encoded: no copy per message)."""
        return flat if flat.dtype == self.dtype else flat.to(self.dtype)

    def encode_gradient(self, flat: torch.Tensor, stream: object = None) -> torch.Tensor:
        """A flat float32 gradient as it travels; with error feedback, plus what ``stream``'s last
        message lost to rounding (that loss is then this message's)."""
        if not self.error_feedback or self.dtype == torch.float32:
            return self.encode(flat)
        residual = self._residuals.get(stream)
        if residual is None or residual.numel() != flat.numel():
            residual = torch.zeros_like(flat, dtype=torch.float32)
        corrected = flat + residual
        wire = corrected.to(self.dtype)
        torch.sub(corrected, wire, out=residual)
        torch.nan_to_num_(residual, nan=0.0, posinf=0.0, neginf=0.0)  # an overflowed step carries nothing on
        self._residuals[stream] = residual
        return wire

    def reset(self) -> None:
        """Forget the carried rounding errors (the network changed shape)."""
        self._residuals.clear()

    def receive_buffer(self, out: torch.Tensor) -> torch.Tensor:
        """Where to receive what will be unpacked into ``out`` (``out`` itself when nothing is encoded)."""
        return out if out.dtype == self.dtype else self.buffer(out.numel())

    def unpack(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The float32 values of ``wire`` in ``out`` (the same tensor when nothing is encoded)."""
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        return out

    def encode_gradients(self, gradients: list[torch.Tensor]) -> torch.Tensor:
        """A worker's gradients as one all-reduce message."""
        return self.encode_gradient(self.pack(gradients), stream="all-reduce")

    def decode_mean_into(self, wire: torch.Tensor, gradients: list[torch.Tensor], count: int) -> None:
        """The all-reduced sum in ``wire`` ÷ ``count``, written back into ``gradients`` as float32."""
        total = wire if wire.dtype == torch.float32 else wire.float()
        total /= count
        unflatten_into(total, gradients)

    @classmethod
    def of(cls, name: str = "fp32", *, error_feedback: bool = False) -> WireCodec:
        try:
            return CODECS[name](error_feedback)
        except KeyError:
            raise ScaletrainError(f"unknown wire codec {name!r}; choose one of {', '.join(CODECS)}") from None


class BFloat16Codec(WireCodec):
    """bfloat16 on the wire: half the bytes, float32's range, 8 bits of mantissa."""

    name = "bf16"
    dtype = torch.bfloat16


class Float16Codec(WireCodec):
    """float16 on the wire (Horovod's ``Compression.fp16``): half the bytes, 11 bits of mantissa, but
    values beyond ±65,504 become infinite — a step that overflows is skipped under ``--loss-scale``."""

    name = "fp16"
    dtype = torch.float16


def wire_codec(config: object) -> WireCodec:
    """The codec a run's ``wire`` and ``error_feedback`` settings name (a fresh one per exchange)."""
    return WireCodec.of(config.wire, error_feedback=config.error_feedback)


#: Codecs by name; add a class above and a line here.
CODECS: dict[str, type[WireCodec]] = {"fp32": WireCodec, "bf16": BFloat16Codec, "fp16": Float16Codec}
