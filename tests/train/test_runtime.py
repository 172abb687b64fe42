"""One behaviour for every process: default threads, the allocator setting, and what the summary records."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO, make_fashion_mnist, run_cli

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.train.runtime import (
    ENV_GLIBC_TUNABLES,
    ENV_MALLOC,
    ENV_MALLOC_MMAP_THRESHOLD,
    ENV_MALLOC_TRIM_THRESHOLD,
    ProcessSettings,
    available_cores,
    configure_process,
    default_threads,
    tune_allocator,
)

GLIBC = platform.libc_ver()[0] == "glibc"
needs_glibc = pytest.mark.skipif(not GLIBC, reason="the allocator setting is for glibc only")
USER_VARIABLES = (ENV_MALLOC_MMAP_THRESHOLD, ENV_MALLOC_TRIM_THRESHOLD, ENV_GLIBC_TUNABLES)

# Eight 16 MiB buffers, written and freed, four rounds: like a step's activations, each under the
# 32 MiB mmap threshold but 128 MiB together, more than glibc's dynamic trim threshold (≤ 64 MiB).
ROUNDS_SCRIPT = """
import ctypes, resource
from scaletrain.train.runtime import configure_process
settings = configure_process(1)
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
size, count, faults = 16 * 2**20, 8, []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    blocks = [libc.malloc(size) for _ in range(count)]
    for block in blocks:
        ctypes.memset(block, 1, size)
    for block in reversed(blocks):
        libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(settings.allocator, faults[-1])
"""
ROUND_PAGES = 8 * 16 * 2**20 // os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def torch_threads():
    """Give the test process its torch thread count back."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without any allocator setting of the user, plus ``extra``."""
    environment = {k: v for k, v in os.environ.items() if k not in (*USER_VARIABLES, ENV_MALLOC)}
    return {**environment, "PYTHONPATH": str(REPO / "src"), **extra}


@pytest.mark.parametrize(
    ("processes_on_host", "cores", "threads"),
    [(1, 8, 8), (2, 8, 4), (3, 8, 2), (8, 8, 1), (4, 2, 1), (1, 1, 1)],
)
def test_default_threads_share_the_cores_among_the_processes_of_the_host(
    processes_on_host: int, cores: int, threads: int
) -> None:
    assert default_threads(processes_on_host, cores=cores) == threads


def test_available_cores_are_those_this_process_may_run_on() -> None:
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert available_cores() == expected
    assert default_threads() == expected


def test_configure_process_sets_torch_threads(torch_threads: None) -> None:
    off = {ENV_MALLOC: "off"}
    assert configure_process(2, processes_on_host=8, environ=off) == ProcessSettings(threads=2, allocator="off")
    assert torch.get_num_threads() == 2  # a given count wins over the default
    crowded = configure_process(None, processes_on_host=available_cores(), environ=off)
    assert crowded.threads == torch.get_num_threads() == 1
    alone = configure_process(None, environ=off)
    assert alone.threads == torch.get_num_threads() == available_cores()
    with pytest.raises(dataclasses.FrozenInstanceError):
        alone.threads = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "environ",
    [
        {ENV_MALLOC_MMAP_THRESHOLD: "131072"},
        {ENV_MALLOC_TRIM_THRESHOLD: "0"},
        {ENV_GLIBC_TUNABLES: "glibc.malloc.trim_threshold=0"},
        {ENV_GLIBC_TUNABLES: "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=65536"},
        {ENV_MALLOC: "on", ENV_MALLOC_TRIM_THRESHOLD: "0"},
    ],
)
def test_the_users_own_allocator_settings_win(environ: dict[str, str]) -> None:
    assert tune_allocator(environ) == "user"


@pytest.mark.parametrize("value", ["off", "OFF", " off "])
def test_the_off_switch_leaves_the_allocator_alone(value: str) -> None:
    assert tune_allocator({ENV_MALLOC: value, ENV_MALLOC_TRIM_THRESHOLD: "0"}) == "off"


def test_an_unknown_switch_value_names_the_fix() -> None:
    with pytest.raises(ConfigError, match="SCALETRAIN_MALLOC='of' is not understood; set it to 'on' or 'off'"):
        tune_allocator({ENV_MALLOC: "of"})


@needs_glibc
def test_glibc_is_tuned_unless_told_otherwise() -> None:
    assert tune_allocator({}) == "tuned"
    assert tune_allocator({ENV_MALLOC: "on", ENV_GLIBC_TUNABLES: "glibc.malloc.arena_max=2"}) == "tuned"


@needs_glibc
@pytest.mark.parametrize(
    ("extra", "allocator", "kept"),
    [
        ({}, "tuned", True),
        ({ENV_MALLOC: "off"}, "off", False),
        ({ENV_MALLOC_TRIM_THRESHOLD: "0"}, "user", False),  # the user's choice is not overridden
    ],
)
def test_freed_buffers_stay_in_the_process_only_when_tuned(extra: dict[str, str], allocator: str, kept: bool) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ROUNDS_SCRIPT],
        env=clean_environment(**extra),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    reported, faults = done.stdout.split()
    assert reported == allocator
    # Kept: the fourth round reuses the pages the first one faulted in. Returned: it faults them all again.
    if kept:
        assert int(faults) < ROUND_PAGES // 20
    else:
        assert int(faults) > ROUND_PAGES // 2


def test_a_one_process_run_records_threads_and_allocator(
    tiny_fmnist: Path, tmp_path: Path, torch_threads: None
) -> None:
    summary = scaletrain.train(
        "lenet", data_dir=tiny_fmnist, out=tmp_path / "run", steps=6, batch_size=16, warmup_steps=2, progress="off"
    )
    written = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert written["threads"] == summary["threads"] == default_threads() == torch.get_num_threads()
    assert written["allocator"] == tune_allocator()  # tuned on glibc unless this environment says otherwise
    (worker,) = written["per_worker"]
    assert worker["minor_faults_per_step"] == written["minor_faults_per_step"] >= 0


@needs_glibc
def test_a_bench_child_without_the_setting_reports_its_page_faults(tmp_path: Path) -> None:
    # Batch 512 frees about 50 MB of activations a step; untuned glibc returns them to the kernel, so
    # every measured step faults thousands of pages in again. 6 batches an epoch: no evaluation between.
    data = make_fashion_mnist(tmp_path / "fmnist", train=3072, test=64)
    out = tmp_path / "run"
    flags = ("--steps", "5", "--batch-size", "512", "--warmup-steps", "2", "--threads", "1")
    done = run_cli(
        *("train", "lenet", "--data-dir", str(data), "--out", str(out), *flags, "--progress", "off"),
        "--no-tensorboard",
        env={ENV_MALLOC: "off"},  # wins over any allocator variable of this environment
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    written = json.loads((out / "summary.json").read_text())
    assert (written["threads"], written["allocator"]) == (1, "off")
    (worker,) = written["per_worker"]
    assert worker["measured_steps"] == 3
    assert worker["minor_faults_per_step"] == written["minor_faults_per_step"] > 1000


def test_a_process_of_a_run_starts_without_matplotlib() -> None:
    """Every process of a run imports the worker module; matplotlib (a third of a second of each start)
    is imported only when a picture is drawn."""
    code = "import sys, scaletrain.parallel.worker; print(sorted(m for m in sys.modules if m.startswith('matplotlib')))"
    environment = clean_environment()
    done = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
