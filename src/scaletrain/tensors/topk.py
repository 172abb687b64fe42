"""``--wire topk``: the largest-magnitude fraction of each gradient, with its indices.

Top-k sparsification (Aji & Heafield 2017; with error feedback, Stich, Cordonnier & Jaggi 2018): of a
gradient message only the ``ratio`` of its values largest in magnitude travel, each with its int32
index — 8 bytes a kept value, so ``-W ratio=0.01`` sends 2 % of float32's bytes. With
``error_feedback`` what a message left out is added to the next message of the same stream, so it
travels once it has grown large enough. Workers keep different indices, so their payloads do not add
up as they travel: under all-reduce every worker all-gathers the others' values and indices and adds
them in rank order (the same sum everywhere); a parameter server's owner decompresses each worker's
payload before applying it, and its replies travel as float32, as with ``--wire fp32``.

Option (``-W key=value``): ``ratio`` in (0, 1] (default 0.01); ``ratio=1`` sends every value.

>>> codec = TopK(ratio=0.25)
>>> layout = TensorLayout.of([torch.zeros(8)])
>>> payload, context = codec.compress(torch.tensor([0.0, -5, 1, 2, 0, 3, 0, 0]), layout)
>>> codec.payload_spec(layout), codec.decompress(payload, context).tolist()
([(2, torch.float32), (2, torch.int32)], [0.0, -5.0, 0.0, 0.0, 0.0, 3.0, 0.0, 0.0])
"""

from __future__ import annotations

import math

import torch

from scaletrain.errors import ConfigError
from scaletrain.tensors.codec import CODECS, Collectives, TensorLayout, WireCodec

__all__ = ["TopK"]


class TopK(WireCodec):
    """The largest ``ratio`` of a gradient's values by magnitude and their indices."""

    name = "topk"
    feedback_by_default = True
    collective = "all_gather"
    collective_calls = 2  # the values, then their indices

    def __init__(self, error_feedback: bool = False, *, ratio: float = 0.01) -> None:
        super().__init__(error_feedback)
        self.ratio = ratio

    @classmethod
    def parse_options(cls, options: dict[str, object]) -> dict[str, object]:
        """``ratio`` in (0, 1].

        >>> TopK.parse_options({"ratio": "0.05"})
        {'ratio': 0.05}
        >>> TopK.parse_options({"ratio": "1.5"})
        Traceback (most recent call last):
        ...
        scaletrain.errors.ConfigError: -W ratio=1.5: topk's ratio must be in (0, 1], e.g. -W ratio=0.01
        """
        unknown = set(options) - {"ratio"}
        if unknown:
            raise ConfigError(
                f"wire codec topk has no option {', '.join(sorted(unknown))}; it takes ratio (-W ratio=0.01)"
            )
        if "ratio" not in options:
            return {}
        try:
            ratio = float(options["ratio"])  # type: ignore[arg-type]
        except (TypeError, ValueError):
            ratio = math.nan
        if not 0 < ratio <= 1:
            raise ConfigError(f"-W ratio={options['ratio']}: topk's ratio must be in (0, 1], e.g. -W ratio=0.01")
        return {"ratio": ratio}

    def kept(self, numel: int) -> int:
        return min(numel, max(1, math.ceil(self.ratio * numel)))

    def payload_spec(self, layout: TensorLayout) -> list[tuple[int, torch.dtype]]:
        count = self.kept(layout.numel)
        return [(count, torch.float32), (count, torch.int32)]

    def compress(
        self, flat: torch.Tensor, layout: TensorLayout, stream: object = None
    ) -> tuple[list[torch.Tensor], TensorLayout]:
        corrected = self.corrected(flat, stream) if self.error_feedback else flat
        indices = corrected.abs().topk(self.kept(flat.numel()), sorted=False).indices
        payload = [corrected[indices], indices.to(torch.int32)]
        if self.error_feedback:
            self.carry(stream, corrected, self.decompress(payload, layout))
        return payload, layout

    def decompress(
        self, payload: list[torch.Tensor], context: TensorLayout, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        values, indices = payload
        out = torch.zeros(context.numel, device=values.device) if out is None else out.zero_()
        return out.index_copy_(0, indices.long(), values.float())

    def allreduce(
        self, flat: torch.Tensor, layout: TensorLayout, *, stream: object = None, collectives: Collectives | None = None
    ) -> torch.Tensor:
        collectives = collectives or Collectives()
        payload, _ = self.compress(flat, layout, stream)
        gathered = [[torch.empty_like(part) for _ in range(collectives.world_size)] for part in payload]
        for part, parts in zip(payload, gathered, strict=True):
            collectives.all_gather(parts, part)
        total = torch.zeros(layout.numel, device=flat.device)
        for values, indices in zip(*gathered, strict=True):  # in rank order: the same sum on every worker
            total.index_add_(0, indices.long(), values)
        return total


CODECS[TopK.name] = TopK
