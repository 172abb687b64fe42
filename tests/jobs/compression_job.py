"""One process of the compression codecs' collective tests (tests/tensors/test_compression.py): a real
2-process gloo group on loopback. ``python compression_job.py RANK PORT OUT`` gives each process its
own gradients (drawn from its rank), runs them through each case's codec collective and through a plain
float32 ``all_reduce``, and saves what both returned as ``OUT/rank-RANK.pt``.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from scaletrain.tensors.codec import CODECS, TensorLayout

#: A linear layer's weight, a convolution's (read as 5 × 12), a bias: one flat gradient.
SHAPES = [torch.Size([6, 4]), torch.Size([5, 3, 2, 2]), torch.Size([6])]
STEPS = 40


def gradients(rank: int, steps: int) -> list[torch.Tensor]:
    """A drift shared by every step (so that the true sum grows with the steps) plus this rank's noise."""
    numel = sum(s.numel() for s in SHAPES)
    drift = torch.randn(numel, generator=torch.Generator().manual_seed(11))
    noise = torch.Generator().manual_seed(100 + rank)
    return [drift + torch.randn(numel, generator=noise) for _ in range(steps)]


def cases() -> dict[str, tuple[str, dict, bool, int]]:
    """name → (codec, its options, error feedback, steps)."""
    return {
        "powersgd-full-rank": ("powersgd", {"rank": "6", "min_gain": "0"}, False, 3),
        "powersgd-rank1-feedback": ("powersgd", {"rank": "1", "min_gain": "0"}, True, STEPS),
        "powersgd-rank1-plain": ("powersgd", {"rank": "1", "min_gain": "0"}, False, STEPS),
        "powersgd-cold-start": ("powersgd", {"rank": "1", "warm_start": "off", "start": "2"}, True, 5),
        "topk-ratio1": ("topk", {"ratio": "1"}, False, 3),
        "topk-tenth-feedback": ("topk", {"ratio": "0.1"}, True, STEPS),
        "topk-tenth-plain": ("topk", {"ratio": "0.1"}, False, STEPS),
    }


def main(rank: int, port: int, out: Path) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60)
    )
    layout = TensorLayout.of([torch.zeros(s) for s in SHAPES])
    results = {}
    for name, (wire, options, feedback, steps) in cases().items():
        kind = CODECS[wire]  # built directly: WireCodec.of turns feedback on for codecs published with it
        codec = kind(feedback, **kind.parse_options(dict(options)))
        sent, dense = [], []
        for gradient in gradients(rank, steps):
            total = gradient.clone()
            dist.all_reduce(total)
            dense.append(total)
            sent.append(codec.allreduce(gradient.clone(), layout, stream="all-reduce").clone())
        carried = codec._residuals.get("all-reduce", torch.zeros(layout.numel))  # what the next step would add
        results[name] = {
            "sent": torch.stack(sent),
            "dense": torch.stack(dense),
            "bytes": codec.payload_bytes(layout),
            "carried": carried,
        }
    torch.save(results, out / f"rank-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
