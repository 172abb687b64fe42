"""Where a training step's time goes under fp32 and bf16: oneDNN's own timing of every convolution,
by kind, and what is left of the step — side by side, to say which part keeps bf16 below a target.

Each of the 2 × 2 runs (precision × ``--memory-format``) is a fresh child process with
``ONEDNN_VERBOSE=1``: it builds the workload's network (default ResNet-20 on the real Fashion-MNIST),
takes ``--warmup`` steps, prints a mark, then ``--steps`` timed steps exactly as ``scaletrain train``
runs them (the forward pass in the technique stack of ``--precision`` and ``--memory-format``, fused
SGD). oneDNN prints one line per primitive it executes, with its milliseconds; the parent sums the
lines after the mark by primitive (convolution forward, backward-data, backward-weights; reorders)
and takes the rest of the step (batch norm, ReLU, the residual sums, the loss, the optimizer) as
the step's wall time minus those sums (oneDNN's printing lands there too, so compare the rest between
these runs, not with ``benchmarks/precision.py``'s steps). The children run one after another; rounds
alternate.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/precision_primitives.py [--rounds 2 --steps 5]``; the
thesis's ResNet-32 on CIFAR-10-shaped inputs (SPEC §4: batch 256): ``--workload resnet32 --synthetic
3,32,32 --batch-size 256``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from training_runs import SRC, fashion_mnist

MARK = "-- timed steps --"
RUNS = [(precision, layout) for layout in ("contiguous", "channels_last") for precision in ("fp32", "bf16")]


def child(args: argparse.Namespace) -> None:
    """One run: warm-up steps, the mark, timed steps; the step seconds as the last line (JSON)."""
    import torch

    from scaletrain.efficient.base import stacked
    from scaletrain.efficient.channels_last import memory_format_technique
    from scaletrain.efficient.precision import Precision
    from scaletrain.train.runtime import configure_process
    from scaletrain.workloads import create_workload

    configure_process(args.threads)
    torch.manual_seed(0)
    if args.synthetic:  # random images of this shape (the ResNet's CIFAR-10 input: 3,32,32), 10 classes
        shape = tuple(int(n) for n in args.synthetic.split(","))
        workload = create_workload(args.workload, {"dataset": "cifar10" if shape[0] == 3 else "fashion-mnist"})
        batch = (torch.randn(args.batch_size, *shape), torch.randint(0, 10, (args.batch_size,)))
    else:
        workload = create_workload(args.workload, {"dataset": "fashion-mnist"})
        data = workload.load_data(args.data_dir, download=False)
        batch = next(iter(workload.train_batches(data, epoch=0, batch_size=args.batch_size, seed=0)))
    model = workload.build_model().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    technique = stacked(memory_format_technique(args.child[1]), Precision(precision=args.child[0]))
    seconds = []
    for number in range(args.warmup + args.steps):
        if number == args.warmup:
            print(MARK, flush=True)
        begin = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with technique.forward_context():
            objective, _, _ = workload.training_loss(model, batch, workload.initial_state(model, args.batch_size))
        objective.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - begin)
    print(MARK, flush=True)
    print(json.dumps(seconds[args.warmup :]), flush=True)


def measure(args: argparse.Namespace, precision: str, layout: str) -> dict[str, float]:
    """Milliseconds per step by primitive kind, and the rest of the step, for one child run."""
    command = [sys.executable, __file__, "--child", precision, layout, *forwarded(args)]
    environment = {**os.environ, "ONEDNN_VERBOSE": "1", "PYTHONPATH": str(SRC)}
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=1800, check=False)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    lines = result.stdout.splitlines()
    first, last = lines.index(MARK), len(lines) - 1 - lines[::-1].index(MARK)
    totals: collections.Counter[str] = collections.Counter()
    for line in lines[first + 1 : last]:
        fields = line.split(",")
        if line.startswith("onednn_verbose") and len(fields) > 8 and fields[3] == "exec":
            kind = fields[5] if fields[5] != "convolution" else f"convolution {fields[7]}"
            totals[kind] += float(fields[-1])
    step_ms = 1000 * statistics.median(json.loads(lines[last + 1]))
    figures = {kind: total / args.steps for kind, total in totals.items()}
    figures["rest of the step"] = step_ms - sum(figures.values())
    figures["step"] = step_ms
    return figures


def forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--workload", args.workload, "--batch-size", str(args.batch_size), "--threads", str(args.threads)]
    flags += ["--warmup", str(args.warmup), "--steps", str(args.steps), "--data-dir", str(args.data_dir)]
    return flags + (["--synthetic", args.synthetic] if args.synthetic else [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="resnet20")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per run")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the four runs")
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--synthetic", metavar="C,H,W", help="random inputs of this shape instead of Fashion-MNIST")
    parser.add_argument("--child", nargs=2, metavar=("PRECISION", "LAYOUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.data_dir = fashion_mnist(parser, args.data_dir)
    if args.child:
        child(args)
        return 0
    samples: dict[tuple[str, str], list[dict[str, float]]] = {run: [] for run in RUNS}
    for _ in range(args.rounds):
        for precision, layout in RUNS:
            samples[precision, layout].append(measure(args, precision, layout))
    inputs = f"random {args.synthetic} inputs" if args.synthetic else "Fashion-MNIST"
    print(f"{args.workload} on {inputs}, batch {args.batch_size}, {args.threads} thread(s)")
    print(f"ms per step, median of {args.rounds} rounds")
    for layout in ("contiguous", "channels_last"):
        fp32, bf16 = samples["fp32", layout], samples["bf16", layout]
        kinds = sorted({kind for sample in fp32 + bf16 for kind in sample}, key=lambda k: (k == "step", k))
        print(f"\n{layout}:\n  {'part':<32} {'fp32':>8} {'bf16':>8} {'fp32/bf16':>10}")
        for kind in kinds:
            a = statistics.median(sample.get(kind, 0.0) for sample in fp32)
            b = statistics.median(sample.get(kind, 0.0) for sample in bf16)
            if max(a, b) < 0.05:
                continue  # a primitive of a few microseconds (bf16's float32 loss head)
            print(f"  {kind:<32} {a:8.1f} {b:8.1f} {a / b if b > 0 else float('nan'):>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
