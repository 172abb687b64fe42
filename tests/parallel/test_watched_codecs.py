"""Every codec's collectives are watched in an elastic all-reduce: a survivor blocked in PowerSGD's
all-reduces or top-k's all-gathers on a frozen peer gives up as soon as another member reports the loss,
instead of waiting out the group's timeout (real 3-process gloo groups, tests/jobs/watched_codec_job.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import REPO
from tests.jobs import watched_codec_job as job

from scaletrain.parallel.launch import free_port

pytestmark = [pytest.mark.multiprocess]


@pytest.mark.parametrize("wire", ["fp32", "powersgd", "topk"])
def test_a_codecs_collective_gives_up_when_a_loss_is_heard_of(wire: str, tmp_path: Path) -> None:
    port = free_port()
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    command = [sys.executable, str(Path(job.__file__))]
    processes = [
        subprocess.Popen([*command, str(rank), str(port), wire, str(tmp_path)], env=environment) for rank in range(3)
    ]
    for process in processes:
        assert process.wait(timeout=job.GROUP_TIMEOUT) == 0
    for rank in (0, 1):
        result = json.loads((tmp_path / f"rank-{rank}.json").read_text())
        assert result["raised"] == "HeardOfLoss", (wire, rank, result)
        # heard of at 1 s, given up within the next watch intervals: not the group's 60 s
        assert job.HEARD_AFTER <= result["seconds"] < job.HEARD_AFTER + 2, (wire, rank, result)
