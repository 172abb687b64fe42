"""The order in which the test files are handed to pytest-xdist's workers (conftest.py): the longest first by
``tests/durations.json``, which ``tests/durations.py`` writes from a JUnit report."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import durations
from tests.helpers import REPO

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.parallel.test_faults" name="test_a" time="10.5"/>
<testcase classname="tests.parallel.test_faults" name="test_b[1]" time="2.25"/>
<testcase classname="tests.test_config" name="test_c" time="0.5"><skipped message="no"/></testcase>
<testcase classname="scaletrain.workloads.resnet" name="crop_and_flip" time="0.1"/>
</testsuite></testsuites>
"""


def test_a_junit_report_becomes_seconds_per_test_file(tmp_path: Path) -> None:
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    assert durations.file_seconds(report) == {"tests/parallel/test_faults.py": 12.8, "tests/test_config.py": 0.5}


def test_the_longest_files_come_first() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = list(dict.fromkeys(line.split("::")[0] for line in done.stdout.splitlines() if "::" in line))
    seconds = durations.load()
    took = [seconds.get(name, 0.0) for name in files]
    assert took == sorted(took, reverse=True) and took[0] == max(seconds.values()) > 60
