"""README.md's Python example runs as printed: a script's own model on 2 real worker processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO


@pytest.mark.multiprocess
def test_the_readme_python_example_trains_its_own_model_on_two_workers_as_printed(tmp_path: Path) -> None:
    example, _ = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    script = tmp_path / "example.py"
    script.write_text(example)
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "112 steps, test accuracy 1.00"  # 2 epochs of 1792 at batch 32
    assert (tmp_path / "runs/tiny/model.pt").exists()


@pytest.mark.multiprocess
def test_the_readme_plain_functions_example_runs_as_printed(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    _, example = re.findall(r"```python\n(.*?)```", readme, flags=re.S)
    printed = re.search(r"it prints `([^`]+)`:\n\n```python", readme).group(1)
    (tmp_path / "example.py").write_text(example)
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, "example.py"], cwd=tmp_path, env=environment, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == printed == "168 steps, test_loss 0.000"
