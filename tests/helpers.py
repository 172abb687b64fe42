"""Helpers the tests share: data in the real file formats, made by the tests, and the CLI in a subprocess."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from scaletrain.data.synthetic import write_synthetic_fashion_mnist
from scaletrain.parallel.preloaded import start_module

REPO = Path(__file__).resolve().parents[1]
SHARED_PTB = REPO.parent / "shared" / "datasets" / "ptb"
SYSTEM_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
IMAGE_CLASSES = ("001.ak47", "002.bat", "003.cat")
#: The one greyscale image of :func:`make_image_folder`: (class, index) and its grey level.
GREY_IMAGE = (1, 0, 128)


#: Real Fashion-MNIST LeNet runs that several tests read (through the ``trained`` fixture): 2 epochs at
#: batch 64, lr 0.05, momentum 0.9, one torch thread per process (as 2 asynchronous workers get on 2 cores).
REAL_LENET = {
    "epochs": 2,
    "batch_size": 64,
    "lr": 0.05,
    "momentum": 0.9,
    "threads": 1,
    "progress": "off",
    "tensorboard": False,
}
#: The asynchronous run of :data:`REAL_LENET`: 2 workers on the central parameter server.
REAL_ASYNC = {"workers": 2, "strategy": "ps", "server": "central", "sync": "async"}


class TrainedOnce:
    """Runs of ``scaletrain.train`` made once per test session and read by every test asking for the
    same settings: a real-data run costs minutes, and several tests check different things of one run.

    A test must only read what it gets (the summary, the files under the folder), never change it.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.done: dict[str, tuple[dict, Path]] = {}

    def __call__(self, workload: str, **settings: object) -> tuple[dict, Path]:
        """The summary and the output folder of ``scaletrain.train(workload, **settings)``."""
        import scaletrain  # imports torch: only where a test trains

        key = repr((workload, sorted(settings.items())))
        if key not in self.done:
            out = self.folder / f"run{len(self.done)}"
            self.done[key] = (scaletrain.train(workload, out=out, **settings), out)
        return self.done[key]


def make_fashion_mnist(folder: Path, *, train: int = 256, test: int = 64, seed: int = 0) -> Path:
    """A tiny learnable Fashion-MNIST look-alike in the real IDX format (see scaletrain.data.synthetic)."""
    return write_synthetic_fashion_mnist(folder, train=train, test=test, seed=seed)


def image_colour(label: int, index: int) -> tuple[int, int, int]:
    """The solid colour of image ``index`` of class ``label`` in :func:`make_image_folder`."""
    return (30 + 50 * index, 40 + 60 * label, 100)


def make_image_folder(root: Path, *, per_class: int = 4) -> Path:
    """A Caltech256-like folder: 3 classes of solid-colour PNG (even index) and JPEG (odd index) images.

    Sizes differ from any size a test asks for, one image is greyscale (:data:`GREY_IMAGE`), and
    each class folder also holds a non-image file and the first a nested folder, both to be ignored.
    """
    for label, name in enumerate(IMAGE_CLASSES):
        folder = root / name
        folder.mkdir(parents=True)
        for index in range(per_class):
            stem = folder / f"{label + 1:03d}_{index + 1:04d}"
            if (label, index) == GREY_IMAGE[:2]:
                Image.new("L", (48, 36), GREY_IMAGE[2]).save(stem.with_suffix(".jpg"), quality=95)
            elif index % 2:
                Image.new("RGB", (48, 36), image_colour(label, index)).save(stem.with_suffix(".jpg"), quality=95)
            else:
                Image.new("RGB", (30, 50), image_colour(label, index)).save(stem.with_suffix(".png"))
        (folder / "RENAME2").write_text("not an image")
    nested = root / IMAGE_CLASSES[0] / "nested"
    nested.mkdir()
    Image.new("RGB", (8, 8)).save(nested / "ignored.png")
    return root


def free_ports(count: int) -> list[int]:
    """``count`` different ports free now, below the kernel's range for outgoing connections (the launcher's own
    :func:`~scaletrain.parallel.ports.free_port`), so that no other process's connection takes one before the
    job's later trainings bind it."""
    from scaletrain.parallel.ports import free_port

    ports: list[int] = []
    for _ in range(50 * count):
        port = free_port()
        if port not in ports:
            ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} different free ports")


#: The torchrun variables: a job's processes get only those its test gives them.
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


def run_job(
    module: str,
    args: list[str],
    variables: list[dict[str, str]],
    *,
    out: Path,
    unset: tuple[str, ...] = (),
    timeout: float = 240,
) -> list[str]:
    """Run a job as a launcher other than scaletrain's would: ``python -m MODULE ARGS`` once per entry of
    ``variables`` (its rank's torchrun variables), all at once, without the torchrun variables and
    ``unset`` of this process; return what each printed (stdout and stderr, also in ``OUT/job-K.log``).
    Fails naming every process that did not exit with 0."""
    environment = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}", "SCALETRAIN_OFFLINE": "1"}
    for name in (*TORCHRUN_VARIABLES, *unset):
        environment.pop(name, None)
    out.mkdir(parents=True, exist_ok=True)
    logs = [out / f"job-{rank}.log" for rank in range(len(variables))]
    running = []
    try:
        for log, own in zip(logs, variables, strict=True):
            with log.open("wb") as output:
                running.append(
                    start_module([module, *args], {**environment, **own}, stdout=output, stderr=subprocess.STDOUT)
                )
        deadline = time.monotonic() + timeout
        codes = [process.wait(max(0.0, deadline - time.monotonic())) for process in running]
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
    outputs = [log.read_text(errors="replace") for log in logs]
    failed = [(rank, text[-3000:]) for rank, (code, text) in enumerate(zip(codes, outputs, strict=True)) if code]
    assert not failed, failed
    return outputs


def run_cli(*args: str, cwd: Path | None = None, timeout: float = 300, env: dict | None = None):
    """Run ``python -m scaletrain ARGS`` in a real subprocess."""
    environment = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SCALETRAIN_OFFLINE": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "scaletrain", *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@contextlib.contextmanager
def mounted_tmpfs(folder: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``folder`` with mount ``options`` (e.g. ``size=1m`` or ``ro``), for real disk faults.

    Needs root, as in CI; elsewhere the calling test is skipped.
    """
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {result.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def model_weights(out: Path) -> dict:
    """The final weights a run wrote to ``out/model.pt``."""
    import torch

    return torch.load(out / "model.pt", weights_only=True)


def one_process_options(spec: str) -> dict | None:
    """The strategy options under which ``spec`` trains as one process does (diloco: an outer step after every
    inner one, at rate 1 without momentum), for ``strategy_options``; None where its defaults do."""
    from scaletrain.parallel.strategies import STRATEGIES, parse_spec

    return STRATEGIES[parse_spec(spec)[0]].one_process_options or None


def assert_same_weights(first: dict, second: dict) -> None:
    """Weight for weight equal up to float reordering (every strategy sums gradients in its own order)."""
    import torch

    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=1e-4, atol=1e-5, msg=name)


def assert_identical_weights(first: dict, second: dict) -> None:
    """Weight for weight equal to the bit (the same sums in the same order)."""
    import torch

    assert first.keys() == second.keys()
    for name in first:
        assert torch.equal(first[name], second[name]), name


def assert_close_runs(first: Path, second: Path, atol: float) -> None:
    """The final weights of two runs' folders equal within ``atol`` (no relative part)."""
    import torch

    one, two = model_weights(first), model_weights(second)
    assert one.keys() == two.keys()
    for name in one:
        torch.testing.assert_close(one[name], two[name], rtol=0, atol=atol, msg=name)


def mapped_file(address: int) -> str | None:
    """The file this process has mapped at ``address`` (e.g. a tensor's ``data_ptr()``), from /proc/self/maps."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        span, *fields = line.split(maxsplit=5)
        begin, end = (int(part, 16) for part in span.split("-"))
        if begin <= address < end:
            return fields[4] if len(fields) == 5 else None
    return None
