"""Objects pickled with their large tensors in one memory-mapped file (scaletrain.tensors.sharing): what comes
back equals what went, every view maps the one file, each storage is written once, and a process that writes
to its tensors changes neither the file nor another process's copy."""

from __future__ import annotations

from pathlib import Path

import torch
from tests.helpers import mapped_file

from scaletrain.tensors.sharing import SHARED_BYTES, TENSORS_NAME, dump, load


def test_tensors_come_back_equal_and_mapped_from_one_file(tmp_path: Path) -> None:
    base = torch.arange(64 * 1024, dtype=torch.float32).view(256, 256)
    sent = {
        "rows": base[::3],  # a strided view
        "columns": base.t(),  # the same storage, transposed
        "labels": torch.arange(20_000, dtype=torch.int64) % 7,
        "half": torch.linspace(0, 1, 40_000).to(torch.bfloat16),
        "bytes": torch.arange(70_000, dtype=torch.int64).to(torch.uint8),
        "small": torch.ones(3),
    }
    back = load(dump(sent, tmp_path))
    mapped = str(tmp_path / TENSORS_NAME)
    for name, tensor in sent.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
        assert (mapped_file(back[name].data_ptr()) == mapped) == (name != "small"), name
    # the two views of one storage share its bytes in the file and in the loaded object
    assert back["rows"].untyped_storage().data_ptr() == back["columns"].untyped_storage().data_ptr()
    stored = base.untyped_storage().nbytes() + 20_000 * 8 + 40_000 * 2 + 70_000
    assert stored <= (tmp_path / TENSORS_NAME).stat().st_size < stored + 4 * 64
    assert sent["small"].untyped_storage().nbytes() < SHARED_BYTES


def test_what_a_process_writes_stays_its_own(tmp_path: Path) -> None:
    path = dump({"data": torch.zeros(100_000)}, tmp_path)
    first, second = load(path), load(path)
    first["data"] += 1  # as a process that augments its data in place
    assert torch.all(first["data"] == 1)
    assert torch.all(second["data"] == 0) and torch.all(load(path)["data"] == 0)


def test_tensors_that_need_their_own_pickling_keep_it(tmp_path: Path) -> None:
    weight = torch.nn.Parameter(torch.randn(200, 200))
    back = load(dump({"weight": weight, "grad": torch.ones(20_000, requires_grad=True)}, tmp_path))
    assert isinstance(back["weight"], torch.nn.Parameter) and torch.equal(back["weight"], weight)
    assert back["grad"].requires_grad and torch.all(back["grad"] == 1)
