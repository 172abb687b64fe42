"""A one-process run that dies of a signal says so in one line (scaletrain.cli.supervise), with real processes."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from tests.helpers import run_cli

#: A workload whose network kills its own process with ``SIGNAL`` in its third forward pass (a native crash's
#: stand-in: the process ends at once, with no Python code after it).
CRASHING = """
import os, signal, torch
from torch import nn
from scaletrain.workloads.classification import ClassificationWorkload

class Crashing(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer, self.calls = nn.Linear(4, 2), 0

    def forward(self, inputs):
        self.calls += 1
        if self.calls == 3:
            os.kill(os.getpid(), signal.{name})
        return self.layer(inputs)

def make():
    generator = torch.Generator().manual_seed(0)
    data = torch.randn(64, 4, generator=generator), torch.randint(0, 2, (64,), generator=generator)
    return ClassificationWorkload.from_tensors("crashing", Crashing, train=data, test=data, batch_size=8)
"""


@pytest.mark.parametrize("name", ["SIGSEGV", "SIGABRT"])
def test_a_one_process_run_killed_by_a_signal_says_so_in_one_line(name: str, tmp_path: Path) -> None:
    (tmp_path / "crashing.py").write_text(CRASHING.replace("{name}", name))
    result = run_cli(
        "train", "crashing:make", "--steps", "10", "--progress", "off", "--out", str(tmp_path / "run"),
        env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2] / 'src'}"}, timeout=120,
    )  # fmt: skip
    number = int(getattr(signal, name))
    assert result.returncode == 128 + number, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("scaletrain:")]
    assert len(lines) == 1, result.stderr
    assert "the training process (pid " in lines[0] and f"killed by signal {number} ({name})" in lines[0]
    log = Path(re.search(r"traceback is in (\S+?);", lines[0]).group(1))
    try:
        text = log.read_text()
        assert "Fatal Python error" in text and "in forward" in text, text  # faulthandler's, in the log
        assert "Fatal Python error" not in result.stderr, "the traceback goes to the log, not the terminal"
    finally:
        log.unlink()


def test_a_one_process_run_that_ends_normally_leaves_no_fault_log(tmp_path: Path) -> None:
    (tmp_path / "crashing.py").write_text(CRASHING.replace("{name}", "SIGSEGV").replace("== 3", "== -1"))
    result = run_cli(
        "train", "crashing:make", "--steps", "4", "--progress", "off", "--out", str(tmp_path / "run"),
        env={"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parents[2] / 'src'}", "TMPDIR": str(tmp_path)},
        timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert not list(tmp_path.glob("scaletrain-fault-*")), "the supervisor removes an empty fault log"
