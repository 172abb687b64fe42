"""One process of tests/parallel/test_diloco_overlap.py: a real 2-process gloo group on loopback, started with the
torchrun variables. The model is one parameter vector and one float buffer; at inner step k each rank's gradient is
:func:`gradient` and its buffer grows by rank + 1, so the test can follow both by hand. H = 3, K = 2, plain SGD at
rate 1 inside, an outer SGD at rate 0.5 without momentum, 7 inner steps, then the run's last outer step.
``OUT/rank-RANK.json``: the weights and the buffer after every step and at the end, the outer steps, the bytes sent.
``python -m tests.jobs.diloco_overlap_job OUT CUT RESUME``: at step CUT the ranks average their buffers before the
update and the exchange's state is taken after it, as at a checkpoint of the training loop; with RESUME 1 a fresh
model (holding the averaged buffer, as the checkpoint does) and exchange load that state and go on.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.strategies.diloco import DiLoCo
from scaletrain.parallel.strategies.diloco_exchange import DiLoCoExchange
from scaletrain.tensors.codec import WireCodec

STEPS = 7
OPTIONS = {"sync_every": 3, "overlap_steps": 2, "outer_lr": 0.5, "outer_momentum": 0.0}


def gradient(rank: int, step: int) -> torch.Tensor:
    return torch.tensor([1.0, 2.0, 3.0]) * (rank + 1) * step / 8


class Vector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(3))
        self.register_buffer("statistic", torch.zeros(2))


def started() -> tuple[Vector, torch.optim.Optimizer, DiLoCoExchange]:
    model = Vector()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    exchange = DiLoCoExchange(2, WireCodec(), DiLoCo().option_values(OPTIONS), timeout=60)
    exchange.start(model, optimizer)
    return model, optimizer, exchange


def main(out: Path, cut: int, resume: bool) -> None:
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model, optimizer, exchange = started()
    trace, sent = [], []
    for step in range(1, STEPS + 1):
        with torch.no_grad():
            model.statistic += rank + 1  # as a forward pass moves batch norm's running statistics
            if step == cut:  # the loop's hand-over of the buffers before a checkpoint's update
                dist.all_reduce(model.statistic)
                model.statistic /= 2
        model.weight.grad = gradient(rank, step)
        times = exchange.step(model, optimizer, None)
        sent.append(times.sent_bytes)
        trace.append({"weight": model.weight.tolist(), "statistic": model.statistic.tolist()})
        if step == cut:
            state = exchange.state_dict()
            if resume:  # its model, optimizer and exchange made afresh, then the checkpoint's buffer and the state
                statistic = model.statistic.clone()
                model, optimizer, exchange = started()
                model.statistic.copy_(statistic)
                exchange.load_state_dict(state)
    exchange.conclude(model, lambda every: 0)
    record = {
        "trace": trace,
        "final": {"weight": model.weight.tolist(), "statistic": model.statistic.tolist()},
        "outer_steps": exchange.outer_steps,
        "sent_bytes": sent,
    }
    (out / f"rank-{rank}.json").write_text(json.dumps(record), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
