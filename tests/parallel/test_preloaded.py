"""A process forked from the preloaded server is the process ``python -m`` would have started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.helpers import REPO

from scaletrain.parallel import preloaded
from scaletrain.parallel.preloaded import ENV_WORKER_START, can_fork, start_forked

PROBE = """
import json, os, sys
print(json.dumps({"path": sys.path, "cwd": os.getcwd(), "argv": sys.argv, "name": __name__,
                  "setting": os.environ.get("PROBE_SETTING"), "ppid": os.getppid()}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


@pytest.fixture
def probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "probe_module.py").write_text(PROBE, encoding="utf-8")
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    inherited = dict(os.environ)
    if preloaded._server_environment is not None:  # a server an earlier test's run started: be a rank it can fork
        inherited = {key: value for key, value in inherited.items() if not key.startswith(preloaded.STARTUP_PREFIXES)}
        started = preloaded._server_environment
        inherited.update({key: value for key, value in started.items() if key not in ("PYTHONPATH", "executable")})
    return {**inherited, "PYTHONPATH": str(tmp_path / "modules"), "PROBE_SETTING": "rank 1"}


def forked(environment: dict[str, str], tmp_path: Path, *args: str) -> tuple[int, dict, str]:
    with (tmp_path / "out.log").open("wb") as out:
        process = start_forked(["probe_module", *args], environment, stdout=out, stderr=subprocess.PIPE)
        error = process.stderr.read().decode()
        code = process.wait(60)
    return code, json.loads((tmp_path / "out.log").read_text().splitlines()[0]), error


def test_the_fork_has_the_path_folder_arguments_and_environment_of_python_m(
    probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "private"))  # what only this process can import
    assert can_fork(probe)
    code, seen, error = forked(probe, tmp_path, "--flag", "value")
    started = subprocess.run(
        [sys.executable, "-m", "probe_module", "--flag", "value"], env=probe, capture_output=True, text=True, timeout=60
    )
    expected = json.loads(started.stdout.splitlines()[0])
    assert code == started.returncode == 0 and error == started.stderr == "to stderr\n"
    assert seen["ppid"] != os.getpid() and expected["ppid"] == os.getpid()  # a fork of the server, not of this process
    for key in ("path", "cwd", "argv", "name", "setting"):
        assert seen[key] == expected[key], key
    assert str(tmp_path / "private") not in seen["path"]  # a process started elsewhere could not import it either


def test_exit_codes_and_signals_are_those_of_a_process(probe, tmp_path: Path) -> None:
    code, _, _ = forked({**probe, "PROBE_EXIT": "3"}, tmp_path)
    assert code == 3
    (tmp_path / "modules" / "failing.py").write_text("raise RuntimeError('planted')\n", encoding="utf-8")
    with (tmp_path / "failing.log").open("wb") as out:
        process = start_forked(["failing"], probe, stdout=out, stderr=subprocess.STDOUT)
        assert process.wait(60) == 1  # an uncaught exception: code 1 and its traceback, as python -m
    assert "Traceback" in (log := (tmp_path / "failing.log").read_text()) and "RuntimeError: planted" in log
    (tmp_path / "modules" / "sleeper.py").write_text("import time\ntime.sleep(60)\n", encoding="utf-8")
    process = start_forked(["sleeper"], probe, stdout=None, stderr=None)
    time.sleep(0.5)
    assert process.poll() is None
    process.send_signal(signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL and process.returncode == -signal.SIGKILL
    waited = start_forked(["sleeper"], probe, stdout=None, stderr=None)
    with pytest.raises(subprocess.TimeoutExpired):
        waited.wait(0.2)
    waited.kill()
    assert waited.wait(30) == -signal.SIGKILL


def test_a_changed_startup_setting_or_exec_starts_python_m(probe, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preloaded, "_server_environment", preloaded._startup(probe))
    assert can_fork({**probe, "PROBE_SETTING": "another rank"})  # read at run time: the fork sets it
    assert can_fork({**probe, "PYTHONPATH": "/elsewhere"})  # the fork sets sys.path from it
    assert can_fork({**probe, "TORCHINDUCTOR_CACHE_DIR": "/elsewhere"})  # inductor sets it at its first compile
    assert not can_fork({**probe, "OMP_NUM_THREADS": "7"})  # read when OpenMP loads: a fresh process
    assert not can_fork({**probe, "PYTHONHASHSEED": "3"})
    assert not can_fork({**probe, ENV_WORKER_START: "exec"})


def test_a_script_of_the_users_is_not_imported_again(probe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "train.py"  # a script without a main guard: importing it would start its run again
    script.write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\n", encoding="utf-8")
    main = type(sys)("__main__")
    main.__file__, main.__spec__ = str(script), None
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert can_fork(probe)
    code, _, _ = forked(probe, tmp_path)
    assert code == 0 and not (tmp_path / "imported").exists() and sys.modules["__main__"] is main


LAUNCHER = """
import subprocess, sys, time
from scaletrain.parallel import preloaded
preloaded.PRELOAD = []  # a server that starts at once: the test is about how it ends
environment = {**__import__("os").environ, "PYTHONPATH": sys.argv[1]}
with open(sys.argv[2], "wb") as out:
    process = preloaded.start_forked(["sleeper"], environment, stdout=out, stderr=subprocess.STDOUT)
print(process.pid, flush=True)
time.sleep(120)
"""


def test_forks_die_with_their_launcher(probe, tmp_path: Path) -> None:
    (tmp_path / "modules" / "sleeper.py").write_text("import time\ntime.sleep(120)\n", encoding="utf-8")
    launcher = subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, probe["PYTHONPATH"], str(tmp_path / "sleeper.log")],
        env={**probe, "PYTHONPATH": str(REPO / "src")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        fork = int(launcher.stdout.readline())
        assert Path(f"/proc/{fork}").exists()
    finally:
        launcher.kill()
        launcher.wait(30)
    deadline = time.monotonic() + 20
    while Path(f"/proc/{fork}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{fork}").exists()  # the server saw its launcher go, and its forks went with it
