"""What goes on the wire: the one place where exchanges turn gradients and weights into messages.

Every exchange packs through a :class:`WireCodec` and unpacks through the same one. A gradient is
compressed into a *payload* — tensors whose number, sizes and types are the codec's own — and
decompressed from it (Horovod's ``Compressor``: ``compress`` returns ``(payload, context)`` and
``decompress`` takes them back); under all-reduce the codec runs the collective itself
(:meth:`WireCodec.allreduce`: all-reduce a cast, all-gather a sparse payload, or PowerSGD's two
all-reduces of low-rank factors); under a parameter server the payload is the body of a gradient
message and the owner decompresses it before applying it. Whatever a codec carries from one message
to the next (error feedback's residuals) stays inside it. A codec is one class and one line in
:data:`CODECS`; the master copies stay float32, and a server's weights travel as the codec's
``dtype``. :class:`TensorLayout` is the fingerprint of a list of tensors' shapes that travels with
every message, so two processes that disagree about the network fail with both layouts named
instead of a gloo size error, a hang or a silent mis-read.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from scaletrain.errors import ConfigError, ScaletrainError

__all__ = [
    "CODECS",
    "BFloat16Codec",
    "Collectives",
    "Float16Codec",
    "LayoutMismatch",
    "TensorLayout",
    "WireCodec",
    "WireMismatch",
    "wire_codec",
]


class LayoutMismatch(ScaletrainError):
    """Two processes hold networks of different shapes."""


class WireMismatch(ScaletrainError):
    """Two processes encode gradients differently (another wire codec, or another version of one)."""


@dataclass(frozen=True)
class TensorLayout:
    """``layout_id``: a CRC-32 of the tensors' shapes in order; ``numel``: their element count;
    ``shapes``: the shapes themselves where known (a codec that works per matrix needs them; a layout
    read from a message header has none, and two layouts compare by id and count alone).

    >>> TensorLayout.of([torch.zeros(3, 2), torch.zeros(4)])
    TensorLayout(layout_id=4037939134, numel=10)
    >>> str(TensorLayout.of([torch.zeros(3, 2), torch.zeros(4)]))
    '#f0ae0fbe (10 elements)'
    >>> TensorLayout.of([torch.zeros(3, 2)]).shapes
    (torch.Size([3, 2]),)
    """

    layout_id: int
    numel: int
    shapes: tuple[torch.Size, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def of(cls, tensors: list[torch.Tensor]) -> TensorLayout:
        shapes = ";".join(",".join(str(size) for size in t.shape) for t in tensors)
        return cls(zlib.crc32(shapes.encode()), sum(t.numel() for t in tensors), tuple(t.shape for t in tensors))

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([self.layout_id, self.numel], dtype=torch.int64)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor) -> TensorLayout:
        layout_id, numel = (int(v) for v in tensor.tolist())
        return cls(layout_id, numel)

    def __str__(self) -> str:
        return f"#{self.layout_id:08x} ({self.numel} elements)"


@dataclass(frozen=True)
class Collectives:
    """The collectives a codec's :meth:`WireCodec.allreduce` calls, over ``group`` (None: the default group).
    An elastic run passes its own, which give up as soon as another member has seen a peer lost; a codec
    that calls ``dist`` directly instead would wait out ``--timeout`` there."""

    group: dist.ProcessGroup | None = None

    @property
    def world_size(self) -> int:
        return dist.get_world_size(self.group)

    def all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group, in place."""
        dist.all_reduce(tensor, group=self.group)

    def all_gather(self, parts: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """Every process's ``tensor`` into ``parts``, in rank order."""
        dist.all_gather(parts, tensor, group=self.group)


class WireCodec:
    """float32 on the wire: packing is a copy into one flat buffer, unpacking none at all.

    **Gradients** travel as a payload. What a codec defines (this class's are a cast to ``dtype``):

    - :meth:`compress` ``(flat, layout, stream) -> (payload, context)``: a flat float32 gradient as
      the tensors that travel; ``context`` is the :class:`TensorLayout` they decompress into (the
      owner of a parameter server has nothing else);
    - :meth:`decompress` ``(payload, context, out=None) -> flat``: the float32 gradient again;
    - :meth:`payload_spec` ``(layout)``: the element count and type of each payload tensor, which
      ``compress`` must match (a parameter server's gradient message is the payload's tensors back to
      back, :meth:`to_message` and :meth:`from_message`, received into a buffer of that size; its
      header carries the bytes, which the owner checks);
    - :meth:`allreduce` ``(flat, layout, stream=..., collectives=...) -> sum``: the sum over the group's
      processes, by whatever collectives of ``collectives`` the codec needs (:class:`Collectives`; here:
      compress, ``all_reduce`` each payload tensor, decompress — right for a payload whose sum is the
      compressed sum);
    - :meth:`reset`: forget what is carried between messages (the network changed shape).

    ``stream`` names a sequence of messages (the all-reduce, or one owner of a parameter server):
    with ``error_feedback`` each stream keeps what its last message lost (:meth:`corrected` and
    :meth:`carry`) and adds it to the next one (Seide et al. 2014; Karimireddy et al. 2019), so what is
    lost arrives later instead of never.

    **Weights** (a parameter server's replies) are cast to ``dtype`` afresh each time and need no
    feedback: :meth:`encode`, :meth:`buffer`, :meth:`receive_buffer`, :meth:`unpack`.

    >>> codec = WireCodec.of("bf16", error_feedback=True)
    >>> first = codec.encode_gradient(torch.tensor([1.0 + 2**-10]), stream="g")
    >>> float(first), float(codec.encode_gradient(torch.tensor([0.0]), stream="g"))
    (1.0, 0.0009765625)
    >>> layout = TensorLayout.of([torch.zeros(3)])
    >>> payload, context = codec.compress(torch.tensor([1.0, 2.0, 3.0]), layout)
    >>> [p.dtype for p in payload], codec.payload_bytes(layout), codec.decompress(payload, context).tolist()
    ([torch.bfloat16], 6, [1.0, 2.0, 3.0])
    """

    name = "fp32"
    dtype = torch.float32
    #: True for a codec whose payloads only add up under all-reduce (PowerSGD's factors): refused with
    #: the parameter servers before any process starts.
    all_reduce_only = False
    #: True for a codec published with error feedback as part of it (PowerSGD, top-k): on without
    #: ``--error-feedback`` (a codec built directly still takes ``error_feedback=False``).
    feedback_by_default = False
    #: How :meth:`allreduce` moves the payload, for the estimator: ``"all_reduce"`` (the payloads add up as
    #: they travel: a ring sends 2(N−1)/N of it per worker) or ``"all_gather"`` (every worker receives
    #: every other's payload, N−1 of it, and decompresses each: top-k).
    collective = "all_reduce"
    #: Collective calls per step once the codec compresses (PowerSGD: two, the P factors and the Q
    #: factors); each costs its own latencies.
    collective_calls = 1

    def __init__(self, error_feedback: bool = False) -> None:
        self.error_feedback = error_feedback
        self._residuals: dict[object, torch.Tensor] = {}

    @classmethod
    def parse_options(cls, options: dict[str, object]) -> dict[str, object]:
        """The codec's ``-W key=value`` options (``wire_options``) as keyword arguments of its
        constructor; one line naming the fix for a bad one. This codec takes none."""
        if options:
            raise ConfigError(f"wire codec {cls.name!r} takes no options (-W), got {', '.join(options)}")
        return {}

    def check_network(self, shapes: list[torch.Size]) -> None:
        """Refuse a network this codec cannot encode (one line naming the fix); checked before any
        process starts, and only for a codec that overrides it."""

    @property
    def bytes_per_value(self) -> int:
        """Bytes one weight takes on the wire."""
        return self.dtype.itemsize

    # -- gradients: what a codec of its own overrides ------------------------------------------------
    def compress(
        self, flat: torch.Tensor, layout: TensorLayout, stream: object = None
    ) -> tuple[list[torch.Tensor], TensorLayout]:
        """A flat float32 gradient of ``layout`` as the tensors that travel, and the context to
        decompress them with."""
        return [self.encode_gradient(flat, stream)], layout

    def decompress(
        self, payload: list[torch.Tensor], context: TensorLayout, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The flat float32 gradient a payload carries, in ``out`` when given (no copy when ``out`` is
        the payload itself, as for float32)."""
        (wire,) = payload
        if out is None:
            return wire if wire.dtype == torch.float32 else wire.float()
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        return out

    def payload_spec(self, layout: TensorLayout) -> list[tuple[int, torch.dtype]]:
        """Element count and type of each tensor :meth:`compress` returns for a gradient of ``layout``."""
        return [(layout.numel, self.dtype)]

    def allreduce(
        self, flat: torch.Tensor, layout: TensorLayout, *, stream: object = None, collectives: Collectives | None = None
    ) -> torch.Tensor:
        """The sum of every process's ``flat`` as float32 (``flat`` may be reused), through ``collectives``
        (None: ``dist``'s over the default group)."""
        collectives = collectives or Collectives()
        payload, context = self.compress(flat, layout, stream)
        for part in payload:
            collectives.all_reduce(part)
        return self.decompress(payload, context)

    def reset(self) -> None:
        """Forget what is carried between messages (the network changed shape)."""
        self._residuals.clear()

    def steady(self) -> WireCodec:
        """This codec past any dense start, as a run sends once it compresses (what a profile times);
        itself."""
        return self

    def state_dict(self) -> dict[str, object]:
        """What is carried between messages, for a checkpoint (each worker's own: its residuals)."""
        residuals = {stream: r.detach().cpu().clone() for stream, r in self._residuals.items()}
        return {"codec": self.name, "residuals": residuals}

    def load_state_dict(self, state: dict[str, object]) -> bool:
        """Carry on from :meth:`state_dict`: a resumed run then sends what the interrupted one would have.
        Another codec's state (the run resumed with another ``--wire``) is not taken: False."""
        if state.get("codec") != self.name:
            return False
        self._residuals = dict(state["residuals"])  # type: ignore[call-overload]
        return True

    # -- helpers every codec may use -----------------------------------------------------------------
    def payload_bytes(self, layout: TensorLayout) -> int:
        """Bytes of one gradient message of ``layout`` as it travels."""
        return _offsets(self.payload_spec(layout))[-1]

    def steady_payload_bytes(self, layout: TensorLayout) -> int:
        """Bytes of a gradient message of ``layout`` once the codec compresses (a codec that sends its
        first steps dense says the later ones' here): what the estimator predicts a step with."""
        return self.payload_bytes(layout)

    def to_message(self, payload: list[torch.Tensor], layout: TensorLayout) -> torch.Tensor:
        """A payload as one message body: the tensor itself when there is one, else its tensors' bytes
        back to back (each at a multiple of its element size); refused unless it is what
        :meth:`payload_spec` says."""
        spec = self.payload_spec(layout)
        if [(part.numel(), part.dtype) for part in payload] != spec:
            got = [(part.numel(), part.dtype) for part in payload]
            raise WireMismatch(f"wire codec {self.name!r} compressed into {got} but its payload_spec says {spec}")
        if len(payload) == 1:
            return payload[0].reshape(-1)
        offsets = _offsets(spec)
        body = torch.zeros(offsets[-1], dtype=torch.uint8)
        for part, start in zip(payload, offsets, strict=False):
            body[start : start + part.nbytes] = part.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        return body

    def message_buffer(self, layout: TensorLayout, out: torch.Tensor) -> torch.Tensor:
        """Where to receive a message that decompresses into ``out`` (``out`` itself when the payload is
        one tensor of its size and type: nothing to copy)."""
        spec = self.payload_spec(layout)
        if len(spec) > 1:
            return torch.zeros(self.payload_bytes(layout), dtype=torch.uint8)
        ((count, dtype),) = spec
        return out if (count, dtype) == (out.numel(), out.dtype) else torch.zeros(count, dtype=dtype)

    def from_message(self, body: torch.Tensor, layout: TensorLayout) -> list[torch.Tensor]:
        """The payload a message body holds (views of it)."""
        spec = self.payload_spec(layout)
        if len(spec) == 1:
            return [body]
        return [
            body[start : start + count * dtype.itemsize].view(dtype)
            for (count, dtype), start in zip(spec, _offsets(spec), strict=False)
        ]

    def corrected(self, flat: torch.Tensor, stream: object) -> torch.Tensor:
        """``flat`` plus what ``stream``'s last message lost (a new tensor); call :meth:`carry` after."""
        residual = self._residuals.get(stream)
        if residual is None or residual.numel() != flat.numel():
            residual = self._residuals[stream] = torch.zeros_like(flat, dtype=torch.float32)
        return flat + residual

    def carry(self, stream: object, corrected: torch.Tensor, sent: torch.Tensor) -> None:
        """Keep ``corrected - sent`` (what the message lost) for ``stream``'s next message."""
        residual = self._residuals[stream]
        torch.sub(corrected, sent, out=residual)
        torch.nan_to_num_(residual, nan=0.0, posinf=0.0, neginf=0.0)  # an overflowed step carries nothing on

    # -- the cast: gradients of this class, and every codec's weights ----------------------------------
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
        """A flat float32 gradient cast to ``dtype``; with error feedback, plus what ``stream``'s last
        message lost to rounding (that loss is then this message's)."""
        if not self.error_feedback or self.dtype == torch.float32:
            return self.encode(flat)
        corrected = self.corrected(flat, stream)
        wire = corrected.to(self.dtype)
        self.carry(stream, corrected, wire)
        return wire

    def receive_buffer(self, out: torch.Tensor) -> torch.Tensor:
        """Where to receive weights that will be unpacked into ``out`` (``out`` itself when nothing is
        encoded)."""
        return out if out.dtype == self.dtype else self.buffer(out.numel())

    def unpack(self, wire: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The float32 values of ``wire`` in ``out`` (the same tensor when nothing is encoded)."""
        if wire.data_ptr() != out.data_ptr():
            out.copy_(wire)
        return out

    @classmethod
    def of(
        cls, name: str = "fp32", *, error_feedback: bool = False, options: dict[str, object] | None = None
    ) -> WireCodec:
        try:
            kind = CODECS[name]
        except KeyError:
            raise ScaletrainError(f"unknown wire codec {name!r}; choose one of {', '.join(CODECS)}") from None
        return kind(error_feedback or kind.feedback_by_default, **kind.parse_options(dict(options or {})))


class BFloat16Codec(WireCodec):
    """bfloat16 on the wire: half the bytes, float32's range, 8 bits of mantissa."""

    name = "bf16"
    dtype = torch.bfloat16


class Float16Codec(WireCodec):
    """float16 on the wire (Horovod's ``Compression.fp16``): half the bytes, 11 bits of mantissa, but
    values beyond ±65,504 become infinite — a step that overflows is skipped under ``--loss-scale``."""

    name = "fp16"
    dtype = torch.float16


def _offsets(spec: list[tuple[int, torch.dtype]]) -> list[int]:
    """Where each payload tensor starts in a message body, and its end (a tensor starts at a multiple
    of its element size, so that it can be read in place).

    >>> _offsets([(3, torch.int8), (2, torch.float32)])
    [0, 4, 12]
    """
    starts, end = [], 0
    for count, dtype in spec:
        end += -end % dtype.itemsize
        starts.append(end)
        end += count * dtype.itemsize
    return [*starts, end]


def wire_codec(config: object) -> WireCodec:
    """The codec a run's ``wire``, ``wire_options`` and ``error_feedback`` settings name (a fresh one per
    exchange)."""
    options = getattr(config, "wire_options", None)
    return WireCodec.of(config.wire, error_feedback=config.error_feedback, options=options)


#: Codecs by name: a class above (or in a module of one's own, see :mod:`scaletrain.plugins`) and a line here.
CODECS: dict[str, type[WireCodec]] = {}
CODECS["fp32"] = WireCodec
CODECS["bf16"] = BFloat16Codec
CODECS["fp16"] = Float16Codec
