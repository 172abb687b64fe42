"""The chaos benchmark's reading of a run's records (benchmarks/chaos_checks.py): each step once and in its epoch,
each global batch split over the membership that computed it, membership changes that name who came and went, and
the time lost in the intervals that hold a fault."""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest
import torch
from tests.helpers import REPO

SAMPLES, BATCH, SEED = 240, 12, 4
PER_EPOCH = SAMPLES // BATCH


@pytest.fixture
def checks(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    return importlib.import_module("chaos_checks")


def steps(numbers: list[int], *, epoch_of=lambda step: (step - 1) // PER_EPOCH) -> list[dict]:
    return [{"kind": "step", "step": n, "epoch": epoch_of(n), "time": float(n)} for n in numbers]


def summary(total: int, changes: list[dict] | None = None) -> dict:
    return {"steps": total, "steps_per_epoch": PER_EPOCH, "batch_size": BATCH, "membership": changes or []}


def test_a_run_that_applied_every_step_once_has_no_problem(checks: ModuleType) -> None:
    records = [{"kind": "membership"}, *steps(list(range(1, 2 * PER_EPOCH + 1)))]
    assert checks.step_checks(records, summary(2 * PER_EPOCH)) == []
    assert checks.step_times(records) == [float(n) for n in range(1, 2 * PER_EPOCH + 1)]


def test_missing_repeated_misplaced_and_partial_epochs_are_each_named(checks: ModuleType) -> None:
    numbers = [n for n in range(1, 2 * PER_EPOCH + 1) if n != 7] + [12]
    problems = checks.step_checks(steps(numbers), summary(2 * PER_EPOCH))
    assert problems == ["steps recorded out of order: missing [7], repeated [12]"]
    shifted = steps(list(range(1, PER_EPOCH + 1)), epoch_of=lambda step: int(step > 5))
    assert checks.step_checks(shifted, summary(PER_EPOCH)) == ["step 6 recorded in epoch 1"]
    assert checks.step_checks(steps([1, 2, 3]), summary(3)) == [f"3 steps are not whole epochs of {PER_EPOCH}"]


def test_every_global_batch_is_split_over_the_membership_that_computed_it(checks: ModuleType) -> None:
    # 4 workers, down to 3 after step 7 (steps 8 on), up to 4 after step 25 (in the second epoch)
    changes = [{"step": 25, "workers": 4}, {"step": 7, "workers": 3}]
    assert checks.coverage_checks(summary(2 * PER_EPOCH, changes), SAMPLES, SEED, 4) == []


def test_a_split_that_interleaves_the_batch_is_caught(checks: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers that take every count-th sample still cover each batch once, but not as the plan cuts it."""

    class Interleaved(checks.EpochBatches):
        def __init__(self, size: int, *, batch_size: int, seed: int, epoch: int, part) -> None:
            super().__init__(size, batch_size=batch_size, seed=seed, epoch=epoch)
            self.part = part

        def indices(self, number: int) -> torch.Tensor:
            whole = self._order[number * self._batch_size : (number + 1) * self._batch_size]
            return whole[self.part.index :: self.part.count]

    monkeypatch.setattr(checks, "EpochBatches", Interleaved)
    problems = checks.coverage_checks(summary(PER_EPOCH, [{"step": 10, "workers": 3}]), SAMPLES, SEED, 4)
    assert problems[0] == "epoch 0 batch 0: the parts of 4 workers are not the batch"
    assert len(problems) == PER_EPOCH  # every batch; the epoch's samples are still each covered once


def test_a_membership_change_that_does_not_name_who_came_or_went_is_reported(checks: ModuleType) -> None:
    named = {"step": 5, "members": [0, 1], "joined": [], "left": [{"rank": 2}]}
    unnamed = {"step": 9, "members": [0, 1, 4], "joined": [], "left": []}
    lines = checks.unrecorded_changes([named, unnamed], workers=3)
    assert lines == ["the change after step 9 (members [0, 1] → [0, 1, 4]) does not name rank [4] in joined"]
    assert checks.unrecorded_changes([named], workers=3) == []


def test_only_the_intervals_that_hold_a_fault_count_their_excess_over_the_median(checks: ModuleType) -> None:
    times = [0.0, 1.0, 2.0, 5.0, 6.0, 7.5, 8.5]
    median, lost = checks.stalls(times, marks=[3.0])
    assert median == 1.0 and lost == 2.0  # the slow interval 6.0 → 7.5 holds no mark: not counted
    assert checks.stalls(times, marks=[3.0, 7.0]) == (1.0, 2.5)
