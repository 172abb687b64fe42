"""Asynchronous training without momentum (issue 31): the PTB LSTM, plain SGD at lr 1.0, 3 async workers.

With no momentum to lower, the default compensation (:mod:`scaletrain.parallel.ps.staleness`) divides the
rate of each gradient by its staleness (≥ 1) — for plain SGD the same updates as ``lr``. Measured at the
issue's setting (2 epochs, hidden 200; docs/distributed.md): one process 448; 3 async workers 611 (central)
and 542 (sharded) with this rate, 639 / 671 with ``none``. The issue's bound (within 10 % of one process)
is not met. This test runs a shortened setting (one epoch, hidden 64, one thread a process) and checks the
rule's rate and a bound of 1.4× one process: measured there (one run each, loaded machine) one process 692,
async 873 (1.26×); without compensation the issue's run was 1.9× one process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import scaletrain

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.alone]

BOUND = 1.4

SHORT = dict(
    epochs=1,
    progress="off",
    tensorboard=False,
    threads=1,  # two-thread runs crawl as soon as another process wants a core (conftest.py)
    options={"train_split": "valid", "hidden_size": "64"},
)


def test_default_compensation_keeps_async_plain_sgd_near_one_process(real_ptb: Path, tmp_path: Path) -> None:
    one = scaletrain.train("ptb-lstm", data_dir=real_ptb, out=tmp_path / "one", **SHORT)
    layout = dict(workers=3, strategy="ps", server="central", sync="async")
    run = scaletrain.train("ptb-lstm", data_dir=real_ptb, out=tmp_path / "async", **layout, **SHORT)
    compensation = run["async_compensation"]
    assert run["steps"] == one["steps"] and run["staleness"]["mean"] > 1  # three workers overlapped
    assert compensation["mode"] == "momentum" and compensation["explicit_momentum"] == 0.0
    assert 0.4 < compensation["mean_rate_factor"] < 0.9  # 1 / τ for most gradients 2 updates old
    figures = {"one": one["test_perplexity"], "async": run["test_perplexity"]}
    assert run["test_perplexity"] <= BOUND * one["test_perplexity"], figures
