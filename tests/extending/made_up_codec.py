"""A wire codec of one's own: one module and one registry line, loaded into every process of a run by
``SCALETRAIN_PLUGINS=tests.extending.made_up_codec`` (the test imports it itself too).

Scaled signs (signSGD, Bernstein et al. 2018; with a scale and error feedback, Karimireddy et al. 2019,
"EF-SignSGD"): every value travels as one bit, its sign, and every block of 256 values as one float32,
the mean magnitude of the block, so that a value arrives as ± its block's scale — about a bit and an
eighth per value, 1/28 of float32's bytes. With ``error_feedback`` what the signs got wrong is added
to the next message of the same stream. Signs do not add up as they travel: under all-reduce the codec
all-gathers every worker's message and adds the decoded gradients itself; a parameter server's owner
decompresses each message before applying it. Nothing in the message depends on the gradient's
shapes, only on its element count, so an owner that knows a layout by its header alone decodes it too.
"""

from __future__ import annotations

import math

import torch

from scaletrain.tensors.codec import CODECS, Collectives, TensorLayout, WireCodec

__all__ = ["ScaledSign"]

_BIT_WEIGHTS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)


class ScaledSign(WireCodec):
    """Each value's sign as a bit, and each ``block`` of values' mean magnitude as a float32."""

    name = "scaledsign"
    block = 256

    def payload_spec(self, layout: TensorLayout) -> list[tuple[int, torch.dtype]]:
        # the scales first: the bit bytes after them need no padding to start at a multiple of their size
        return [(math.ceil(layout.numel / self.block), torch.float32), (math.ceil(layout.numel / 8), torch.uint8)]

    def compress(
        self, flat: torch.Tensor, layout: TensorLayout, stream: object = None
    ) -> tuple[list[torch.Tensor], TensorLayout]:
        corrected = self.corrected(flat, stream) if self.error_feedback else flat.float()
        numel = corrected.numel()
        blocks = math.ceil(numel / self.block)
        padded = torch.zeros(blocks * self.block, device=corrected.device)
        padded[:numel] = corrected
        sizes = torch.full((blocks,), float(self.block), device=corrected.device)
        sizes[-1] = numel - (blocks - 1) * self.block  # the zeros that pad the last block are not its values
        scales = padded.view(blocks, self.block).abs().sum(1) / sizes
        positive = (padded[: math.ceil(numel / 8) * 8] >= 0).to(torch.uint8).view(-1, 8)
        bits = (positive * _BIT_WEIGHTS.to(positive.device)).sum(1, dtype=torch.uint8)
        payload = [scales, bits]
        if self.error_feedback:
            self.carry(stream, corrected, self.decompress(payload, layout))
        return payload, layout

    def decompress(
        self, payload: list[torch.Tensor], context: TensorLayout, out: torch.Tensor | None = None
    ) -> torch.Tensor:
        scales, bits = payload
        shifts = torch.arange(8, device=bits.device, dtype=torch.uint8)
        signs = ((bits.unsqueeze(1) >> shifts) & 1).reshape(-1)[: context.numel].float() * 2 - 1
        magnitudes = scales.repeat_interleave(self.block)[: context.numel]
        if out is None:
            return signs * magnitudes
        return torch.mul(signs, magnitudes, out=out)

    def allreduce(
        self, flat: torch.Tensor, layout: TensorLayout, *, stream: object = None, collectives: Collectives | None = None
    ) -> torch.Tensor:
        # every worker's message has the same size (it depends on the element count alone): one
        # all-gather of whole messages, decoded and summed in rank order, the same sum everywhere
        collectives = collectives or Collectives()
        message = self.to_message(self.compress(flat, layout, stream)[0], layout)
        messages = [torch.empty_like(message) for _ in range(collectives.world_size)]
        collectives.all_gather(messages, message)
        decoded = [self.decompress(self.from_message(body, layout), layout) for body in messages]
        return torch.stack(decoded).sum(0)


CODECS[ScaledSign.name] = ScaledSign
