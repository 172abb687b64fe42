"""A wire codec of one's own: one module and one registry line, loaded into every process of a run by
``SCALETRAIN_PLUGINS=tests.extending.made_up_codec`` (the test imports it itself too).

Top-k sparsification (Aji & Heafield 2017; with error feedback, Stich et al. 2018): of each gradient
message only the largest sixteenth of the values by magnitude travel, each with its int32 index — 8
bytes per kept value, an eighth of float32's bytes. With ``error_feedback`` what was left out is
added to the next message of the same stream. Workers keep different indices, so their payloads do
not add up as they travel: under all-reduce the codec all-gathers every worker's values and indices
and adds them itself; a parameter server's owner decompresses each payload before applying it.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from scaletrain.tensors.codec import CODECS, TensorLayout, WireCodec

__all__ = ["TopK"]


class TopK(WireCodec):
    """The largest ``1/keep_one_in`` of a gradient's values by magnitude and their indices."""

    name = "top16"
    keep_one_in = 16

    def kept(self, numel: int) -> int:
        return max(1, math.ceil(numel / self.keep_one_in))

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
        return out.index_copy_(0, indices.long(), values)

    def allreduce(
        self, flat: torch.Tensor, layout: TensorLayout, *, group: dist.ProcessGroup | None = None, stream: object = None
    ) -> torch.Tensor:
        payload, _ = self.compress(flat, layout, stream)
        gathered = [[torch.empty_like(part) for _ in range(dist.get_world_size(group))] for part in payload]
        for part, parts in zip(payload, gathered, strict=True):
            dist.all_gather(parts, part, group=group)
        total = torch.zeros(layout.numel, device=flat.device)
        for values, indices in zip(*gathered, strict=True):  # in rank order: the same sum on every worker
            total.index_add_(0, indices.long(), values)
        return total


CODECS[TopK.name] = TopK
