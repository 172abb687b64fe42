"""Workload objects handed to the worker processes the local launcher starts (scaletrain.parallel.handover): a class
defined in a script's ``__main__`` trains on two workers, whose data tensors map one shared file; ``load_model`` takes
the object back; an object that can be neither imported nor pickled, or whose module the workers cannot import, is
one line saying what to do."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from tests.helpers import REPO
from tests.workloads.own_workload import make_workload

import scaletrain
from scaletrain.errors import ConfigError
from scaletrain.parallel.launch import RunFailed

SETTINGS = {"workers": 2, "steps": 16, "threads": 1, "progress": "off", "tensorboard": False, "timeout": 60}

#: A notebook-style script: the workload's class lives in ``__main__``, its data in the object (256 KiB of inputs).
SCRIPT = '''
import json, os, sys
from pathlib import Path

import torch
from torch import nn

import scaletrain


class Stripes(scaletrain.ClassificationWorkload):
    """Is the sum of the first four features positive? Records which file its data lives in, per process."""

    name = "stripes"
    dataset = "stripes in memory"
    defaults = scaletrain.workloads.base.WorkloadDefaults(epochs=1, batch_size=32, lr=0.1, momentum=0.9)

    def __init__(self, record):
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        inputs = torch.randn(4096, 16, generator=generator)
        self.data = scaletrain.workloads.classification.ClassificationData(
            inputs[:3584], (inputs[:3584, :4].sum(1) > 0).long(), inputs[3584:], (inputs[3584:, :4].sum(1) > 0).long()
        )
        self.record = record

    def build_model(self):
        return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 2))

    def load_data(self, data_dir, *, download=True):
        address = self.data.train_inputs.data_ptr()
        for line in Path("/proc/self/maps").read_text().splitlines():  # the file mapped where the data lies
            span, *fields = line.split(maxsplit=5)
            begin, end = (int(part, 16) for part in span.split("-"))
            if begin <= address < end:
                mapped = fields[4] if len(fields) == 5 else None
        (self.record / f"{os.getpid()}.json").write_text(json.dumps({"file": mapped}))
        return self.data


if __name__ == "__main__":
    out, record = Path(sys.argv[1]), Path(sys.argv[2])
    record.mkdir()
    mine = Stripes(record)
    summary = scaletrain.train(mine, out=out, **json.loads(sys.argv[3]))
    try:
        scaletrain.load_model(out)
    except scaletrain.ConfigError as exc:
        refused = str(exc)
    model = scaletrain.load_model(out, workload=mine)
    accuracy = (model(mine.data.test_inputs).argmax(1) == mine.data.test_labels).float().mean().item()
    print(json.dumps({"summary": summary, "refused": refused, "accuracy": accuracy, "pid": os.getpid()}))
    scaletrain.exit_now(0)
'''


@pytest.mark.multiprocess
def test_a_class_defined_in_main_trains_on_two_workers_that_share_its_data(tmp_path: Path) -> None:
    script, out, record = tmp_path / "notebook.py", tmp_path / "run", tmp_path / "record"
    script.write_text(SCRIPT, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script), str(out), str(record), json.dumps(SETTINGS)],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    told = json.loads(result.stdout.strip().splitlines()[-1])
    summary = told["summary"]
    assert (summary["workload"], summary["workers"], summary["reference"]) == ("stripes", 2, None)
    assert len({worker["weights_digest"] for worker in summary["per_worker"]}) == 1
    assert told["accuracy"] == pytest.approx(summary["test_accuracy"]) and told["accuracy"] > 0.85
    assert told["refused"].endswith("pass it: scaletrain.load_model(" + repr(str(out)) + ", workload=the_object)")
    # each worker process mapped the one file the launcher wrote: the data is not copied per process
    seen = {int(path.stem): json.loads(path.read_text())["file"] for path in record.glob("*.json")}
    workers = {pid: file for pid, file in seen.items() if pid != told["pid"]}
    assert len(workers) == 2 and set(workers.values()) == {str(out / "workload" / "tensors.bin")}, seen
    assert seen.get(told["pid"]) in (None, "")  # the script's own object keeps its memory
    assert not (out / "workload").exists()  # the copy goes when the run ends


def test_an_object_that_can_be_neither_imported_nor_pickled_is_one_line(tmp_path: Path) -> None:
    mine = torch.nn.Module()  # not a workload: something a user might hang on one
    workload = make_workload()
    workload.lock = threading.Lock()
    workload.module = mine
    out = tmp_path / "run"
    with pytest.raises(ConfigError) as refused:
        scaletrain.train(workload, out=out, **SETTINGS)
    message = str(refused.value)
    assert message.startswith("the workload object 'own-blobs' cannot reach the worker processes: scaletrain did not")
    assert "TypeError: cannot pickle '_thread.lock' object" in message and "pass 'module:function'" in message
    assert "\n" not in message and not out.exists()


@pytest.mark.multiprocess
def test_a_module_the_script_put_on_sys_path_reaches_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a script does (``sys.path.insert(0, folder)``, then an import from it): the workers get the launching
    process's sys.path, as multiprocessing's spawn gives its children; once the module is gone from there, the
    refusal is one line naming the fix."""
    (tmp_path / "private_blobs.py").write_text(
        "from tests.workloads.own_workload import make_workload\n\n\nclass Private(type(make_workload())):\n    pass\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))  # this process imports it; nothing else says where it is
    import private_blobs

    workload = make_workload()
    workload.__class__ = private_blobs.Private
    summary = scaletrain.train(workload, out=tmp_path / "run", **SETTINGS)
    assert summary["workers"] == 2 and summary["steps"] > 0
    (tmp_path / "private_blobs.py").unlink()
    with pytest.raises(RunFailed) as failed:
        scaletrain.train(workload, out=tmp_path / "again", **SETTINGS)
    assert failed.value.exit_code == 2 and "\n" not in str(failed.value)
    assert "the workload object needs module 'private_blobs', which this process cannot import; put its folder on " \
        "PYTHONPATH" in str(failed.value)  # fmt: skip
