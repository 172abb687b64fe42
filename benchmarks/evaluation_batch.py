"""How many test samples one forward pass of the evaluation should take (``EVAL_BATCH`` in
``src/scaletrain/workloads/classification.py``): the seconds and the minor page faults of evaluating the same images
in batches of several sizes, side by side.

One process, one thread, glibc's allocator tuned as every scaletrain process tunes it
(``scaletrain.train.runtime.tune_allocator``), the network in evaluation mode and channels-last as training keeps it,
``--images`` random 28×28 images (the time does not depend on the values). The sizes alternate within each of
``--repeats`` rounds, so a change in the machine's load falls on all of them; the median per size.

Run: ``PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/evaluation_batch.py [--workloads resnet20,lenet]``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch

from scaletrain.measure.profile import network
from scaletrain.train.runtime import tune_allocator
from scaletrain.workloads import create_workload


def evaluation_seconds(model: torch.nn.Module, images: torch.Tensor, batch: int) -> tuple[float, int]:
    """Seconds and minor page faults of one pass over ``images`` in batches of ``batch``."""
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    began = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(images), batch):
            model(images[start : start + batch]).argmax(dim=1)
    return time.perf_counter() - began, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="resnet20,lenet")
    parser.add_argument("--sizes", default="1000,500,256,128,64")
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(size) for size in args.sizes.split(",")]
    torch.set_num_threads(1)
    print(f"allocator: {tune_allocator()}; torch {torch.__version__}, 1 thread, {args.images} images")
    for name in args.workloads.split(","):
        workload = create_workload(name, {"dataset": "fashion-mnist"} if name.startswith("resnet") else {})
        model = network(workload, {}).to(memory_format=torch.channels_last).eval()
        images = torch.randn(args.images, 1, 28, 28).contiguous(memory_format=torch.channels_last)
        evaluation_seconds(model, images[: max(sizes)], max(sizes))  # warm-up: first calls, kernels chosen
        runs: dict[int, list[tuple[float, int]]] = {size: [] for size in sizes}
        for _ in range(args.repeats):
            for size in sizes:
                runs[size].append(evaluation_seconds(model, images, size))
        slowest = statistics.median(seconds for seconds, _ in runs[sizes[0]])
        for size in sizes:
            seconds = statistics.median(seconds for seconds, _ in runs[size])
            faults = statistics.median(faults for _, faults in runs[size])
            print(f"{name:>9} batch {size:>5}: {seconds:6.3f} s (×{slowest / seconds:.2f} of batch {sizes[0]}), "
                  f"{faults:>9,.0f} minor faults")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
