"""One process of tests/parallel/test_watched_codecs.py: a real 3-process gloo group on loopback in which
rank 2 never joins the collective (a frozen peer). ``python watched_codec_job.py RANK PORT WIRE OUT``: ranks 0
and 1 run WIRE's all-reduce through an elastic run's watched collectives, whose ``lost()`` turns true after
``HEARD_AFTER`` seconds (as when another survivor reports the loss), and write what happened to
``OUT/rank-RANK.json``.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scaletrain.parallel.strategies.elastic_waits import HeardOfLoss, WatchedCollectives
from scaletrain.tensors.codec import TensorLayout, WireCodec

HEARD_AFTER = 1.0
GROUP_TIMEOUT = 60  # seconds: what an unwatched collective would wait on the frozen peer


def main(rank: int, port: int, wire: str, out: Path) -> None:
    timeout = datetime.timedelta(seconds=GROUP_TIMEOUT)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=3, timeout=timeout)
    if rank == 2:
        time.sleep(HEARD_AFTER + 2)  # frozen: never enters the collective, then leaves without a word
        os._exit(0)
    gradients = [torch.randn(40, 30), torch.randn(30)]
    layout = TensorLayout.of(gradients)
    codec = WireCodec.of(wire, options={"rank": "2"} if wire == "powersgd" else None)
    began = time.monotonic()
    collectives = WatchedCollectives(lost=lambda: time.monotonic() - began > HEARD_AFTER)
    try:
        codec.allreduce(codec.pack(gradients), layout, stream="all-reduce", collectives=collectives)
        result = {"raised": None}
    except HeardOfLoss as error:
        result = {"raised": type(error).__name__}
    result["seconds"] = time.monotonic() - began
    (out / f"rank-{rank}.json").write_text(json.dumps(result), encoding="utf-8")
    sys.stdout.flush()
    os._exit(0)  # a collective is still pending on the frozen peer: no teardown


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], Path(sys.argv[4]))
