from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tests.helpers import mounted_tmpfs

from scaletrain.errors import ScaletrainError
from scaletrain.train.checkpoint import atomic_save, load_checkpoint, resume_advice


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs, to run out of space for real."""
    with mounted_tmpfs(tmp_path / "disk", "size=1m") as folder:
        yield folder


def test_full_disk_keeps_the_previous_checkpoint(tiny_disk: Path) -> None:
    target = tiny_disk / "checkpoint.pt"
    atomic_save({"step": 1, "weights": torch.zeros(1000)}, target)
    with pytest.raises(ScaletrainError, match="previous checkpoint.pt is intact; free space.*--resume"):
        atomic_save({"step": 2, "weights": torch.zeros(1_000_000)}, target)  # 4 MB does not fit
    assert load_checkpoint(target)["step"] == 1
    assert [path.name for path in tiny_disk.iterdir()] == ["checkpoint.pt"]  # no temporary file left


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (lambda good: good[:20], "is damaged or is not a scaletrain checkpoint"),
        (lambda good: os.urandom(4096), "is damaged or is not a scaletrain checkpoint"),
        (lambda good: b"", r"is empty \(0 bytes\)"),
    ],
    ids=["truncated", "random-bytes", "empty"],
)
def test_damaged_checkpoint_is_a_clear_error(tmp_path: Path, damage, expected: str) -> None:
    target = tmp_path / "checkpoint.pt"
    atomic_save({"step": 1}, target)
    target.write_bytes(damage(target.read_bytes()))
    with pytest.raises(ScaletrainError, match=f"{expected}.*delete it") as caught:
        load_checkpoint(target)
    message = str(caught.value)
    # torch's own advice (re-running with weights_only=False) must never reach the user, nor an empty reason.
    assert "weights_only" not in message and "()" not in message and "\n" not in message


def test_a_failed_first_write_does_not_promise_a_checkpoint(tmp_path: Path) -> None:
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        if os.access(folder, os.W_OK):  # root ignores permissions; a file in the way fails for everyone
            folder = tmp_path / "a-file"
            folder.write_text("")
            target = folder / "checkpoint.pt"
        else:
            target = folder / "checkpoint.pt"
        with pytest.raises(ScaletrainError, match="no checkpoint.pt was written; .*start the run again") as caught:
            atomic_save({"step": 1}, target)
        assert "--resume" not in str(caught.value)
    finally:
        (tmp_path / "read-only").chmod(0o700)


def test_resume_advice_tells_what_is_on_disk(tmp_path: Path) -> None:
    assert "no checkpoint was written" in resume_advice(tmp_path)
    assert "--resume" not in resume_advice(tmp_path)
    atomic_save({"step": 1}, tmp_path / "checkpoint.pt")
    assert f"continue with --resume --out {tmp_path}" in resume_advice(tmp_path)
