"""Seconds each test file took in a CI run, for handing the longest files out first (conftest.py).

``python tests/durations.py JUNIT.xml`` rewrites ``tests/durations.json`` from a run's JUnit report
(``PYTEST_ADDOPTS=--junitxml=JUNIT.xml bash .ci/run``). A file missing from it counts as quick; stale figures only
make the order less good, never a test wrong.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path
from xml.etree import ElementTree

DURATIONS = Path(__file__).with_name("durations.json")


def file_seconds(junit: Path) -> dict[str, float]:
    """Test file (relative to the repository, ``tests/parallel/test_faults.py``) → its tests' seconds, summed."""
    seconds: Counter[str] = Counter()
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        if module.startswith("tests."):
            seconds[module.replace(".", "/") + ".py"] += float(case.get("time", 0))
    return {name: round(value, 1) for name, value in sorted(seconds.items())}


def load() -> dict[str, float]:
    try:
        return json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return {}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/durations.py JUNIT.xml")
    DURATIONS.write_text(json.dumps(file_seconds(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {DURATIONS}")
