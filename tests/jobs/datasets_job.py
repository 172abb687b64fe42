"""One process of the loader tests' jobs (tests/parallel/test_loader_workers.py), started with the torchrun
variables so that it can train a ``ClassificationWorkload.from_datasets`` object (tests/parallel/lazy_fashion.py)
with two loader worker processes.

``python datasets_job.py DATA OUT PORT[,PORT...] LEG[,LEG...]`` trains, one after the other, each leg on 2
workers into ``OUT/LEG``, each with the next port of the list. A leg is a strategy spec (``allreduce-split``,
``ps-central-async`` …), or ``SPEC:steps`` (stopped by ``--steps`` inside the epoch) followed by
``SPEC:resumed`` (resumed from that mid-epoch checkpoint, with no loader workers, to the epoch's end; it
trains in the folder of ``SPEC:steps``). Every reading process leaves its pid in ``OUT/LEG/readers``.

The job has the processes of its largest leg (3 with a central server's); a leg of fewer processes runs on
the first ranks, with ``WORLD_SIZE`` set to its own, and the others go on to their next leg. Started once
for all legs, each process imports torch once.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import scaletrain
from tests.helpers import one_process_options
from tests.parallel.lazy_fashion import ENV_READERS, workload

STEPS_INSIDE = 5  # of the 8 split steps of an epoch
SETTINGS = dict(epochs=1, momentum=0.9, threads=1, seed=3, tensorboard=False, progress="off", warmup_steps=1)


def settings(leg: str) -> tuple[Path, dict]:
    """The folder a leg trains in (relative to OUT) and what it adds to :data:`SETTINGS`."""
    spec, _, part = leg.partition(":")
    if part == "steps":
        return Path(f"{spec}-resumed"), {"steps": STEPS_INSIDE}
    if part == "resumed":
        return Path(f"{spec}-resumed"), {"resume": True, "loader_workers": 0}
    return Path(spec), {}


def main(data: Path, out: Path, ports: list[int], legs: list[str]) -> None:
    rank = int(os.environ["RANK"])
    for leg, port in zip(legs, ports, strict=True):
        folder, extra = settings(leg)
        processes = 3 if leg.startswith("ps-central") else 2
        if rank >= processes:
            continue
        os.environ.update(WORLD_SIZE=str(processes), LOCAL_WORLD_SIZE=str(processes), MASTER_PORT=str(port))
        os.environ[ENV_READERS] = str(out / folder / "readers")
        own = workload(data)  # in every process, as a user's script would make it
        spec = leg.partition(":")[0]
        options = one_process_options(spec)  # every synchronous leg is compared with one process
        scaletrain.train(own, out=out / folder, workers=2, strategy=spec, strategy_options=options, **SETTINGS, **extra)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), [int(p) for p in sys.argv[3].split(",")], sys.argv[4].split(","))
    sys.stdout.flush()
    os._exit(0)  # leave without gloo's teardown at interpreter exit (see scaletrain.exit_now)
