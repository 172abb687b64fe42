"""Memory of the worker processes that train a workload object: its data shared, against its data copied.

``scaletrain.train(obj, workers=N)`` hands a workload object made without an import reference to the
processes it starts pickled, its large tensors written once to ``OUT/workload/tensors.bin``, which each
process maps (:mod:`scaletrain.tensors.sharing`). This script trains an object holding ``--megabytes``
of training inputs (a class of this script's ``__main__``, as a notebook would define it) on
``--workers`` processes twice: as scaletrain sends it, and with every tensor inside the pickle (the
sharing threshold raised above the data), so that each process unpickles a copy. Each worker reads its
own ``/proc/self/smaps_rollup`` once it has touched every byte of its data; the script prints, per run,
each worker's anonymous and file-backed resident memory and its proportional share (Pss, which splits
a page shared by k processes k ways), and the workers' Pss summed.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/shared_data.py [--megabytes 200 --workers 2]``
(about 25 s here). Measured here (200 MiB, 2 workers): 149 MiB anonymous per worker
shared, 553 MiB copied; Pss summed over the workers 514 MiB shared, 1,121 MiB copied.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import torch
from torch import nn

import scaletrain
from scaletrain.tensors import sharing
from scaletrain.workloads.base import WorkloadDefaults
from scaletrain.workloads.classification import ClassificationData

FEATURES = 256
FIELDS = ("Rss", "Pss", "Anonymous", "Pss_Anon", "Pss_File")


class Held(scaletrain.ClassificationWorkload):
    """A linear classifier on random inputs the object holds; records its process's memory once loaded."""

    name = "held"
    dataset = "random inputs held by the object"
    defaults = WorkloadDefaults(epochs=1, batch_size=64, lr=0.01)

    def __init__(self, megabytes: int, record: Path) -> None:
        super().__init__()
        samples = megabytes * 2**20 // (4 * FEATURES)
        inputs = torch.randn(samples + 256, FEATURES)
        labels = (inputs[:, 0] > 0).long()
        self.data = ClassificationData(inputs[:samples], labels[:samples], inputs[samples:], labels[samples:])
        self.record = record

    def build_model(self) -> nn.Module:
        return nn.Linear(FEATURES, 2)

    def load_data(self, data_dir: Path | None, *, download: bool = True) -> ClassificationData:
        float(self.data.train_inputs.sum())  # every page of the data resident in this process
        (self.record / f"{os.getpid()}.json").write_text(json.dumps(memory()), encoding="utf-8")
        return self.data


def memory() -> dict[str, float]:
    """This process's resident memory in MiB, from /proc/self/smaps_rollup."""
    values = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        name, _, rest = line.partition(":")
        if name in FIELDS:
            values[name] = int(rest.split()[0]) / 1024
    return values


def run(megabytes: int, workers: int, folder: Path, *, shared: bool) -> list[dict[str, float]]:
    record = folder / ("shared" if shared else "copied")
    record.mkdir()
    sharing.SHARED_BYTES = 64 * 1024 if shared else 2**62  # read when the object is pickled, in this process
    workload = Held(megabytes, record)
    scaletrain.train(
        workload, workers=workers, steps=2, threads=1, progress="off", tensorboard=False, out=record / "run"
    )
    return [json.loads(path.read_text()) for path in sorted(record.glob("*.json"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=200, help="MiB of training inputs the object holds")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="scaletrain-shared-data-") as folder:
        results = {shared: run(args.megabytes, args.workers, Path(folder), shared=shared) for shared in (True, False)}
    print(f"{args.megabytes} MiB of data, {args.workers} workers; MiB per worker once its data is resident:")
    print(f"{'data':<8} {'worker':>6} {'Rss':>8} {'anonymous':>10} {'Pss':>8} {'Pss file':>9}")
    for shared, workers in results.items():
        for number, values in enumerate(workers):
            print(
                f"{'shared' if shared else 'copied':<8} {number:>6} {values['Rss']:>8.0f} {values['Anonymous']:>10.0f} "
                f"{values['Pss']:>8.0f} {values.get('Pss_File', float('nan')):>9.0f}"
            )
    totals = {shared: sum(values["Pss"] for values in workers) for shared, workers in results.items()}
    print(
        f"workers' Pss summed: shared {totals[True]:.0f} MiB, copied {totals[False]:.0f} MiB "
        f"({totals[False] - totals[True]:.0f} MiB less with the data shared)"
    )
    scaletrain.exit_now(0)


if __name__ == "__main__":
    main()
