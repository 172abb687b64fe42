"""conftest.py's ``alone`` marker under pytest-xdist, in a real pytest run of planted tests with the repository's
conftest.py: no other test runs beside an alone test, and a file's consecutive alone tests keep the machine to
themselves from the first one's start to the last one's end (before, the others' tests started in between)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO

# Every planted test writes when it began and ended (wall clock) into its own file under LOG.
RECORD = """
import json, os, time
from pathlib import Path

import pytest


def record(name, seconds):
    began = time.time()
    time.sleep(seconds)
    Path(os.environ["LOG"], name).write_text(json.dumps([began, time.time()]))
"""

ALONE_FILE = (
    RECORD
    + """

def test_0_beside_the_others():
    record("beside-0", 0.3)  # the other files are under way when the alone tests ask for the machine


def test_1_beside_the_others():
    record("beside-1", 0.3)


def test_2_beside_the_others():
    record("beside-2", 0.3)


@pytest.fixture
def made_slowly():
    time.sleep(0.3)  # a fixture's setup between two alone tests: before, the other tests started there
"""
    + "".join(
        f"\n\n@pytest.mark.alone\ndef test_{n}_alone(made_slowly):\n    record('alone-{n}', 0.4)\n" for n in (3, 4, 5)
    )
)

# fewer tests a file than the alone file's six, which pytest-xdist so hands out first (most tests first)
OTHER_FILE = RECORD + "".join(f"\n\ndef test_{n}():\n    record('{{file}}-{n}', 0.4)\n" for n in range(4))


def test_alone_tests_of_one_file_run_with_no_other_test_from_the_first_to_the_last(tmp_path: Path) -> None:
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_planted_alone.py").write_text(ALONE_FILE)
    for n in range(5):
        (tmp_path / f"test_planted_other_{n}.py").write_text(OTHER_FILE.replace("{file}", f"other{n}"))
    log = tmp_path / "log"
    log.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path),
         "-p", "no:cacheprovider", "-n", "3", "--dist", "loadfile", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env={**os.environ, "LOG": str(log)},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    times = {path.name: json.loads(path.read_text()) for path in log.iterdir()}
    assert len(times) == 6 + 5 * 4  # every planted test ran
    first, last = times["alone-3"][0], times["alone-5"][1]
    assert times["alone-3"][1] <= times["alone-4"][0] and times["alone-4"][1] <= times["alone-5"][0]
    beside = {name: (began, ended) for name, (began, ended) in times.items() if began < last and ended > first}
    assert set(beside) == {"alone-3", "alone-4", "alone-5"}, beside
    assert any(began > last for began, _ in times.values()), "the other tests were still to run: the test tests"
