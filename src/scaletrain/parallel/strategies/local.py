"""``local``: one process that trains alone (the exchange clips and steps; nothing goes anywhere)."""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from scaletrain.parallel.strategies.base import Layout, Strategy, layout_fields, train_worker
from scaletrain.train.state import Prepared, Role
from scaletrain.train.summary import write_summary

__all__ = ["Local"]


class Local(Strategy):
    name = "local"
    description = "one process, nothing exchanged"
    max_workers = 1
    predicted = False
    all_reduce_codecs = True  # it sends nothing: a codec has nothing to carry, and it is the reference of every one
    overlaps = True  # likewise: --overlap is a no-op in one process

    def run(self, prepared: Prepared, layout: Layout, rank: int, store: dist.Store) -> dict[str, Any] | None:
        trainer = train_worker(prepared, Role(), store)
        return write_summary(
            prepared, trainer.final_quality(), [trainer.stats()], layout_fields=layout_fields(layout, prepared.config)
        )
