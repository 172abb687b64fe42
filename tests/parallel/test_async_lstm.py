"""Asynchronous training without momentum (issue 31): the PTB LSTM, plain SGD at lr 1.0, 3 async workers.

With no momentum to lower, the default compensation (:mod:`scaletrain.parallel.ps.staleness`) divides the
rate by τ̄ + 1, the updates in flight (τ̄ ≈ 2 for three workers). Measured at the issue's setting (2 epochs,
hidden 200; docs/distributed.md): one process 448 at lr 1.0 and 667 at lr 0.34; 3 async workers with the
default 650 (central) and 625 (sharded), with the rate factor 0.34 on average. The rule removes the harm of
stale gradients but trains at the lowered rate: the issue's bound (within 10 % of one process at lr 1.0)
is not met. This test checks, on a shortened setting (one epoch, hidden 64), what the rule claims:
the async run with the default ends within 10 % of one process trained at the rate the rule settles on
(lr / 3; one process at lr 1.0 ends 12 % lower there). Measured there (one run each, loaded
machine): one process 692 at lr 1.0 and 789 at lr 1/3; async 773 with the default (rate factor 0.35),
775 with ``none``: at this length stale gradients hardly hurt, so the test checks the rule's rate and
that the default trains like one process at it, not that it beats ``none``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import scaletrain

pytestmark = [pytest.mark.slow, pytest.mark.multiprocess, pytest.mark.alone]

SHORT = dict(
    epochs=1,
    progress="off",
    tensorboard=False,
    threads=1,  # two-thread runs crawl as soon as another process wants a core (conftest.py)
    options={"train_split": "valid", "hidden_size": "64"},
)


def test_default_compensation_trains_async_plain_sgd_like_one_process_at_its_rate(
    real_ptb: Path, tmp_path: Path
) -> None:
    lowered = scaletrain.train("ptb-lstm", data_dir=real_ptb, out=tmp_path / "lowered", lr=1 / 3, **SHORT)
    layout = dict(workers=3, strategy="ps", server="central", sync="async")
    run = scaletrain.train("ptb-lstm", data_dir=real_ptb, out=tmp_path / "async", **layout, **SHORT)
    compensation = run["async_compensation"]
    assert run["steps"] == lowered["steps"] and run["staleness"]["mean"] > 1  # three workers overlapped
    assert compensation["mode"] == "momentum" and compensation["explicit_momentum"] == 0.0
    assert 0.2 < compensation["mean_rate_factor"] < 0.6  # about 1 / (τ̄ + 1)
    figures = {name: summary["test_perplexity"] for name, summary in (("one lr/3", lowered), ("async", run))}
    assert run["test_perplexity"] <= 1.1 * lowered["test_perplexity"], figures
