"""How the test session shares this machine when pytest-xdist runs several tests at once (``-n``, pyproject.toml).

* Each test file runs whole on one xdist worker (``--dist loadfile``), so a module's fixtures are made
  once, as without xdist. Tests that read one session-scoped run (the ``trained`` fixture) sit in one
  file for the same reason (tests/parallel/test_real_lenet.py).
* Files that hold ``slow`` tests are collected first. pytest-xdist hands the files out most tests first (its
  ``--loadscope-reorder``, on by default), so under xdist this order only breaks ties. Two orders that hand out
  long files first took pytest 1436 s and 1459 s in CI on 2 cores, this one 1323 s and 1495 s (2026-12-06): no
  order measured better beyond the noise between runs.
* A test marked ``alone`` measures time or speed: its body runs with no other test beside it. It takes a
  lock exclusively for its call phase while every other test holds it shared (an alone test's setup and
  teardown hold it shared: its fixtures, the container image among them, are made beside other tests); a
  test waiting to be alone keeps new tests from starting until it has run. An alone test followed by another of
  its file keeps the lock for it (the second's setup then runs alone too). Without xdist there is no lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

#: How long a test waits for the lock before it fails: far longer than any test of the suite runs.
LOCK_TIMEOUT_S = 3600.0


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "alone: measures time or speed; under pytest-xdist no other test runs beside it (conftest.py)",
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups into the test ids
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: the order within a file is kept


def _take(handle: int, mode: int, what: str) -> None:
    waited_from = time.monotonic()
    while True:
        try:
            fcntl.flock(handle, mode | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() - waited_from > LOCK_TIMEOUT_S:
                raise TimeoutError(f"waited {LOCK_TIMEOUT_S:.0f} s for {what}: does a test of this run hang?") from None
            time.sleep(0.05)


def _lock_files(config: pytest.Config) -> tuple[Path, Path] | None:
    """The run's gate and lock files, shared by its xdist workers; None in a session xdist did not start
    (no xdist, or a pytest that a test runs in a subprocess: it must not wait for the test that started it)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None:
        return None
    folder = Path(tempfile.gettempdir())
    run = workerinput["testrunuid"]
    return folder / f"scaletrain-tests-{run}.gate", folder / f"scaletrain-tests-{run}.lock"


@contextlib.contextmanager
def company(config: pytest.Config, alone: bool) -> Iterator[None]:
    """Hold the run's lock for one test: exclusively when it must be alone, shared otherwise."""
    files = _lock_files(config)
    if files is None:  # not under xdist: one test at a time anyway
        yield
        return
    # The gate gives a test waiting to be alone priority: while it holds the gate, no new test starts.
    with open(files[0], "a") as gate, open(files[1], "a") as lock:
        if alone:
            _take(gate.fileno(), fcntl.LOCK_EX, "the other tests to end")
            _take(lock.fileno(), fcntl.LOCK_EX, "the other tests to end")
        else:
            _take(gate.fileno(), fcntl.LOCK_SH, "a test that runs alone")
            _take(lock.fileno(), fcntl.LOCK_SH, "a test that runs alone")
            fcntl.flock(gate.fileno(), fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
            fcntl.flock(gate.fileno(), fcntl.LOCK_UN)


def _alone(item: pytest.Item) -> bool:
    return item.get_closest_marker("alone") is not None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    # A test that is not alone holds the lock shared around setup, call and teardown.
    if _alone(item):  # its phases take the lock one by one (below)
        return (yield)
    with company(item.config, alone=False):
        return (yield)


def _shared_phase(item: pytest.Item) -> contextlib.AbstractContextManager:
    """The shared lock around an alone test's setup or teardown (nothing for the other tests: they hold it already,
    nor for a phase that runs under the exclusive lock an alone test before it kept)."""
    return contextlib.nullcontext() if not _alone(item) or _kept.held else company(item.config, alone=False)


class _Kept:
    """The exclusive lock of an alone test whose next test on this worker is an alone test of the same file: kept
    through the first's teardown and the second's setup, so that the other workers' tests, waiting to start, do not
    start in between only to be waited for again (a file of eight alone tests waited for the others eight times)."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None

    @property
    def held(self) -> bool:
        return self._stack is not None

    def take(self, config: pytest.Config) -> None:
        if self._stack is None:
            stack = contextlib.ExitStack()
            stack.enter_context(company(config, alone=True))
            self._stack = stack

    def release(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


_kept = _Kept()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    # An alone test's fixtures are made beside other tests (the container image is built in 70 s), shared:
    # nothing it makes there is measured; a fixture that measures would belong in the test's body.
    with _shared_phase(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if _alone(item):
        _kept.take(item.config)  # released after its teardown, or after the next one's (the same file's, alone too)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        with _shared_phase(item):
            return (yield)
    finally:
        if _kept.held and not (nextitem is not None and _alone(nextitem) and nextitem.path == item.path):
            _kept.release()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _kept.release()
    # A worker that has finished runs no more tests; one still running makes new files and is alone.
    for path in _lock_files(session.config) or ():
        path.unlink(missing_ok=True)
