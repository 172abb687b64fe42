"""Shared fixtures; the helpers behind them live in tests/helpers.py."""

from __future__ import annotations

import os

# Set before anything imports torch: libgomp (torch's OpenMP) reads it once, as torch loads it, and the
# worker processes inherit it. By default a waiting OpenMP thread spins ~300 000 rounds before it
# sleeps, which makes a two-thread run many times slower as soon as another process wants a core
# (LeNet's two real epochs: 170-270 s beside other work, 37 s alone). 2 000 rounds keep the speed of
# a machine to itself and come near not spinning at all beside a busy loop (81 s against 68 s; not
# spinning costs 15-40 % alone). It changes how threads wait, not what they compute.
os.environ.setdefault("GOMP_SPINCOUNT", "2000")

import signal

# A background job of a non-interactive shell (`bash .ci/run &`, nohup) starts with SIGINT ignored, and every
# process it starts inherits that, so a run the tests press Ctrl-C on would never see it (as a user's run
# started that way does not). The tests' processes get the terminal's default back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from pathlib import Path

import numpy as np
import pytest

from tests.helpers import SHARED_PTB, SYSTEM_FASHION_MNIST, TrainedOnce, make_fashion_mnist, make_image_folder


@pytest.fixture
def tiny_fmnist(tmp_path: Path) -> Path:
    return make_fashion_mnist(tmp_path / "fmnist")


@pytest.fixture
def tiny_images(tmp_path: Path) -> Path:
    """Three classes of four small images each (see tests.helpers.make_image_folder)."""
    return make_image_folder(tmp_path / "256_ObjectCategories")


@pytest.fixture
def real_fmnist() -> Path:
    if not (SYSTEM_FASHION_MNIST / "train-images-idx3-ubyte.gz").exists():
        pytest.skip("real Fashion-MNIST not installed: apt-get install dataset-fashion-mnist")
    return SYSTEM_FASHION_MNIST


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> TrainedOnce:
    """``trained(workload, **settings)``: a run trained once per session, shared by the tests that read it."""
    return TrainedOnce(tmp_path_factory.mktemp("trained-once"))


@pytest.fixture
def real_ptb() -> Path:
    if not (SHARED_PTB / "ptb.valid.txt").exists():
        pytest.skip(f"Penn Treebank valid/test files not found in {SHARED_PTB}")
    return SHARED_PTB


@pytest.fixture
def tiny_ptb(tmp_path: Path) -> Path:
    """A few hundred words in Mikolov's format with a small vocabulary."""
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(40)] + ["<unk>", "N"]
    folder = tmp_path / "ptb"
    folder.mkdir()
    for split, lines in (("train", 120), ("valid", 40), ("test", 40)):
        text = "".join(" " + " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) + " \n" for _ in range(lines))
        (folder / f"ptb.{split}.txt").write_text(text)
    return folder
