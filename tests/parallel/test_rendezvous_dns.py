"""A worker whose master address never resolves (``host not found``) waits the run's timeout, then says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tests.helpers import make_fashion_mnist, run_cli

pytestmark = pytest.mark.multiprocess


def test_unresolvable_master_fails_clearly_after_the_timeout(tmp_path: Path) -> None:
    data = make_fashion_mnist(tmp_path / "data", train=64, test=16)
    environment = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "scaletrain-master.invalid", "MASTER_PORT": "29500"}
    started = time.monotonic()
    result = run_cli(
        "train", "lenet", "--data-dir", str(data), "--out", str(tmp_path / "run"), "--workers", "2",
        "--steps", "2", "--timeout", "4", env=environment, timeout=120,
    )  # fmt: skip
    waited = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert "host not found: the name scaletrain-master.invalid never resolved" in last
    assert "within 4 s" in last
    assert waited >= 4  # it kept trying for the whole timeout before giving up
