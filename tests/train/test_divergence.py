"""The divergence bound (scaletrain.train.divergence): the rule on noisy loss sequences on both sides of the
bound, and real one-process runs: ``--lr 1e30`` stops with the advice line and exit code 2, ``--divergence
off`` lets it finish, the default LeNet and ResNet-20 settings are not stopped, a resumed run keeps its
reference. The runs of several processes are in tests/parallel/test_divergence.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist

import scaletrain
from scaletrain.cli import main
from scaletrain.train.divergence import FLOOR, PATIENCE, REFERENCE_STEPS, LossBound


def stopping_step(bound: LossBound, losses: list[float]) -> int | None:
    """The step (from 1) at which ``bound`` stops a run with these losses, or None."""
    for step, loss in enumerate(losses, start=1):
        if bound.exceeded(loss):
            return step
    return None


def noisy_descent(start: float, steps: int, seed: int, *, wild_every: int, wild_factor: float) -> list[float]:
    """A healthy, very noisy loss: from ``start`` down to a twentieth of it, each step × a log-normal factor
    (σ 1: one step in a hundred is ×10 its trend or more), and every ``wild_every`` steps (from step 2 on:
    among the reference's steps too) one lone batch ``wild_factor`` × the start."""
    rng = random.Random(seed)
    trend = [start * 20 ** (-step / steps) for step in range(steps)]
    return [start * wild_factor if step % wild_every == 1 else trend[step] * rng.lognormvariate(0.0, 1.0)
            for step in range(steps)]  # fmt: skip


def per_step_losses(out: Path) -> list[float]:
    """Each step's training loss of a run logged with ``log_every=1``."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [record["loss"] for record in records if record["kind"] == "step"]


# -- the rule ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_noisy_loss_is_not_stopped_even_by_lone_batches_over_the_bound(seed: int) -> None:
    bound = LossBound(1e4)
    losses = noisy_descent(2.3, 3000, seed, wild_every=97, wild_factor=1e5)
    assert stopping_step(bound, losses) is None
    assert losses[1] not in bound.first_losses  # the lone wild batch at step 2 is not in the reference
    # the test can fail: those lone batches are over the bound, a second one in a row would stop the run
    assert sum(loss > bound.limit for loss in losses) == len(range(1, 3000, 97))
    assert stopping_step(LossBound(1e4), [*losses[:10], 2.3e5, 2.3e5]) == 12


def test_a_loss_that_starts_tiny_is_held_to_the_floor_not_to_its_noise() -> None:
    losses = noisy_descent(1e-6, 2000, 0, wild_every=50, wild_factor=1e4)  # lone batches at 10⁻²
    losses[500:600] = [1e-6 * 1e5] * 100  # a lasting rise 10⁵ × the start, to 0.1: still noise next to the floor
    bound = LossBound(1e4)
    assert stopping_step(bound, losses) is None
    assert bound.reference < FLOOR and bound.limit == 1e4 * FLOOR
    assert stopping_step(LossBound(1e4), [*losses[:10], 1.01e4, 1.01e4]) == 12


def test_both_sides_of_the_bound() -> None:
    first = [2.8, 2.0, 2.6, 2.2, 2.4]
    reference = sorted(first)[len(first) // 2]
    limit = 1e4 * reference
    under = LossBound(1e4)
    assert stopping_step(under, [*first, *[limit] * 50, *[limit * 0.999] * 50]) is None  # "past" is strictly over
    assert under.reference == reference and under.limit == limit
    over = LossBound(1e4)
    assert stopping_step(over, [*first, limit * 0.999, limit * 1.001, limit * 1.001]) == len(first) + 1 + PATIENCE
    again = LossBound(1e4)  # the count of steps over the bound starts again under it
    assert stopping_step(again, [*first, limit * 2, limit * 0.5, limit * 2, limit * 0.5]) is None


@pytest.mark.parametrize(
    ("first", "reference"),
    [
        ([2.3, 900.0, 2.2, 2.1, 2.4], 2.3),  # one high step among the first
        ([2.3, 1e-4, 2.2, 2.1, 2.4], 2.2),  # one low step
        ([1e3, 2.3, 2.2, 2.1, 2.4], 2.3),  # the very first step wild: it has no bound before it
    ],
)
def test_one_noisy_step_among_the_first_barely_moves_the_reference(first: list[float], reference: float) -> None:
    bound = LossBound(1e4)
    assert stopping_step(bound, [*first, 2.0, 1.9]) is None
    assert bound.reference == reference and len(bound.first_losses) == REFERENCE_STEPS


def test_a_loss_that_explodes_from_the_second_step_is_never_its_own_reference() -> None:
    bound = LossBound(1e4)
    assert stopping_step(bound, [2.3, 1.3e32, 1.3e32, 1.3e32]) == 1 + PATIENCE
    assert bound.first_losses == [2.3]
    assert stopping_step(LossBound(None), [2.3, *[1.3e32] * 100]) is None  # --divergence off


# -- real runs in this process ---------------------------------------------------------------------


def lenet_args(data: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train", "lenet", "--data-dir", str(data), "--out", str(out), "--batch-size", "8", "--threads", "1",
        "--progress", "off", "--no-tensorboard", "--log-every", "1", *extra,
    ]  # fmt: skip


def test_lr_1e30_stops_with_the_advice_line_and_exit_2(
    tiny_fmnist: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "run"
    assert main(lenet_args(tiny_fmnist, out, "--steps", "20", "--lr", "1e30")) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1, said
    assert said[0].startswith("scaletrain: error: training diverged: the loss became ")
    assert f"at step {1 + PATIENCE} (epoch 1), over " in said[0]  # the first step's loss, then two over the bound
    assert "(--divergence 10000 × its first steps' loss 2." in said[0]
    assert said[0].endswith("with learning rate 1e+30; start again with a lower --lr (e.g. 1e+29) or with --clip-norm")
    assert not (out / "summary.json").exists()


def test_divergence_off_lets_that_run_finish_far_past_the_bound(tiny_fmnist: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    assert main(lenet_args(tiny_fmnist, out, "--steps", "20", "--lr", "1e30", "--divergence", "off")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["divergence"] == "off"
    losses = per_step_losses(out)
    assert min(losses[-10:]) > 1e4 * losses[0]  # the bound would have stopped it


@pytest.mark.parametrize(
    ("workload", "options", "steps"),
    [("lenet", {}, 40), ("resnet20", {"dataset": "fashion-mnist"}, 6)],
)
def test_the_default_settings_are_not_stopped(workload: str, options: dict, steps: int, tmp_path: Path) -> None:
    """The workload's own batch size, rate and momentum (ResNet-20 on Fashion-MNIST: CIFAR-10 is not here)."""
    data = make_fashion_mnist(tmp_path / "data", train=768, test=16)
    out = tmp_path / "run"
    summary = scaletrain.train(
        workload, options=options, data_dir=data, out=out, steps=steps, threads=2, progress="off",
        tensorboard=False, log_every=1,
    )  # fmt: skip
    assert summary["steps"] == steps and summary["divergence"] == 1e4
    losses = per_step_losses(out)
    bound = LossBound(1e4)
    assert stopping_step(bound, losses) is None
    assert max(losses) < bound.limit / 100, (max(losses), bound.limit)


def test_a_resumed_run_keeps_its_reference(tiny_fmnist: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    settings = {"data_dir": tiny_fmnist, "out": out, "batch_size": 8, "threads": 1, "progress": "off"}
    settings |= {"tensorboard": False, "log_every": 1, "checkpoint_every": 4}
    scaletrain.train("lenet", steps=8, **settings)
    first = per_step_losses(out)[:REFERENCE_STEPS]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["first_losses"] == first
    scaletrain.train("lenet", steps=16, resume=True, **settings)
    assert torch.load(out / "checkpoint.pt", weights_only=True)["first_losses"] == first
    # a checkpoint without them (an older one) leaves the resumed run to take them from its own first steps
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    del checkpoint["first_losses"]
    torch.save(checkpoint, out / "checkpoint.pt")
    scaletrain.train("lenet", steps=24, resume=True, **settings)
    after = torch.load(out / "checkpoint.pt", weights_only=True)["first_losses"]
    assert after == per_step_losses(out)[16 : 16 + REFERENCE_STEPS] and after != first
