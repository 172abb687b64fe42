"""Batch-size adaptation (004 §3.2.2): the search on real steps, the planted memory limit, the fit, and
runs whose batch follows the network."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, run_cli
from torch import nn

import scaletrain
from scaletrain.efficient.adaptive_batch import (
    BatchFit,
    available_memory,
    forked_peak_rss,
    largest_batch,
    parse_bytes,
)
from scaletrain.errors import ConfigError


@pytest.mark.parametrize("start", [1, 5, 37, 38, 100, 1000])
@pytest.mark.parametrize("limit", [37, 1000])
def test_the_search_finds_a_planted_limit_from_any_start(start: int, limit: int) -> None:
    probes_seen: list[int] = []

    def fits(batch: int) -> bool:
        probes_seen.append(batch)
        return batch <= 37

    found, probes = largest_batch(fits, start, limit)
    assert found == 37
    assert [batch for batch, _ in probes] == probes_seen and all(1 <= b <= limit for b in probes_seen)
    assert len(probes) <= 2 * 11  # doubling or halving, then bisecting: logarithmic in the range


def test_nothing_fits_and_everything_fits() -> None:
    assert largest_batch(lambda b: False, 16, 100)[0] == 0
    assert largest_batch(lambda b: True, 16, 100)[0] == 100


class Hungry(nn.Module):
    """A step whose memory grows by 4 MiB per sample, on top of a tiny layer."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def forward(self, rows: int) -> torch.Tensor:
        wide = torch.ones(rows, 2**20, requires_grad=True)  # 4 MiB a row, kept for backward
        return (self.layer(torch.ones(rows, 4)) * (wide * 2).sum(dim=1, keepdim=True)).sum()


@pytest.mark.alone  #
def test_a_planted_memory_limit_is_found_on_real_forked_steps() -> None:
    model = Hungry()

    def peak(rows: int) -> int | None:
        return forked_peak_rss(lambda: model(rows).backward())

    base = peak(1)
    assert base is not None
    per_row = (peak(21) - base) / 20
    assert 7 * 2**20 < per_row < 13 * 2**20  # the input and its double: 8 MiB a row, give or take the allocator
    budget = base + 30 * per_row  # planted: a little over 31 rows fit
    found, _ = largest_batch(lambda rows: (peak(rows) or budget + 1) <= budget, start=4, limit=512)
    assert 27 <= found <= 35
    assert peak(found) <= budget * 1.02 and peak(2 * found) > budget


def test_a_step_that_runs_out_of_memory_in_the_copy_does_not_fit() -> None:
    def explode() -> None:
        raise MemoryError

    assert forked_peak_rss(explode) is None


@pytest.mark.alone  #
def test_a_trial_far_too_large_for_the_machine_fails_at_once_in_the_copy() -> None:
    """The copy may map only 80 % of the available memory: asking for 90 % fails there, not in the machine."""
    available = available_memory()
    began = time.monotonic()
    assert forked_peak_rss(lambda: torch.ones(int(0.9 * available) // 4)) is None
    assert time.monotonic() - began < 30
    assert forked_peak_rss(lambda: torch.ones(2**20).sum()) is not None  # a small step still runs


def test_memory_an_earlier_larger_step_left_free_does_not_count() -> None:
    """A process keeps freed heap memory resident; the copy hands it back before its step is measured."""
    small = lambda: torch.ones(10).sum()  # noqa: E731
    before = forked_peak_rss(small)
    chunks = [torch.ones(2**18) for _ in range(300)]  # 300 MiB in 1 MiB pieces, from the heap
    del chunks
    after = forked_peak_rss(small)
    assert after < before + 30 * 2**20


def test_the_fit_predicts_the_batch_from_the_parameters() -> None:
    fit = BatchFit([(100_000, 64), (50_000, 128)])
    assert fit.predict(25_000) == 256 and BatchFit([(1, 2)]).predict(5) is None


def test_budgets_are_read_with_units_and_bad_ones_are_refused() -> None:
    assert parse_bytes("2GB") == 2 * 10**9 and parse_bytes(" 512 MiB ") == 512 * 2**20
    for bad in ("lots", "-5MB", "0", "5 parsecs"):
        with pytest.raises(ConfigError, match="--batch-budget"):
            parse_bytes(bad)


# -- in real runs -----------------------------------------------------------------------------------

RESNET = {"dataset": "fashion-mnist", "stages": "2", "blocks": "1", "width": "8"}
COMMON = {"lr": 0.02, "momentum": 0.9, "progress": "off", "tensorboard": False, "threads": 1, "seed": 1}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("adapt") / "fmnist", train=384, test=32)


def searches(out: Path) -> list[dict]:
    return json.loads((out / "summary.json").read_text())["batch_searches"]


@pytest.mark.alone  #
def test_a_run_takes_the_largest_batch_under_the_budget_and_warms_up_to_its_rate(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    summary = scaletrain.train("resnet", options=RESNET, data_dir=data, out=out, epochs=6, batch_size=16,
                               batch_budget="2GB", batch_warmup=4, log_every=1, **COMMON)  # fmt: skip
    (search,) = searches(out)
    assert search["peak_bytes"] <= search["budget_bytes"] == 2 * 10**9
    assert all(peak <= 2 * 10**9 for rows, fits, peak in search["probes"] if fits)
    assert [rows for rows, fits, _ in search["probes"] if not fits], "the search went past what fits"
    batch = search["batch_size"]
    segment = summary["batch_schedule"][-1]
    assert segment["batch_size"] == batch and segment["warmup_steps"] == 4
    assert segment["lr_scale"] == pytest.approx(batch / 16)
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["lr"] for r in steps if r["kind"] == "step" and r["step"] > segment["step"]]
    expected = [0.02 * (1 + (batch / 16 - 1) * k / 4) for k in range(1, 5)]
    assert rates[:4] == pytest.approx(expected)  # the warm-up: the rate moves every update


@pytest.mark.alone  #
@pytest.mark.multiprocess
def test_after_pruning_the_batch_rises_for_every_worker_at_once(data: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    prune = {"technique": "prunetrain", "lasso_ratio": 0.6, "prune_threshold": 0.05, "reconfigure_every": 1}
    summary = scaletrain.train("resnet", options=RESNET, data_dir=data, out=out, epochs=3, batch_size=16, workers=2,
                               sync="split", batch_budget="2GB", **prune, **COMMON)  # fmt: skip
    found = searches(out)
    assert len(found) >= 2, "a search after the first epoch and after the reconfiguration"
    assert found[-1]["parameters"] < found[0]["parameters"]
    assert found[-1]["rows"] >= found[0]["rows"]
    assert all(s["batch_size"] == 2 * s["rows"] for s in found)  # split: the global batch is the share × 2
    assert len({w["weights_digest"] for w in summary["per_worker"]}) == 1


def test_a_bad_budget_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--batch-budget", "plenty", "--steps", "1", "--out", str(tmp_path / "r"))
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--batch-budget" in lines[0], result.stderr
