"""Where bf16 and fp16 pay on the GPU (issue 50, part 1): ResNet-34 and VGG16E on 224×224 images, and a GPT.

Each model is timed in fp32 (TF32 on for matrix products and convolutions, as cuDNN has it by default), bf16 and
fp16 under autocast, eager and under ``torch.compile`` (:class:`scaletrain.train.compiled.TrainingForward`, as
``--compile`` wraps the training forward). A step is what a training step is: forward under autocast, the
backward (fp16: of the loss times the dynamic loss scale, then the gradients unscaled and checked for overflow,
:class:`scaletrain.efficient.precision.Precision`), the optimizer's step (the fused SGD with momentum for the
image networks, AdamW for the GPT, :func:`scaletrain.tensors.optimizers.build_optimizer`). The image networks
run channels-last. Per row: seconds per step (the median of a few blocks of steps, the device synchronised
around each block), images or tokens per second, and the peak device memory over the warm-up and the timed steps.

Inputs are made on the device (random 224×224 images around one pattern per class, a task that can be learnt;
the Penn Treebank's words for the GPT). Also measured: the step at half the batch (does the full one fill the
GPU?), a short loss curve per precision against fp32's (quality unchanged?), and a ``torch.profiler`` table of
the fp32 and bf16 steps' kernels of one model (where the time goes when a narrower type does not halve it).

The most valuable rows come first; rows that would end after ``--seconds`` are listed as not run (compiling is
the slow part). The JSON is rewritten after every row. ``--dry-run``: this CPU at tiny sizes.

Run: ``PYTHONPATH=src:benchmarks python benchmarks/device_precision.py --json OUT.json --data-dir DIR
[--seconds 300] [--dry-run]`` (``DIR/ptb`` holds the Penn Treebank's files).
"""

from __future__ import annotations

import argparse
import gc
import math
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from device_scaling import Recorder
from scaletrain.efficient.precision import INITIAL_SCALE, Precision
from scaletrain.tensors.device import resolve_device, synchronize, to_device
from scaletrain.tensors.flat import finite
from scaletrain.tensors.optimizers import build_optimizer
from scaletrain.train.compiled import TrainingForward
from scaletrain.train.runtime import configure_process
from scaletrain.workloads import Part, create_workload

GOAL = 1.8
IMAGE_MODELS = ("resnet34", "vgg16e")


@dataclass(frozen=True)
class Model:
    """One network as the part trains it: the workload, its options, the batch, the optimizer."""

    workload: str
    batch_size: int
    options: dict[str, str]
    optimizer: str = "sgd"
    lr: float = 0.02
    momentum: float | None = 0.9
    weight_decay: float = 5e-4

    @property
    def images(self) -> bool:
        return self.workload in IMAGE_MODELS


@dataclass(frozen=True)
class Plan:
    device: str
    models: tuple[Model, ...]
    precisions: tuple[str, ...]
    compiled: tuple[tuple[str, str], ...]  # (workload, precision) under torch.compile, most valuable first
    warmup: int
    blocks: int
    steps_per_block: int
    curve_steps: int
    profiled: str  # the workload whose fp32 and bf16 steps are profiled
    profile_steps: int
    threads: int = 2
    top_kernels: int = 12


GPT_LARGE = {"layers": "12", "width": "768", "heads": "12", "context": "256", "dropout": "0.1", "train_split": "valid"}
DEVICE_PLAN = Plan(
    device="cuda",
    models=(
        Model("resnet34", 256, {"data": "synthetic", "image_size": "224", "num_classes": "100"}),
        Model("vgg16e", 128, {"data": "synthetic", "image_size": "224", "num_classes": "100"}, lr=0.01),
        Model("gpt", 64, GPT_LARGE, optimizer="adamw", lr=3e-4, momentum=None, weight_decay=0.1),
    ),
    precisions=("fp32", "bf16", "fp16"),
    compiled=(
        ("resnet34", "fp32"), ("resnet34", "bf16"), ("gpt", "fp32"), ("gpt", "bf16"), ("vgg16e", "fp32"),
        ("vgg16e", "bf16"), ("resnet34", "fp16"), ("gpt", "fp16"), ("vgg16e", "fp16"),
    ),
    warmup=5, blocks=3, steps_per_block=10, curve_steps=60, profiled="resnet34", profile_steps=5,
)  # fmt: skip
GPT_TINY = {"layers": "1", "width": "32", "heads": "2", "context": "8", "dropout": "0.1", "train_split": "valid"}
DRY_PLAN = Plan(
    device="cpu",
    models=(
        Model("resnet34", 4, {"data": "synthetic", "image_size": "32", "num_classes": "10"}),
        Model("vgg16e", 4, {"data": "synthetic", "image_size": "32", "num_classes": "10"}, lr=0.01),
        Model("gpt", 4, GPT_TINY, optimizer="adamw", lr=3e-3, momentum=None, weight_decay=0.1),
    ),
    precisions=("fp32", "bf16"),  # fp16 autocast runs on CUDA only
    compiled=(("gpt", "fp32"),),
    warmup=1, blocks=2, steps_per_block=1, curve_steps=4, profiled="resnet34", profile_steps=2, threads=1,
)  # fmt: skip


class Inputs:
    """A model's batches on the device: learnable random images (a random pattern per class plus noise), or
    the Penn Treebank's windows of words cycling over epochs."""

    def __init__(self, model: Model, device: torch.device, data_dir: Path) -> None:
        self.model, self.device = model, device
        self.workload = create_workload(model.workload, model.options)
        if model.images:
            size, classes = int(model.options["image_size"]), int(model.options["num_classes"])
            generator = torch.Generator(device=device).manual_seed(0)
            self.patterns = torch.randn(classes, 3, size, size, device=device, generator=generator)
        else:
            self.text = self.workload.load_data(data_dir, download=False)

    def stream(self, batch_size: int, seed: int = 1) -> Any:
        """Batches without end: the same sequence for every precision."""
        if self.model.images:
            generator = torch.Generator(device=self.device).manual_seed(seed)
            while True:
                labels = torch.randint(len(self.patterns), (batch_size,), device=self.device, generator=generator)
                noise = torch.randn(self.patterns[labels].shape, device=self.device, generator=generator)
                images = (self.patterns[labels] + noise).contiguous(memory_format=torch.channels_last)
                yield images, labels
        epoch = 0
        while True:
            for batch in self.workload.train_batches(self.text, epoch=epoch, batch_size=batch_size, seed=seed,
                                                     part=Part(0, 1)):  # fmt: skip
                yield to_device(batch, self.device)
            epoch += 1


class Trainer:
    """One model in one precision, eager or compiled, and its training step."""

    def __init__(self, model: Model, inputs: Inputs, precision: str, compiled: bool, device: torch.device) -> None:
        torch.manual_seed(0)
        self.model, self.inputs, self.device = model, inputs, device
        network = inputs.workload.build_model().to(device)
        if model.images:
            network = network.to(memory_format=torch.channels_last)
        network.train()
        self.network = network
        layout = "channels_last" if model.images else "contiguous"
        self.forward = TrainingForward(network, compiled=compiled, memory_format=layout, device_type=device.type)
        self.optimizer = build_optimizer(
            model.optimizer, {}, network.parameters(), lr=model.lr, momentum=model.momentum,
            weight_decay=model.weight_decay,
        )  # fmt: skip
        scale = INITIAL_SCALE if precision == "fp16" else None
        self.precision = Precision(precision=precision, initial_scale=scale, device_type=device.type)

    def step(self, batch: Any) -> torch.Tensor:
        """One training step; the loss, detached (reading it is the caller's synchronisation)."""
        self.optimizer.zero_grad(set_to_none=True)
        with self.precision.forward_context():
            if self.model.images:
                images, labels = batch
                loss = F.cross_entropy(self.forward.module(images), labels)
            else:
                loss, _, _ = self.inputs.workload.training_loss(self.forward.module, batch, None)
        self.precision.objective(loss, self.network).backward()
        self.precision.after_backward(self.network)
        skipped = False
        if self.precision.skips_nonfinite:  # the loop's check too: one synchronisation a step
            skipped = not finite([p.grad for p in self.network.parameters() if p.grad is not None])
        if not skipped:
            self.optimizer.step()
        self.precision.after_exchange(skipped)
        return loss.detach()


def release() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timed(plan: Plan, model: Model, inputs: Inputs, precision: str, compiled: bool, batch_size: int) -> dict[str, Any]:
    """Seconds per step (median of blocks), samples and tokens per second, peak memory, compile seconds."""
    device = resolve_device(plan.device)
    began = time.perf_counter()
    trainer = Trainer(model, inputs, precision, compiled, device)
    batch = next(inputs.stream(batch_size))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(plan.warmup):
        trainer.step(batch)
    synchronize(device)
    warm = time.perf_counter() - began
    blocks = []
    for _ in range(plan.blocks):
        synchronize(device)
        start = time.perf_counter()
        for _ in range(plan.steps_per_block):
            loss = trainer.step(batch)
        synchronize(device)
        blocks.append((time.perf_counter() - start) / plan.steps_per_block)
    step = statistics.median(blocks)
    tokens = batch_size * int(model.options["context"]) if not model.images else None
    row = {
        "workload": model.workload, "precision": precision, "compiled": compiled, "batch_size": batch_size,
        "step_seconds": step, "block_seconds": blocks, "samples_per_second": batch_size / step,
        "tokens_per_second": tokens / step if tokens else None, "last_loss": float(loss),
        "peak_memory_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        "warmup_seconds": warm, "compile_seconds": trainer.forward.compile_seconds,
        "loss_scale": trainer.precision.loss_scale,
    }  # fmt: skip
    del trainer
    release()
    return row


def curve(plan: Plan, model: Model, inputs: Inputs, precision: str) -> list[float]:
    """The loss of each of ``plan.curve_steps`` steps from fresh weights, eager, on the shared stream."""
    trainer = Trainer(model, inputs, precision, False, resolve_device(plan.device))
    stream = inputs.stream(model.batch_size, seed=2)
    losses = torch.stack([trainer.step(next(stream)) for _ in range(plan.curve_steps)]).float().cpu().tolist()
    del trainer
    release()
    return losses


def profiled(plan: Plan, model: Model, inputs: Inputs, precision: str) -> dict[str, Any]:
    """The kernels of ``plan.profile_steps`` eager steps after a warm-up: device seconds per step in each, the
    top ones, and the share of convolution and matrix-product kernels (by name)."""
    from torch.profiler import ProfilerActivity, profile

    device = resolve_device(plan.device)
    trainer = Trainer(model, inputs, precision, False, device)
    batch = next(inputs.stream(model.batch_size))
    for _ in range(plan.warmup):
        trainer.step(batch)
    synchronize(device)
    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities) as recorded:
        for _ in range(plan.profile_steps):
            trainer.step(batch)
        synchronize(device)
    del trainer
    release()
    rows = []
    for event in recorded.key_averages():
        if on_gpu:  # kernels: the events with device time of their own
            own = getattr(event, "self_device_time_total", None)
            own = own if own is not None else getattr(event, "self_cuda_time_total", 0)
        else:  # the CPU's operators: self time of the aten calls
            own = event.self_cpu_time_total if event.key.startswith("aten::") else 0
        if own > 0:
            rows.append({"name": event.key, "seconds_per_step": own / 1e6 / plan.profile_steps,
                         "calls_per_step": event.count / plan.profile_steps})  # fmt: skip
    rows.sort(key=lambda row: -row["seconds_per_step"])
    total = sum(row["seconds_per_step"] for row in rows)
    heavy = sum(row["seconds_per_step"] for row in rows if _matrix_kernel(row["name"]))
    return {
        "workload": model.workload, "precision": precision, "batch_size": model.batch_size,
        "what": "CUDA kernels, device time" if on_gpu else "aten operators, CPU self time",
        "seconds_per_step": total, "matrix_share": heavy / total if total else None,
        "top": [{**row, "share": row["seconds_per_step"] / total} for row in rows[: plan.top_kernels]],
    }  # fmt: skip


MATRIX_WORDS = ("gemm", "conv", "cutlass", "cudnn", "xmma", "wgrad", "dgrad", "fprop", "sm90", "sm80", "matmul",
                "mm", "addmm", "bmm", "linear", "flash", "attention", "nvjet", "implicit")  # fmt: skip


def _matrix_kernel(name: str) -> bool:
    lowered = name.lower()
    return any(word in lowered for word in MATRIX_WORDS) and "elementwise" not in lowered


def ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's speedup over fp32 of the same model, batch and mode (set in place)."""
    base = {
        (r["workload"], r["batch_size"], r["compiled"]): r
        for r in rows
        if r["precision"] == "fp32" and "step_seconds" in r
    }
    for row in rows:
        reference = base.get((row["workload"], row["batch_size"], row["compiled"]))
        if reference and "step_seconds" in row:
            row["speedup_over_fp32"] = reference["step_seconds"] / row["step_seconds"]


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """Whether any narrow precision reached ×GOAL over fp32 at the full batch, and the best ratio seen."""
    full = {model["workload"]: model["batch_size"] for model in result["models"]}
    candidates = [
        row for row in result["rows"]
        if row.get("speedup_over_fp32") and row["precision"] != "fp32" and row["batch_size"] == full[row["workload"]]
    ]  # fmt: skip
    if not candidates:
        return {"met": False, "best": None}
    best = max(candidates, key=lambda row: row["speedup_over_fp32"])
    keys = ("workload", "precision", "compiled", "speedup_over_fp32")
    return {"met": best["speedup_over_fp32"] >= GOAL, "goal": GOAL, "best": {key: best[key] for key in keys}}


def run(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    configure_process(plan.threads)
    deadline = time.time() + args.seconds
    if plan.device == "cuda":
        # TF32 for fp32's matrix products (cuDNN's convolutions use it by default already)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    device = resolve_device(plan.device)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tf32": torch.backends.cuda.matmul.allow_tf32, "torch": torch.__version__,
        "models": [vars(model) for model in plan.models], "timing": {"warmup": plan.warmup, "blocks": plan.blocks,
        "steps_per_block": plan.steps_per_block}, "rows": [], "curves": {}, "profiles": [], "not_run": [],
        "errors": [],
    }  # fmt: skip
    recorder = Recorder(args.json, result)
    inputs = {model.workload: Inputs(model, device, args.data_dir) for model in plan.models}
    models = {model.workload: model for model in plan.models}
    jobs: list[tuple[str, Any]] = []
    for model in plan.models:  # eager at the full batch, every precision
        jobs += [("time", (model.workload, precision, False, model.batch_size)) for precision in plan.precisions]
    jobs += [("curve", (model.workload, precision)) for model in plan.models for precision in plan.precisions]
    jobs += [("profile", (plan.profiled, precision)) for precision in ("fp32", "bf16")]
    for model in plan.models:  # the half batch: does the full one fill the GPU?
        jobs += [("time", (model.workload, precision, False, model.batch_size // 2)) for precision in ("fp32", "bf16")]
    jobs += [
        ("time", (workload, precision, True, models[workload].batch_size)) for workload, precision in plan.compiled
    ]
    longest_compile = 0.0
    for kind, job in jobs:
        compiled = kind == "time" and job[2]
        needs = max(30.0, 1.3 * longest_compile) if compiled else 10.0
        if time.time() + needs > deadline:
            result["not_run"].append({"kind": kind, "job": job, "why": "the part's deadline"})
            recorder.save()
            continue
        began = time.time()
        try:
            if kind == "time":
                workload, precision, compiled, batch = job
                result["rows"].append(timed(plan, models[workload], inputs[workload], precision, compiled, batch))
                ratios(result["rows"])
            elif kind == "curve":
                workload, precision = job
                result["curves"].setdefault(workload, {})[precision] = curve(
                    plan, models[workload], inputs[workload], precision
                )
            else:
                result["profiles"].append(profiled(plan, models[job[0]], inputs[job[0]], job[1]))
        except Exception as exc:  # one row's failure (e.g. out of memory) must not cost the others theirs
            release()
            error = "".join(traceback.format_exception_only(exc)).strip()[-800:]
            result["errors"].append({"kind": kind, "job": job, "error": error})
            print(f"{kind} {job}: {error}\n{traceback.format_exc()[-2000:]}", flush=True)
        if compiled:
            longest_compile = max(longest_compile, time.time() - began)
        print(f"{kind} {job}: {time.time() - began:.1f} s", flush=True)
        result["quality"] = quality(result["curves"])
        result["verdict"] = verdict(result)
        recorder.save()
    return result


def quality(curves: dict[str, dict[str, list[float]]]) -> dict[str, dict[str, float]]:
    """Per model and precision: the mean loss of the curve's last quarter, and its ratio to fp32's."""
    summary: dict[str, dict[str, float]] = {}
    for workload, by_precision in curves.items():
        ends = {p: statistics.mean(losses[-max(1, len(losses) // 4) :]) for p, losses in by_precision.items()}
        summary[workload] = {f"{p}_end_loss": end for p, end in ends.items()}
        if "fp32" in ends and math.isfinite(ends["fp32"]) and ends["fp32"] > 0:
            summary[workload] |= {f"{p}_against_fp32": end / ends["fp32"] for p, end in ends.items() if p != "fp32"}
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the result, rewritten after every row")
    parser.add_argument("--data-dir", type=Path, required=True, help="the folder with ptb/")
    parser.add_argument("--seconds", type=float, default=300.0, help="the part's time: no row starts after it")
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on this CPU")
    args = parser.parse_args(argv)
    args.data_dir = args.data_dir.resolve()
    run(DRY_PLAN if args.dry_run else DEVICE_PLAN, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
