"""Mixed precision and narrow wires: autocast, loss scaling whose skips every process shares, and the
bf16/fp16 codecs with error feedback — units, then real runs (real processes on loopback)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist, model_weights, run_cli

import scaletrain
from scaletrain.efficient.base import Stack, Technique
from scaletrain.efficient.precision import LossScale, Precision, parse_loss_scale, poison_if_overflowed
from scaletrain.errors import ConfigError
from scaletrain.tensors.codec import WireCodec

COMMON = {"progress": "off", "tensorboard": False, "threads": 1}


# -- units ------------------------------------------------------------------------------------------


def test_loss_scale_halves_on_overflow_and_doubles_after_clean_steps() -> None:
    scale = LossScale(1024.0, growth_interval=3)
    for skipped, expected in ((True, 512.0), (False, 512.0), (False, 512.0), (False, 1024.0), (True, 512.0)):
        scale.update(skipped=skipped)
        assert scale.value == expected
    assert scale.skipped == 2


def test_an_overflow_anywhere_poisons_every_gradient_and_clean_ones_are_untouched() -> None:
    clean = [torch.ones(3), torch.full((2,), 2.0)]
    assert not poison_if_overflowed(clean)
    assert torch.equal(clean[1], torch.full((2,), 2.0))
    bad = [torch.ones(3), torch.tensor([1.0, float("nan")])]
    assert poison_if_overflowed(bad)
    assert all(torch.isnan(g).all() for g in bad)


def test_loss_scaling_unscales_exactly_and_stacks_outside_another_technique() -> None:
    class Doubles(Technique):
        name = "doubles"

        def objective(self, loss: torch.Tensor, model: torch.nn.Module) -> torch.Tensor:
            return 2 * loss

    model = torch.nn.Linear(3, 1)
    x = torch.randn(4, 3)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    (2 * reference(x).pow(2).mean()).backward()

    stack = Stack([Doubles(), Precision(initial_scale=1024.0)])
    stack.objective(model(x).pow(2).mean(), model).backward()
    stack.after_backward(model)
    for mine, theirs in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-6, atol=0)
    assert stack.skips_nonfinite and stack.loss_scale == 1024.0


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf"])
def test_a_bad_loss_scale_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="--loss-scale must be off, dynamic or a starting scale"):
        parse_loss_scale(value, "bf16")


def test_bf16_autocast_runs_the_forward_pass_in_bf16_with_float32_weights() -> None:
    model = torch.nn.Linear(8, 4)
    with Precision(precision="bf16").forward_context():
        out = model(torch.randn(2, 8))
    assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.float32


def test_the_wire_halves_the_bytes_and_error_feedback_carries_what_rounding_lost() -> None:
    torch.manual_seed(0)
    gradients = [torch.randn(1000) * 1e-3 for _ in range(200)]
    truth = torch.stack(gradients).sum(0)
    plain, corrected = WireCodec.of("bf16"), WireCodec.of("bf16", error_feedback=True)
    assert plain.bytes_per_value == 2 and WireCodec.of("fp16").bytes_per_value == 2
    assert plain.encode_gradient(gradients[0]).dtype == torch.bfloat16
    sent_plain = torch.stack([plain.encode_gradient(g, stream=0).float() for g in gradients]).sum(0)
    sent_corrected = torch.stack([corrected.encode_gradient(g, stream=0).float() for g in gradients]).sum(0)
    plain_error, corrected_error = (sent_plain - truth).norm(), (sent_corrected - truth).norm()
    # Without feedback the rounding errors add up like a random walk; with it only the last one is missing.
    assert corrected_error < plain_error / 5
    corrected.reset()
    assert torch.equal(corrected.encode_gradient(gradients[0], stream=0), gradients[0].to(torch.bfloat16))


# -- command line -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--precision", "fp16"], "--precision fp16 runs on CUDA devices only"),
        (["--error-feedback"], "--error-feedback corrects a narrower wire's rounding; add --wire bf16"),
        (["--loss-scale", "lots"], "--loss-scale must be off, dynamic or a starting scale"),
    ],
)
def test_impossible_precision_settings_get_one_line_and_exit_2(flags: list[str], message: str, tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--steps", "1", "--out", str(tmp_path / "run"), *flags)
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


# -- real runs --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("precision") / "fmnist", train=1536, test=64)


@pytest.mark.multiprocess
def test_a_forced_overflow_skips_the_same_steps_on_every_worker_and_at_the_server(data: Path, tmp_path: Path) -> None:
    """A starting scale of 3e38 overflows the scaled loss: steps are skipped and the scale halves until
    it fits. Every worker and the server skip the same steps, the replicas stay equal, and all-reduce
    and the central server reach the same weights."""
    settings = dict(data_dir=data, steps=12, batch_size=16, momentum=0.9, seed=3, workers=2, loss_scale="3e38")
    summaries = {}
    for strategy in ("allreduce-split", "ps-central-split"):
        summaries[strategy] = scaletrain.train(
            "lenet", out=tmp_path / strategy, strategy=strategy, **settings, **COMMON
        )
    for summary in summaries.values():
        workers = summary["per_worker"]
        assert len(workers) == 2
        skipped = {w["skipped_steps"] for w in workers}
        assert len(skipped) == 1 and 0 < skipped.pop() < 12
        assert len({w["loss_scale"] for w in workers}) == 1 and workers[0]["loss_scale"] < 3e38
        assert len({w["weights_digest"] for w in workers}) == 1  # the replicas are equal
    central = summaries["ps-central-split"]
    assert (
        central["server_skipped_updates"] == central["skipped_steps"] == summaries["allreduce-split"]["skipped_steps"]
    )
    assert central["server_updates"] + central["server_skipped_updates"] == 12
    first, second = (model_weights(tmp_path / s) for s in summaries)
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=1e-5, atol=1e-6)


@pytest.mark.multiprocess
def test_a_bf16_wire_stays_close_to_fp32_and_error_feedback_reduces_the_drift(data: Path, tmp_path: Path) -> None:
    """96 all-reduce steps of 2 workers: the weights' distance from the float32-wire run, relative to
    their norm (measured here: ~3e-4 plain, ~2.3e-4 with error feedback)."""
    settings = dict(data_dir=data, epochs=1, batch_size=16, momentum=0.9, lr=0.02, seed=5, workers=2)
    runs = {}
    for name, extra in (("fp32", {}), ("bf16", {"wire": "bf16"}), ("ef", {"wire": "bf16", "error_feedback": True})):
        summary = scaletrain.train(
            "lenet", out=tmp_path / name, strategy="allreduce-split", **settings, **extra, **COMMON
        )
        assert summary["wire"] == extra.get("wire", "fp32")
        runs[name] = torch.cat([w.flatten() for w in model_weights(tmp_path / name).values()])
    drift = {name: float((runs[name] - runs["fp32"]).norm() / runs["fp32"].norm()) for name in ("bf16", "ef")}
    assert 0 < drift["bf16"] < 2e-3
    assert drift["ef"] < 0.9 * drift["bf16"]


@pytest.mark.parametrize("strategy", ["ps-central-split", "ps-sharded-split"])
@pytest.mark.multiprocess
def test_a_parameter_server_run_trains_over_a_bf16_wire(strategy: str, data: Path, tmp_path: Path) -> None:
    settings = dict(data_dir=data, steps=24, batch_size=16, momentum=0.9, seed=5, workers=2, wire="bf16")
    summary = scaletrain.train(
        "lenet", out=tmp_path / "run", strategy=strategy, error_feedback=True, **settings, **COMMON
    )
    assert summary["steps"] == summary["server_updates"] == 24
    assert len({w["weights_digest"] for w in summary["per_worker"]}) == 1
    reference = scaletrain.train(
        "lenet", out=tmp_path / "fp32", strategy=strategy, **{**settings, "wire": "fp32"}, **COMMON
    )
    assert abs(summary["test_accuracy"] - reference["test_accuracy"]) <= 0.1


def test_a_resumed_run_keeps_its_loss_scale_and_refuses_other_precision_settings(
    tiny_fmnist: Path, tmp_path: Path
) -> None:
    """The scale after the forced overflows is in the checkpoint: stopping after 3 steps and resuming to
    8 ends in the weights (and scale) of 8 uninterrupted steps."""
    settings = dict(data_dir=tiny_fmnist, batch_size=16, momentum=0.9, seed=2, loss_scale="3e38", **COMMON)
    whole = scaletrain.train("lenet", out=tmp_path / "whole", steps=8, **settings)
    scaletrain.train("lenet", out=tmp_path / "parts", steps=3, **settings)
    with pytest.raises(ConfigError, match="cannot resume: the checkpoint was written with precision fp32, dynamic"):
        scaletrain.train("lenet", out=tmp_path / "parts", steps=8, resume=True, **{**settings, "loss_scale": "off"})
    parts = scaletrain.train("lenet", out=tmp_path / "parts", steps=8, resume=True, **settings)
    assert whole["skipped_steps"] > 0
    assert parts["per_worker"][0]["loss_scale"] == whole["per_worker"][0]["loss_scale"]
    first, second = model_weights(tmp_path / "whole"), model_weights(tmp_path / "parts")
    for name in first:
        assert torch.equal(first[name], second[name]), name
