"""PruneTrain's proximal step, tensor by tensor against all tensors at once (multi-tensor kernels).

After every optimizer step PruneTrain shrinks every regularised channel group of every layer and every
batch norm's scale and shift (``PruneTrain.after_update``). On an H100 a ResNet-20 step is bound by
kernel launches, and PruneTrain's epochs took 1.6–2.2× the dense ones (results/h100-2026-11-26).
This times, on ResNet-20's real layers and batch norms, the same shrinking done two ways side by side
in one process, alternating, medians of ``--repeats`` rounds:

- ``per tensor``: :func:`shrink_groups` on each layer and :func:`shrink_values` on each batch-norm
  tensor, one call after another (the structure ``after_update`` had before; its old per-tensor
  expressions, a few kernels more per tensor than these calls, are not kept: timed once beside the new
  code on this 2-core CPU, loaded, they took 6,965 µs against 1,200);
- ``all at once``: :func:`shrink_all_groups` and :func:`shrink_values` on the lists (what it does now).

Both give the same weights bit for bit (checked here). Prints the two medians in microseconds and
their ratio; on a GPU (``--device cuda``) the clock is read after a synchronisation.

Run: ``PYTHONPATH=src python benchmarks/prunetrain_proximal.py [--device cpu|cuda] [--repeats 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from scaletrain.efficient.prunetrain import (
    following_norms,
    regularised_groups,
    shrink_all_groups,
    shrink_groups,
    shrink_values,
)
from scaletrain.tensors.device import resolve_device, synchronize
from scaletrain.workloads import create_workload


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    workload = create_workload("resnet20", {"dataset": "fashion-mnist"})
    model = workload.build_model().to(device)
    example = torch.zeros(2, 1, 28, 28, device=device)
    groups = regularised_groups(model, example)
    norms = following_norms(model, example)
    parameters = dict(model.named_parameters())
    layers = [(parameters[f"{path}.weight"], *flags) for path, flags in groups.items()]
    values = [parameters[f"{norm}.{kind}"] for norm in norms.values() for kind in ("weight", "bias")]
    amount = 1e-4  # small: the weights barely move, so every round shrinks the same tensors

    def per_tensor() -> None:
        for weight, outputs, inputs in layers:
            shrink_groups(weight, outputs, inputs, amount)
        for tensor in values:
            shrink_values(tensor, amount)

    def at_once() -> None:
        shrink_all_groups(layers, amount)
        shrink_values(values, amount)

    snapshot = [p.detach().clone() for p in model.parameters()]
    per_tensor()
    first = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p, saved in zip(model.parameters(), snapshot, strict=True):
            p.copy_(saved)
    at_once()
    same = all(torch.equal(a, p.detach()) for a, p in zip(first, model.parameters(), strict=True))

    timings: dict[str, list[float]] = {"per tensor": [], "all at once": []}
    for _ in range(10):  # warm-up
        per_tensor()
        at_once()
    for _ in range(args.repeats):
        for name, function in (("per tensor", per_tensor), ("all at once", at_once)):
            synchronize(device)
            begin = time.perf_counter()
            function()
            synchronize(device)
            timings[name].append(time.perf_counter() - begin)
    medians = {name: statistics.median(samples) * 1e6 for name, samples in timings.items()}
    print(
        f"ResNet-20 on {device}: {len(layers)} regularised layers, {len(values)} batch-norm tensors, "
        f"{args.repeats} rounds, {args.threads} thread(s), torch {torch.__version__}"
    )
    for name, median in medians.items():
        print(f"  {name:12s} {median:9.1f} µs (median)")
    print(f"  ratio per tensor ÷ all at once: ×{medians['per tensor'] / medians['all at once']:.2f}")
    print(f"  same weights bit for bit: {'yes' if same else 'NO'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
