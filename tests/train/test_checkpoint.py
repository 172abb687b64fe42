from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from scaletrain.errors import ScaletrainError
from scaletrain.train.checkpoint import atomic_save, load_checkpoint


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs, to run out of space for real (needs root, as in CI)."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.decode().strip()}")
    yield mount_point
    subprocess.run(["umount", str(mount_point)], check=True)


def test_full_disk_keeps_the_previous_checkpoint(tiny_disk: Path) -> None:
    target = tiny_disk / "checkpoint.pt"
    atomic_save({"step": 1, "weights": torch.zeros(1000)}, target)
    with pytest.raises(ScaletrainError, match="previous checkpoint.pt is intact.*Free disk space"):
        atomic_save({"step": 2, "weights": torch.zeros(1_000_000)}, target)  # 4 MB does not fit
    assert load_checkpoint(target)["step"] == 1
    assert [path.name for path in tiny_disk.iterdir()] == ["checkpoint.pt"]  # no temporary file left


def test_damaged_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    target = tmp_path / "checkpoint.pt"
    atomic_save({"step": 1}, target)
    target.write_bytes(target.read_bytes()[:20])
    with pytest.raises(ScaletrainError, match="cannot be read.*delete it"):
        load_checkpoint(target)
