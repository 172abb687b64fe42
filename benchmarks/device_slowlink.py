"""Slow links with cores to spare (issue 50, part 3): ResNet-20 on Fashion-MNIST, 2 workers of 4 threads each over
an emulated 50 Mbit/s link, against one process of 4 threads.

The runs, each a fresh ``scaletrain train`` process tree (one after another, the same seed, data and global batch,
``--sync split``): one process (the reference); the dense all-reduce; PowerSGD rank 4 with error feedback,
overlapped with backward (``--overlap``); top-k 1 % with error feedback; DiLoCo (``--strategy diloco
--sync-every H``, H = 16 and 64, the inner optimizer the run's SGD, the outer Nesterov SGD at 0.7 and 0.9).
Per run: the median seconds per step of its epochs, the speedup (one process's ÷ the run's), the gradient
bytes a worker sent per step, the test accuracy after the same steps, and DiLoCo's outer steps. The issue's
question: with cores to spare on each worker and a slow link, which of them keeps one process's accuracy and
still runs faster than one process?

The link is emulated with network namespaces and ``tc`` (:mod:`scaletrain.netem`), which needs root and the
right to make namespaces. :func:`link_check` tries it first; where it cannot, the runs go over loopback and the
result says so in one line (``link``, ``link_note``): nothing is reported as 50 Mbit/s that did not cross one.

The most valuable runs come first; a run that would end after ``--seconds`` is recorded as not run. The result
JSON is rewritten after every run. ``--dry-run``: 4 steps of 32 images, H = 2 only, one thread.

Run (root): ``PYTHONPATH=src:benchmarks python benchmarks/device_slowlink.py --json OUT.json --data-dir DIR
[--seconds 400] [--dry-run]`` (``DIR/fashion-mnist``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from device_scaling import Recorder
from scaletrain.netem import EmulatedNetwork, parse_rate
from training_runs import run_records

SRC = Path(__file__).resolve().parents[1] / "src"
TWO = ["--workers", "2", "--sync", "split"]


@dataclass(frozen=True)
class Plan:
    rate: str
    train_samples: int
    epochs: int
    batch_size: int
    threads: int
    sync_every: tuple[int, ...]  # DiLoCo's H: a run for each
    lr: float = 0.1

    def runs(self) -> dict[str, list[str]]:
        """Each run's flags beyond the common ones, the most valuable first."""
        diloco = {
            f"diloco H={every}": [*TWO, "--strategy", "diloco", "--sync-every", str(every)] for every in self.sync_every
        }
        return {
            "one process": [],
            "dense all-reduce": [*TWO, "--strategy", "allreduce"],
            **diloco,
            "powersgd rank 4 overlap": [*TWO, "--strategy", "allreduce", "--wire", "powersgd", "-W", "rank=4",
                                        "--error-feedback", "--overlap"],
            "top-k 1 %": [*TWO, "--strategy", "allreduce", "--wire", "topk", "-W", "ratio=0.01", "--error-feedback"],
        }  # fmt: skip


# 25,600 images at batch 128: 200 steps, one epoch (the test set of 10,000 is scored once, at the end)
DEVICE_PLAN = Plan(rate="50mbit", train_samples=25_600, epochs=1, batch_size=128, threads=4, sync_every=(16, 64))
# one DiLoCo run: the second differs from it in H alone (the dry run's time is CI's)
DRY_PLAN = Plan(rate="50mbit", train_samples=128, epochs=1, batch_size=32, threads=1, sync_every=(2,))


def link_check(rate: str) -> tuple[bool, str]:
    """Whether a 2-host network at ``rate`` can be made here, and if not, why (one line)."""
    if os.geteuid() != 0:
        return False, f"not root (effective user id {os.geteuid()}): the emulated link needs namespaces and tc"
    try:
        with EmulatedNetwork(2, parse_rate(rate)):
            pass
    except Exception as exc:  # whatever stops it (no CAP_NET_ADMIN in a container, no iproute2) is the reason
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return False, f"the emulated link could not be made: {type(exc).__name__}: {first[:300]}"
    return True, f"emulated {rate} links (namespaces + veth + tc tbf)"


def train(plan: Plan, data_dir: Path, out: Path, flags: list[str], timeout: float) -> dict[str, Any]:
    """One ``scaletrain train resnet20`` run; its figures."""
    command = [
        sys.executable, "-m", "scaletrain", "train", "resnet20", "-o", "dataset=fashion-mnist",
        "-o", f"train_samples={plan.train_samples}", "--epochs", str(plan.epochs), "--batch-size",
        str(plan.batch_size), "--lr", str(plan.lr), "--momentum", "0.9", "--weight-decay", "1e-4",
        "--threads", str(plan.threads), "--seed", "0", "--data-dir", str(data_dir), "--device", "cpu", *flags,
        "--out", str(out), "--progress", "off", "--no-tensorboard", "--no-download",
    ]  # fmt: skip
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
    began = time.time()
    result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"exit {result.returncode}: {result.stderr[-2500:]}")
    records, summary = run_records(out)
    epochs = [record for record in records if record["kind"] == "epoch"]
    workers = summary["per_worker"]
    return {
        "wall_seconds": time.time() - began,
        "test_accuracy": summary["test_accuracy"],
        "seconds_per_step": statistics.median(record["seconds_per_step"] for record in epochs),
        "steps": sum(record["steps"] for record in epochs),
        "bytes_per_step": max(w["gradient_bytes_sent"] / max(w["steps"], 1) for w in workers),
        "weights_agree": len({w["weights_digest"] for w in workers}) == 1,
        "outer_steps": summary.get("outer_steps"),
        **{part: summary.get(f"{part}_seconds_per_step") for part in ("compute", "communication", "wait")},
    }


def run(plan: Plan, args: argparse.Namespace) -> dict[str, Any]:
    deadline = time.time() + args.seconds
    usable, note = link_check(plan.rate)
    link = plan.rate if usable else "loopback"
    print(f"link: {link} ({note})", flush=True)
    result: dict[str, Any] = {
        "workload": "resnet20 on Fashion-MNIST", "link": link, "link_note": note, "plan": vars(plan),
        "cores": len(os.sched_getaffinity(0)), "runs": {}, "not_run": [],
    }  # fmt: skip
    recorder = Recorder(args.json, result)
    network = ["--network", plan.rate] if usable else []
    longest = 0.0
    for name, flags in plan.runs().items():
        left = deadline - time.time()
        if left < max(20.0, 1.3 * longest):
            result["not_run"].append({"run": name, "why": "the part's deadline"})
            recorder.save()
            continue
        folder = args.work / name.replace(" ", "-").replace("%", "pc").replace("=", "")
        began = time.time()
        try:
            extra = network if name != "one process" else []
            entry = train(plan, args.data_dir, folder, [*flags, *extra], timeout=left)
            entry["flags"] = [*flags, *extra]
        except Exception as exc:  # one run's failure must not cost the others theirs
            entry = {"status": "failed", "error": "".join(traceback.format_exception_only(exc))[-2500:]}
        longest = max(longest, time.time() - began)
        result["runs"][name] = entry
        alone = result["runs"].get("one process", {}).get("seconds_per_step")
        for run_entry in result["runs"].values():
            if alone and run_entry.get("seconds_per_step"):
                run_entry["speedup"] = alone / run_entry["seconds_per_step"]
        print(f"{name}: {time.time() - began:.0f} s, {entry.get('error') or ''}", flush=True)
        recorder.save()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, required=True, help="the result, rewritten after every run")
    parser.add_argument("--data-dir", type=Path, required=True, help="the folder with fashion-mnist/")
    parser.add_argument("--work", type=Path, required=True, help="where the runs go")
    parser.add_argument("--seconds", type=float, default=400.0, help="the part's time: no run starts after it")
    parser.add_argument("--dry-run", action="store_true", help="tiny runs, one thread")
    args = parser.parse_args(argv)
    args.data_dir = args.data_dir.resolve()
    run(DRY_PLAN if args.dry_run else DEVICE_PLAN, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
