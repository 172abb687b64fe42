"""``ClassificationWorkload.from_datasets``: a user's map-style datasets read through a ``DataLoader`` (issue 25
item 4), in one process; tests/parallel/test_loader_workers.py trains it on 2 workers under every strategy.

- Fashion-MNIST read image by image from the IDX file, with two loader workers, trains to the very weights
  of the built-in ``lenet`` on the same files: the same tensors in the same order;
- a dataset whose samples are no ``(input, label)`` pairs, or a label the model has no output for (in the
  first batch, or later), is one line naming the fix from the API and from the command (exit code 2), and
  the loader's worker processes are gone when the error arrives;
- ``loader_workers`` below 0, or for a workload that holds its data in memory, is refused before anything starts.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist
from tests.helpers import model_weights as weights
from tests.parallel.lazy_fashion import Broken, LazyFashion, network
from torch.utils.data import Dataset, IterableDataset, TensorDataset

import scaletrain
from scaletrain.cli import main
from scaletrain.data.idx_lazy import lazy_fashion_mnist
from scaletrain.data.sampler import epoch_permutation
from scaletrain.errors import ConfigError, DataError
from scaletrain.workloads import WORKLOADS
from scaletrain.workloads.lenet import LeNet5

COMMON = {"threads": 1, "progress": "off", "tensorboard": False, "seed": 2, "batch_size": 16, "warmup_steps": 1}


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny Fashion-MNIST files with uncompressed images (read by offset) and gzipped labels."""
    folder = make_fashion_mnist(tmp_path_factory.mktemp("from-datasets") / "fmnist", train=96, test=32)
    for prefix in ("train", "t10k"):
        subprocess.run(["gunzip", str(folder / f"{prefix}-images-idx3-ubyte.gz")], check=True)
    return folder


def children() -> set[int]:
    """This process's child processes now."""
    found = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(line.split(":\t", 1) for line in status.read_text().splitlines() if ":\t" in line)
        except OSError:
            continue
        if int(fields.get("PPid", "0")) == os.getpid() and "zombie" not in fields.get("State", ""):
            found.add(int(status.parent.name))
    return found


def test_lazily_read_images_train_like_lenet_on_the_same_files(data: Path, tmp_path: Path) -> None:
    summary = scaletrain.train("lenet", data_dir=data, out=tmp_path / "lenet", epochs=1, **COMMON)
    own = scaletrain.ClassificationWorkload.from_datasets(LeNet5, *lazy_fashion_mnist(data), name="lazy-lenet")
    lazy = scaletrain.train(own, out=tmp_path / "lazy", epochs=1, loader_workers=2, **COMMON)
    expected = weights(tmp_path / "lenet")
    for name, value in weights(tmp_path / "lazy").items():
        assert torch.equal(value, expected[name]), name
    assert lazy["test_accuracy"] == summary["test_accuracy"] and lazy["steps"] == 96 // 16
    assert lazy["loader_workers"] == 2 and summary["loader_workers"] == 0
    assert lazy["data_seconds_per_step"] > 0 and lazy["compute_seconds_per_step"] > 0
    assert lazy["quality_warning"] is None  # the chance level comes from the evaluation's pass over the test set


class Images(Dataset):
    """Samples that are ``(image, label)`` as ``make`` makes them from a row of a 4 × 2 table."""

    def __init__(self, make) -> None:
        self.make = make

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int):
        return self.make(torch.ones(2) * index, index % 2)


class Stream(IterableDataset):
    def __iter__(self):
        yield torch.zeros(2), 0


@pytest.mark.parametrize(
    ("dataset", "error", "message"),
    [
        (Images(lambda x, y: x), DataError, "sample 0 of the train dataset is a Tensor, not an (input, label) pair"),
        (Images(lambda x, y: {"x": x, "y": y}), DataError, "sample 0 of the train dataset is a dict, not an"),
        (Images(lambda x, y: (x, y, y)), DataError, "sample 0 of the train dataset is a tuple of 3, not an"),
        (Images(lambda x, y: ("a picture", y)), DataError, "sample 0 of the train dataset has a str as its input"),
        (Images(lambda x, y: (x, "cat")), DataError, "sample 0 of the train dataset has the label 'cat', not a class"),
        (Images(lambda x, y: (x, float(y))), DataError, "sample 0 of the train dataset has the label 0.0, not a"),
        (Stream(), ConfigError, "the train dataset is a Stream, not a map-style dataset"),
        ([], DataError, "the train dataset is empty"),
    ],
)
def test_a_dataset_of_other_samples_is_one_line_naming_the_fix(dataset, error, message) -> None:
    test = TensorDataset(torch.zeros(4, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(error, match="^" + re.escape(message)) as raised:
        scaletrain.ClassificationWorkload.from_datasets(lambda: torch.nn.Linear(2, 2), dataset, test)
    if "pair" in message or "tensor" in message or "class index" in message:
        assert "make the dataset's __getitem__ return (input, label)" in str(raised.value)


@pytest.mark.parametrize("where", ["the first training batch", "a training batch"])
def test_a_label_outside_the_models_classes_stops_with_one_line_and_no_loader_worker_left(
    where: str, data: Path, tmp_path: Path
) -> None:
    train, test = lazy_fashion_mnist(data)
    first = epoch_permutation(len(train), seed=COMMON["seed"], epoch=0)[: COMMON["batch_size"]].tolist()
    spared = frozenset(first if where == "a training batch" else [])  # a later batch is the first one broken
    own = scaletrain.ClassificationWorkload.from_datasets(network, Broken(train, "labels", spared), test)
    before = children()
    with pytest.raises(DataError) as raised:
        scaletrain.train(own, out=tmp_path / "run", epochs=1, loader_workers=2, **COMMON)
    message = str(raised.value)
    assert message.startswith(f"{where} has label 1"), message
    assert "outside the model's 10 classes (0 to 9); make the dataset's labels class indices 0 to 9" in message
    assert children() <= before  # the loader's workers stopped with the error, not when it is collected


def test_loader_workers_are_refused_below_zero_and_for_data_in_memory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^loader_workers must be a whole number ≥ 0 \(0 reads in the training"):
        scaletrain.train("lenet", out=tmp_path / "a", loader_workers=-1)
    with pytest.raises(ConfigError, match=r"^--loader-workers 2: workload lenet holds its data in memory"):
        scaletrain.train("lenet", out=tmp_path / "b", loader_workers=2)
    assert not (tmp_path / "b").exists()  # refused before anything was written
    with pytest.raises(ConfigError, match=r"model factory first and the name as a keyword"):
        scaletrain.ClassificationWorkload.from_datasets("mine", network, [])


@pytest.mark.parametrize(
    ("arguments", "line"),
    [
        (["-o", "broken=pairs"], "sample 0 of the train dataset is a Tensor, not an (input, label) pair; make the"),
        (["-o", "broken=labels"], "the first training batch has label 1"),
        (["--loader-workers", "-1"], "loader_workers must be a whole number ≥ 0 (0 reads in the training process)"),
    ],
)
def test_the_cli_gives_one_line_and_exit_code_2(
    arguments: list[str], line: str, data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The command's own parsing and error handling, in this process: ``lazy-fashion`` registered for the test
    as a plug-in would register it (tests/parallel/test_loader_workers.py starts the command with the plug-in)."""
    monkeypatch.setitem(WORKLOADS, LazyFashion.name, LazyFashion)
    code = main(
        ["train", "lazy-fashion", "--data-dir", str(data), "--out", str(tmp_path / "run"), "--steps", "2",
         "--threads", "1", "--progress", "off", *arguments]
    )  # fmt: skip
    printed = capsys.readouterr().err.strip().splitlines()
    assert code == 2, printed
    assert len(printed) == 1 and printed[0].startswith(f"scaletrain: error: {line}"), printed
