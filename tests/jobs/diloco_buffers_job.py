"""One process of tests/parallel/test_diloco.py's buffer test: a real 2-process gloo group on loopback, started with
the torchrun variables. Each rank gives its batch norm running statistics of its own (rank + 1, and 10 × that),
takes an inner step on data of its own, and the outer step of a ``DiLoCoExchange`` with ``--sync-every 1``;
``OUT/rank-RANK.json`` records the running statistics and the weights it holds after it.
``python -m tests.jobs.diloco_buffers_job OUT``.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.strategies.diloco import DiLoCo, DiLoCoExchange
from scaletrain.tensors.codec import WireCodec


def main(out: Path) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(rank)  # different weights on each rank: start() gives every rank rank 0's
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    values = DiLoCo().option_values({"sync_every": 1})
    exchange = DiLoCoExchange(dist.get_world_size(), WireCodec(), values)
    exchange.start(model, optimizer)
    with torch.no_grad():
        model[1].running_mean.fill_(rank + 1)
        model[1].running_var.fill_(10 * (rank + 1))
    momentum = model[1].momentum
    model[1].momentum = 0.0  # this step's statistics leave the running ones as they were set
    model(torch.randn(8, 3) + rank).pow(2).mean().backward()
    times = exchange.step(model, optimizer, None)
    model[1].momentum = momentum
    record = {
        "running_mean": model[1].running_mean.tolist(),
        "running_var": model[1].running_var.tolist(),
        "weights": [p.detach().reshape(-1).tolist() for p in model.parameters()],
        "outer_steps": exchange.outer_steps,
        "sent_bytes": times.sent_bytes,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
