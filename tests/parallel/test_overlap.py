"""``--overlap``: buckets of gradients all-reduced during backward by real 2-process gloo runs. The float32
wire gives the weights of the run without overlap, compressed buckets leave every worker alike and resume
exactly, a reconfiguration re-makes the buckets, synchronised batch norm's collectives in backward do not
mix with the buckets' own, and what cannot overlap is refused in one line before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.helpers import assert_close_runs, make_fashion_mnist, model_weights, run_cli
from torch import nn

import scaletrain
from scaletrain.parallel.strategies.overlap import buckets_of

pytestmark = pytest.mark.multiprocess

SETTINGS = {"workers": 2, "batch_size": 12, "momentum": 0.9, "seed": 3, "threads": 1, "progress": "off",
            "tensorboard": False}  # fmt: skip
#: LeNet's gradients are 1.7 MB: buckets of 0.1 MiB cut them into 5 (its 1.6 MB first layer alone in one)
BUCKETS = {"overlap": True, "bucket_mb": 0.1}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_fashion_mnist(tmp_path_factory.mktemp("overlap") / "fmnist", train=192, test=32)


def test_buckets_follow_backward_and_cover_every_parameter() -> None:
    model = nn.Sequential(nn.Linear(10, 20), nn.ReLU(), nn.Linear(20, 30), nn.Linear(30, 2))
    parameters = list(model.parameters())
    buckets = buckets_of(parameters, 4 * 600)
    assert [p for bucket in buckets for p in bucket] == parameters[::-1]  # each once, the last layer first
    assert [sum(p.numel() for p in bucket) for bucket in buckets] == [2 + 60 + 30 + 600, 20 + 200]


def test_overlapped_float32_trains_as_the_exchange_after_backward(data: Path, tmp_path: Path) -> None:
    """The same sums of the same gradients: equal weights (2 workers: a sum of two is the same in any order;
    measured 0.0 apart), the same bytes, every worker alike."""
    common = dict(data_dir=data, steps=6, **SETTINGS)
    plain = scaletrain.train("lenet", out=tmp_path / "plain", **common)
    overlapped = scaletrain.train("lenet", out=tmp_path / "overlapped", **common, **BUCKETS)
    assert overlapped["overlap"] is True and overlapped["bucket_mb"] == 0.1 and plain["overlap"] is False
    assert_close_runs(tmp_path / "plain", tmp_path / "overlapped", atol=1e-7)
    for summary in (plain, overlapped):
        assert len({w["weights_digest"] for w in summary["per_worker"]}) == 1
    assert [w["gradient_bytes_sent"] for w in overlapped["per_worker"]] == [
        w["gradient_bytes_sent"] for w in plain["per_worker"]
    ]


def test_overlapped_full_rank_powersgd_trains_as_the_dense_wire(data: Path, tmp_path: Path) -> None:
    """Each bucket factors its own matrices: at full rank that is the dense sum but for the QR's rounding."""
    common = dict(data_dir=data, steps=6, **SETTINGS)
    scaletrain.train("lenet", out=tmp_path / "dense", **common)
    full = scaletrain.train(
        "lenet", out=tmp_path / "full", wire="powersgd", wire_options={"rank": 500, "min_gain": 0}, **common, **BUCKETS
    )
    assert_close_runs(tmp_path / "dense", tmp_path / "full", atol=1e-6)
    assert len({w["weights_digest"] for w in full["per_worker"]}) == 1


@pytest.mark.parametrize(("wire", "options"), [("powersgd", {"rank": 1}), ("topk", {"ratio": 0.05})])
def test_a_resumed_overlapped_compressed_run_ends_as_an_uninterrupted_one(
    wire: str, options: dict, data: Path, tmp_path: Path
) -> None:
    """Every bucket's residuals (and PowerSGD's Qs) are saved beside the checkpoint: stopped after 5 of 8
    steps and resumed, the same weights as 8 steps straight; every worker alike; fewer bytes than dense."""
    common = dict(data_dir=data, epochs=1, wire=wire, wire_options=options, **SETTINGS, **BUCKETS)
    straight = scaletrain.train("lenet", out=tmp_path / "straight", **common)
    assert scaletrain.train("lenet", out=tmp_path / "stopped", steps=5, **common)["steps"] == 5
    resumed = scaletrain.train("lenet", out=tmp_path / "stopped", resume=True, **common)
    assert resumed["resumed_from_step"] == 5 and resumed["steps"] == 8
    assert_close_runs(tmp_path / "straight", tmp_path / "stopped", atol=1e-6)
    assert len({w["weights_digest"] for w in straight["per_worker"]}) == 1
    dense_bytes = 8 * 4 * sum(p.numel() for p in model_weights(tmp_path / "straight").values())
    assert 0 < straight["per_worker"][0]["gradient_bytes_sent"] < dense_bytes / 4


def test_overlapped_powersgd_goes_on_through_a_reconfiguration(data: Path, tmp_path: Path) -> None:
    """``narrow`` halves LeNet's hidden layer after the first epoch: the buckets and their codecs are made
    anew for the new tensors (the old hooks removed), every worker alike, and training goes on."""
    narrow = {"technique": "narrow", "technique_options": {"layer": "classifier.1", "fraction": "0.5", "epoch": "1"}}
    run = scaletrain.train(
        "lenet", out=tmp_path / "run", data_dir=data, epochs=2, wire="powersgd", wire_options={"rank": 2},
        **narrow, **SETTINGS, **BUCKETS,
    )  # fmt: skip
    assert run["parameters"] < run["parameters_initial"]
    assert run["steps"] == 16
    assert len({w["weights_digest"] for w in run["per_worker"]}) == 1
    assert all(w["last_step_loss"] < w["first_step_loss"] for w in run["per_worker"])


def test_synchronised_batch_norm_collectives_in_backward_do_not_mix_with_the_buckets(
    data: Path, tmp_path: Path
) -> None:
    """ResNet-20's synchronised batch norm all-reduces in backward on the default group while the buckets
    go on their own group: no hang, no mixed messages, the weights of the run without overlap."""
    common = dict(data_dir=data, steps=3, sync="split", sync_batchnorm=True, options={"dataset": "fashion-mnist"},
                  **SETTINGS)  # fmt: skip
    scaletrain.train("resnet20", out=tmp_path / "plain", **common)
    scaletrain.train("resnet20", out=tmp_path / "overlapped", **common, overlap=True, bucket_mb=0.05)
    assert_close_runs(tmp_path / "plain", tmp_path / "overlapped", atol=1e-6)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--overlap", "--strategy", "ps"],
            "--overlap reduces gradients during backward under all-reduce, not --strategy ps; use --strategy "
            "allreduce, or drop --overlap",
        ),
        (
            ["--overlap", "--min-workers", "1"],
            "--overlap is not available to an elastic run (--min-workers): drop one of the two",
        ),
        (
            ["--overlap", "--precision", "bf16", "--loss-scale", "1024"],
            "--overlap sends gradients before dynamic loss scaling can unscale them; use --precision bf16 or "
            "--loss-scale off with --overlap, or drop --overlap",
        ),
        (["--overlap", "--bucket-mb", "0"], "bucket_mb must be a number of MiB > 0, e.g. --bucket-mb 0.25; got 0.0"),
        (["--bucket-mb", "1"], "--bucket-mb 1 sizes the buckets of --overlap; add --overlap, or drop it"),
    ],
)
def test_what_cannot_overlap_is_one_line_before_any_process_starts(
    flags: list[str], message: str, data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "never"
    result = run_cli("train", "lenet", "--workers", "2", "--data-dir", str(data), "--out", str(out), *flags)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [f"scaletrain: error: {message}"]
    assert not out.exists()
