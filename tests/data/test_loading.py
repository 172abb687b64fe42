"""Reading a dataset through a ``DataLoader`` (scaletrain.data.loading) and Fashion-MNIST read image by image
(scaletrain.data.idx_lazy): the batches the tensor path would take, waits that end, workers that stop, and
the same tensors as the whole files loaded at once."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.helpers import make_fashion_mnist
from torch.utils.data import Dataset, TensorDataset

from scaletrain.data.idx import load_fashion_mnist, write_idx
from scaletrain.data.idx_lazy import IdxImages, lazy_fashion_mnist, uncompressed
from scaletrain.data.loading import Loading, load_batches
from scaletrain.data.sampler import EpochBatches, Part, epoch_permutation
from scaletrain.errors import DataError


def children() -> set[int]:
    """This process's living child processes."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0")) == os.getpid() and "zombie" not in fields.get("State", ""):
            found.add(int(status.parent.name))
    return found


def test_two_loader_workers_give_each_part_the_rows_of_the_epochs_order() -> None:
    samples = TensorDataset(torch.arange(40.0).unsqueeze(1), torch.arange(40))
    order = epoch_permutation(40, seed=7, epoch=3)
    for index in range(2):
        batches = EpochBatches(40, batch_size=8, seed=7, epoch=3, part=Part(index, 2), numbers=range(1, 5))
        labels = [labels.tolist() for _, labels in load_batches(samples, batches, Loading(workers=2), seed=0)]
        assert labels == [order[8 * n + 4 * index : 8 * n + 4 * index + 4].tolist() for n in range(1, 5)]


class Slow(Dataset):
    """Every sample takes ``seconds``."""

    def __init__(self, seconds: float = 1.5) -> None:
        self.seconds = seconds

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.seconds)
        return torch.zeros(1), 0


SLOW_LINE = Slow.__getitem__.__code__.co_firstlineno + 1  # its sleep


def test_a_batch_that_does_not_come_within_the_timeout_is_one_line_and_the_workers_stop() -> None:
    before = children()
    with pytest.raises(DataError, match=r"^the data loader's 1 worker processes gave no batch within 0.5 s") as caught:
        list(load_batches(Slow(), [[0], [1]], Loading(workers=1, timeout=0.5), seed=0))
    assert children() <= before
    # the note under the traceback: the worker's stack, down to the line of the dataset it was in
    [note] = caught.value.__notes__
    assert re.search(rf'File "{re.escape(__file__)}", line {SLOW_LINE} in __getitem__', note), note


def test_a_timeout_notes_where_each_worker_was_a_stopped_one_included() -> None:
    """One of the two workers frozen (``SIGSTOP``) as soon as it started: the note says it was stopped, and where
    the other one was; both are gone afterwards."""
    before, stopped = children(), []

    def stop_one() -> None:
        deadline = time.monotonic() + 30
        while len(children() - before) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        stopped.append(min(children() - before))
        os.kill(stopped[0], signal.SIGSTOP)

    freezer = threading.Thread(target=stop_one)
    freezer.start()
    try:
        with pytest.raises(DataError, match="where each worker was is noted under the traceback") as caught:
            list(load_batches(Slow(3), [[0], [1], [2], [3]], Loading(workers=2, timeout=1.5), seed=0))
    finally:
        freezer.join()
        os.kill(stopped[0], signal.SIGCONT)  # it ends on the SIGTERM the loader's shutdown left pending
    [note] = caught.value.__notes__
    assert f"loader worker pid {stopped[0]}: stopped (state T: SIGSTOP, or a debugger); it cannot answer" in note
    [other] = [line for line in note.splitlines() if line.startswith("loader worker pid ") and "stopped" not in line]
    assert re.fullmatch(r"loader worker pid \d+ \(state [RS]\):", other), note
    assert re.search(rf"line {SLOW_LINE} in __getitem__", note), note
    deadline = time.monotonic() + 10
    while not children() <= before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children() <= before


def test_the_workers_stop_when_the_reader_stops_early() -> None:
    samples = TensorDataset(torch.zeros(64, 2), torch.zeros(64, dtype=torch.long))
    before = children()
    read = load_batches(samples, [[i] for i in range(64)], Loading(workers=2), seed=0)
    next(read)
    assert len(children() - before) == 2
    read.close()  # what the training loop does however an epoch ends
    assert children() <= before


def test_lazily_read_images_are_the_tensors_of_the_whole_files(tmp_path: Path) -> None:
    folder = make_fashion_mnist(tmp_path / "fmnist", train=20, test=8)
    whole = load_fashion_mnist(folder)
    train, test = lazy_fashion_mnist(folder, cache=tmp_path / "cache")  # the gzipped images uncompressed once
    assert train.path.parent.parent == tmp_path / "cache"
    for lazy, images, labels in (
        (train, whole.train_images, whole.train_labels),
        (test, whole.test_images, whole.test_labels),
    ):
        assert len(lazy) == len(images)
        assert torch.equal(torch.stack([lazy[i][0] for i in range(len(lazy))]), images)
        assert [lazy[i][1] for i in range(len(lazy))] == labels.tolist()
    assert torch.equal(train[-1][0], whole.train_images[-1])
    with pytest.raises(IndexError):
        train[20]
    again = uncompressed(folder / "train-images-idx3-ubyte.gz", tmp_path / "cache")
    assert again == train.path and uncompressed(train.path, tmp_path / "elsewhere") == train.path


def test_an_image_file_that_cannot_be_read_by_offset_is_one_line(tmp_path: Path) -> None:
    labels = tmp_path / "labels"
    write_idx(labels, np.zeros(3, np.uint8))
    write_idx(tmp_path / "images.gz", np.zeros((3, 28, 28), np.uint8))
    with pytest.raises(
        DataError, match=r"images.gz is gzip-compressed; .* needs the uncompressed file: run `gunzip -k"
    ):
        IdxImages(tmp_path / "images.gz", labels)
    write_idx(tmp_path / "images", np.zeros((3, 28, 28), np.uint8))
    with (tmp_path / "images").open("r+b") as file:
        file.truncate(16 + 2 * 28 * 28)
    with pytest.raises(
        DataError, match=r"images: 1584 bytes, but its header promises 3 images of 28×28 \(2368 bytes\)"
    ):
        IdxImages(tmp_path / "images", labels)
    write_idx(tmp_path / "four", np.zeros((4, 28, 28), np.uint8))
    with pytest.raises(DataError, match=r"labels: \[3\] labels for the 4 images of"):
        IdxImages(tmp_path / "four", labels)
