"""One process of the synchronised batch norm's unit test (tests/efficient/test_sync_batchnorm.py): a real
2-process gloo group on loopback, each process holding some rows of one batch (5 and 7 of 12: unequal
shares, so the count travels too).

``python sync_batchnorm_job.py RANK PORT OUT`` runs every case of :func:`cases` through the synchronised
layers: two training passes (the first with a backward pass of a fixed upstream gradient), then, on rank 0
alone (the other process has left), an evaluation pass and a training pass outside ``synchronised``,
which must not communicate. It saves what it computed as ``OUT/rank-RANK.pt``.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.efficient.sync_batchnorm import sync_batch_norm, synchronised

ROWS = (5, 7)  # rank 0's rows, rank 1's rows


def cases() -> dict[str, tuple[nn.Module, torch.Tensor, torch.Tensor]]:
    """Per case: a plain batch norm with set parameters and statistics, the whole batch, and the upstream
    gradient of its output (the same on every process)."""
    generator = torch.Generator().manual_seed(3)

    def norm(module: nn.modules.batchnorm._BatchNorm) -> nn.Module:
        with torch.no_grad():
            if module.affine:
                module.weight.copy_(1 + torch.rand(module.num_features, generator=generator))
                module.bias.copy_(torch.randn(module.num_features, generator=generator))
            module.running_mean.copy_(torch.randn(module.num_features, generator=generator))
            module.running_var.copy_(1 + torch.rand(module.num_features, generator=generator))
        return module

    def batch(*shape: int) -> torch.Tensor:
        return 3.0 * torch.randn(*shape, generator=generator) + 2.0  # far from mean 0, variance 1

    images = batch(12, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    return {
        "2d channels-last": (norm(nn.BatchNorm2d(3)), images, torch.randn(12, 3, 4, 5, generator=generator)),
        "1d cumulative": (
            norm(nn.BatchNorm1d(4, momentum=None)),
            batch(12, 4),
            torch.randn(12, 4, generator=generator),
        ),
        "1d sequence, no affine": (
            norm(nn.BatchNorm1d(3, affine=False)),
            batch(12, 3, 6),
            torch.randn(12, 3, 6, generator=generator),
        ),
    }


def rows(rank: int) -> slice:
    return slice(sum(ROWS[:rank]), sum(ROWS[: rank + 1]))


def main(rank: int, port: int, out: Path) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=20),
    )
    group, mine, results = dist.group.WORLD, rows(rank), {}
    made = cases()
    for name, (module, inputs, upstream) in made.items():
        sync_batch_norm(module)
        part = inputs[mine].clone().requires_grad_(True)
        with synchronised(group):
            first = module(part)
        (first * upstream[mine]).sum().backward()
        with synchronised(group):
            module(inputs[mine] * 0.5 - 1.0)  # a second pass moves the running statistics again
        results[name] = {
            "output": first.detach(),
            "channels_last": first.is_contiguous(memory_format=torch.channels_last) if first.dim() == 4 else None,
            "input_grad": part.grad,
            "weight_grad": module.weight.grad if module.affine else None,
            "bias_grad": module.bias.grad if module.affine else None,
            **{key: value.clone() for key, value in module.state_dict().items()},
        }
    dist.barrier()
    if rank == 1:
        dist.destroy_process_group()
    else:
        for name, (module, inputs, _) in made.items():
            module.eval()
            with synchronised(group):  # evaluation: the running statistics, no communication
                results[name]["evaluation"] = module(inputs)
            module.train()
            results[name]["alone"] = module(inputs[mine])  # outside the block: this process's rows only
            results[name]["after_alone"] = {k: v.clone() for k, v in module.state_dict().items()}
    torch.save(results, out / f"rank-{rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
    sys.stdout.flush()
    os._exit(0)  # leave without gloo's teardown at interpreter exit
