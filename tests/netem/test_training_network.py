"""Training across emulated networks: two workers in namespaces; a slower link costs more time."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from tests.helpers import make_fashion_mnist, run_cli

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.skipif(os.geteuid() != 0 or shutil.which("tc") is None, reason="needs root and iproute2 (tc)"),
]


@pytest.mark.alone  #
def test_communication_time_grows_as_the_rate_falls(tmp_path: Path) -> None:
    data = make_fashion_mnist(tmp_path / "data", train=256, test=32)
    communication = {}
    before = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for rate in ("40mbit", "400mbit"):
        out = tmp_path / rate
        result = run_cli(
            "train",
            "lenet",
            "--data-dir",
            str(data),
            "--workers",
            "2",
            "--strategy",
            "ps",
            "--sync",
            "split",
            "--steps",
            "10",
            "--warmup-steps",
            "2",
            "--batch-size",
            "16",
            "--network",
            rate,
            "--out",
            str(out),
            "--no-tensorboard",
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        communication[rate] = json.loads((out / "summary.json").read_text())["communication_seconds_per_step"]
    # LeNet's 1.7 MB of weights go to the server and back every step: ≈ 2 × 1.7 MB × 8 / rate.
    assert communication["40mbit"] > 0.5  # ≈ 0.7 s at 40 Mbit/s
    assert communication["40mbit"] > 4 * communication["400mbit"]
    after = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert after == before  # every namespace the runs made is gone


def test_network_needs_a_valid_rate(tmp_path: Path) -> None:
    result = run_cli("train", "lenet", "--workers", "2", "--network", "fast", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "fast" in result.stderr
