"""Throughput cost of scaletrain's training loop against a bare PyTorch loop, measured side by side.

Both sides train LeNet-5 on the same data (Fashion-MNIST if found, else labelled synthetic tensors)
in the same batch order (``epoch_permutation``), with the same seed, batch size, SGD lr/momentum
(fused, as scaletrain makes it), memory layout (contiguous: scaletrain's CPU default, channels-last,
runs other kernels), step count and torch thread count; the final losses are compared to prove it.
The allocator tuning that ``scaletrain.train`` applies to its process (``configure_process``) holds
for the bare runs as well, since both run in this one process after the warm-up pair. The scaletrain side
is the public ``scaletrain.train(...)`` with its normal logging and checkpointing (TensorBoard on,
log every 50, checkpoint every 200); the bare side is zero_grad/forward/cross-entropy/backward/step.
After one short untimed warm-up pair the runs alternate, bare first in odd repeats and scaletrain
first in even ones, so that a linear drift of the machine's speed cancels. Medians are reported:

* steps: batches/s over the steps after the first 5 (warm-up); bare timed with ``perf_counter``,
  scaletrain read from ``summary.json``. Its meter times each step alone, so it leaves out the work
  between steps (logging, checkpoints).
* window: batches/s over steps 51..N including everything between them (logs, the step-200
  checkpoint), from the ``time`` of the step-50 and step-N records of ``metrics.jsonl``; it does
  not rely on scaletrain's meter. Bare: ``perf_counter`` over the same steps.
* end-to-end: steps / wall time of the whole ``train()`` call, against bare + the same final
  evaluation and ``torch.save`` of the weights. Checkpoint writes are also timed on their own.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/loop_overhead.py [--repeats 5 --steps 400
--batch-size 32 --threads 1 --json out.json]``. Goal: steps overhead ≤ 3 % (window shown beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
from torch.nn import functional as F

import scaletrain
from scaletrain.data.idx import find_fashion_mnist, load_fashion_mnist
from scaletrain.errors import DataError
from scaletrain.train.checkpoint import atomic_save
from scaletrain.workloads.classification import ClassificationData, epoch_permutation
from scaletrain.workloads.lenet import LeNet5

WARMUP, LR, MOMENTUM, SEED, GOAL_PERCENT = 5, 0.01, 0.9, 0, 3.0
LOG_EVERY, CHECKPOINT_EVERY = 50, 200  # scaletrain's defaults (not passed, only used for bookkeeping)
MEASURES = ("steps", "window", "e2e")


def load_data() -> tuple[ClassificationData, str]:
    """Fashion-MNIST when it is on disk (never downloads), else synthetic tensors of the same shape."""
    try:
        folder = find_fashion_mnist(None, download=False)
        f = load_fashion_mnist(folder)
        data = ClassificationData(f.train_images, f.train_labels, f.test_images, f.test_labels)
        return data, f"Fashion-MNIST from {folder}"
    except DataError as exc:
        gen = torch.Generator().manual_seed(1)
        data = ClassificationData(
            torch.randn(60_000, 1, 28, 28, generator=gen),
            torch.randint(0, 10, (60_000,), generator=gen),
            torch.randn(10_000, 1, 28, 28, generator=gen),
            torch.randint(0, 10, (10_000,), generator=gen),
        )
        return data, f"SYNTHETIC random tensors 60000/10000 x 1x28x28 (Fashion-MNIST not found: {exc})"


@torch.no_grad()
def accuracy(model: torch.nn.Module, data: ClassificationData, batch: int = 1000) -> float:
    """Test accuracy and loss in batches of 1000: the work of scaletrain's final evaluation."""
    model.eval()
    correct = 0
    for begin in range(0, len(data.test_inputs), batch):
        labels = data.test_labels[begin : begin + batch]
        logits = model(data.test_inputs[begin : begin + batch])
        F.cross_entropy(logits, labels, reduction="sum").item()
        correct += int((logits.argmax(1) == labels).sum())
    model.train()
    return correct / len(data.test_inputs)


def run_bare(data: ClassificationData, steps: int, batch: int, out: Path) -> dict[str, float]:
    """The bare loop; returns the three timings (seconds) plus the final loss and accuracy."""
    started = time.perf_counter()
    torch.manual_seed(SEED)
    model = LeNet5()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, fused=True)  # scaletrain's SGD
    order = epoch_permutation(len(data.train_inputs), seed=SEED, epoch=0)
    inputs, labels, loss = data.train_inputs, data.train_labels, torch.zeros(())
    marks: dict[int, float] = {}
    for step in range(steps):
        if step in (WARMUP, LOG_EVERY):
            marks[step] = time.perf_counter()
        indices = order[step * batch : (step + 1) * batch]
        loss = F.cross_entropy(model(inputs[indices]), labels[indices])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    ended = time.perf_counter()
    test_accuracy = accuracy(model, data)
    torch.save(model.state_dict(), out / "model.pt")
    return {
        "steps": ended - marks[WARMUP],
        "window": ended - marks[LOG_EVERY],
        "e2e": time.perf_counter() - started,
        "loss": loss.item(),
        "test_accuracy": test_accuracy,
    }


def run_scaletrain(
    workload: scaletrain.ClassificationWorkload, steps: int, batch: int, threads: int, out: Path
) -> dict[str, float]:
    """``scaletrain.train`` with default logging/checkpointing; also times one checkpoint write."""
    started = time.perf_counter()
    summary = scaletrain.train(
        workload,
        steps=steps,
        batch_size=batch,
        lr=LR,
        momentum=MOMENTUM,
        seed=SEED,
        threads=threads,
        warmup_steps=WARMUP,
        memory_format="contiguous",  # the bare loop's layout: the same kernels on both sides
        progress="off",
        out=out,
    )
    e2e = time.perf_counter() - started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    stamps = {r["step"]: r["time"] for r in records if r["kind"] == "step"}
    payload = torch.load(out / "checkpoint.pt", weights_only=True)
    begin = time.perf_counter()
    atomic_save(payload, out / "probe.pt")
    return {
        "steps": summary["train_seconds"],
        "window": stamps[steps] - stamps[LOG_EVERY],
        "e2e": e2e,
        "checkpoint": time.perf_counter() - begin,
        "loss": summary["final_train_loss"],
        "test_accuracy": summary["test_accuracy"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="bare/scaletrain pairs (default 5)")
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps per run (default 400)")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, choices=(1, 2), help="torch threads (default 1)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    data, source = load_data()
    per_epoch = len(data.train_inputs) // args.batch_size
    if not LOG_EVERY < args.steps <= per_epoch or args.repeats < 1:
        parser.error(f"--steps must be in ({LOG_EVERY}, {per_epoch}] (one epoch) and --repeats ≥ 1")
    torch.set_num_threads(args.threads)
    workload = scaletrain.ClassificationWorkload.from_tensors(
        "lenet-bench",
        LeNet5,
        train=(data.train_inputs, data.train_labels),
        test=(data.test_inputs, data.test_labels),
        batch_size=args.batch_size,
        lr=LR,
        momentum=MOMENTUM,
    )
    print(f"data: {source}")
    print(
        f"LeNet-5, {args.steps} steps x batch {args.batch_size}, SGD lr {LR} momentum {MOMENTUM}, "
        f"{args.threads} thread(s), {args.repeats} repeats (alternating order) after a warm-up pair"
    )
    bare: list[dict[str, float]] = []
    ours: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="loop-overhead-") as tmp:
        run_bare(data, LOG_EVERY + 10, args.batch_size, Path(tmp))
        run_scaletrain(workload, LOG_EVERY + 10, args.batch_size, args.threads, Path(tmp) / "warm")
        for repeat in range(args.repeats):
            for side in ("bare", "ours") if repeat % 2 == 0 else ("ours", "bare"):
                if side == "bare":
                    bare.append(run_bare(data, args.steps, args.batch_size, Path(tmp)))
                else:
                    ours.append(
                        run_scaletrain(workload, args.steps, args.batch_size, args.threads, Path(tmp) / f"run{repeat}")
                    )
    counts = {"steps": args.steps - WARMUP, "window": args.steps - LOG_EVERY, "e2e": args.steps}
    rates = {
        side: {m: [counts[m] / r[m] for r in runs] for m in MEASURES}
        for side, runs in (("bare", bare), ("scaletrain", ours))
    }
    pairs = {m: zip(rates["scaletrain"][m], rates["bare"][m], strict=True) for m in MEASURES}
    ratios = {m: [s / b for s, b in pairs[m]] for m in MEASURES}
    med = statistics.median
    overhead = {m: (1 - med(ratios[m])) * 100 for m in MEASURES}
    print(
        "\nbatches/s (bare | scaletrain | ratio); steps: after warm-up, scaletrain's meter; window: steps "
        f"{LOG_EVERY + 1}..{args.steps} incl. logs; e2e: whole run"
    )
    print(f"{'repeat':>6} | " + " | ".join(f"{m:^24}" for m in MEASURES) + " | ckpt ms")
    columns = [(rates["bare"][m], rates["scaletrain"][m], ratios[m]) for m in MEASURES]
    checkpoints = [r["checkpoint"] for r in ours]
    for label, pick in [(str(i + 1), lambda xs, i=i: xs[i]) for i in range(args.repeats)] + [("median", med)]:
        cells = " | ".join(f"{pick(b):7.1f} {pick(s):7.1f} {pick(r):8.4f}" for b, s, r in columns)
        print(f"{label:>6} | {cells} | {1000 * pick(checkpoints):7.1f}")
    writes = len({s for s in range(1, args.steps + 1) if s % CHECKPOINT_EVERY == 0 or s == args.steps})
    checkpoint_s = writes * med(checkpoints)
    extra_s = med(s["e2e"] - b["e2e"] for s, b in zip(ours, bare, strict=True))
    same = all(b[k] == s[k] for b, s in zip(bare, ours, strict=True) for k in ("loss", "test_accuracy"))
    print(
        f"\nsame work: final loss bare {bare[-1]['loss']:.6f} / scaletrain {ours[-1]['loss']:.6f}, test "
        f"accuracy {bare[-1]['test_accuracy']:.4f} / {ours[-1]['test_accuracy']:.4f} "
        f"({'identical in every repeat' if same else 'DIFFERENT'})"
    )
    for m, what in zip(MEASURES, ("steps-only", "loop window incl. logs", "end-to-end"), strict=True):
        print(f"{what} overhead (median of per-repeat ratios): {overhead[m]:+.2f} %")
    print(
        f"end-to-end: median extra wall {1000 * extra_s:+.0f} ms per run, of which checkpoint writes "
        f"{writes} x {1000 * checkpoint_s / writes:.1f} ms = {1000 * checkpoint_s:.0f} ms (timed apart)"
    )
    verdict = "PASS" if overhead["steps"] <= GOAL_PERCENT else "FAIL"
    print(
        f"{verdict}: steps-only overhead {overhead['steps']:.2f} % vs goal ≤ {GOAL_PERCENT:.0f} % "
        f"(loop window {overhead['window']:.2f} %)"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "data": source,
                    "steps": args.steps,
                    "batch_size": args.batch_size,
                    "threads": args.threads,
                    "repeats": args.repeats,
                    "warmup_steps": WARMUP,
                    "seconds": {"bare": bare, "scaletrain": ours},
                    "batches_per_second": rates,
                    "ratios": ratios,
                    "overhead_percent": overhead,
                    "checkpoint_seconds_per_run": checkpoint_s,
                    "same_work": same,
                    "verdict": verdict,
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
