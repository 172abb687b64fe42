"""Chaos: an elastic all-reduce (or sharded-server: ``--strategy ps-sharded``) run that loses a random worker
every ~30 s and admits a replacement each time, against the same run left alone.

The run: ``scaletrain train lenet --workers 4 --strategy allreduce --sync split --min-workers 2
--max-workers 4 --batch-size 60 --log-every 1`` on the real Fashion-MNIST on loopback, started as the user
starts it, with enough epochs to last ``--seconds`` (sized from a short probe run first). Every ``--every``
seconds (seeded random jitter, ±50 %) this script picks a live member other than rank 0 (it hosts the
store, which the run cannot lose), sends it ``SIGKILL`` (a lost machine) or ``SIGSTOP`` (a frozen one), at
random, and starts a replacement: the same command with ``--join``. A frozen worker is left for the
launcher, which kills it ``--timeout`` + 3 s after it froze; a frozen joiner (the launcher did not start it,
so nothing else ends it) is killed here ``--timeout`` + 5 s after it froze. Faults stop once less than
``--every`` seconds of the run are left, so the last replacement can still be admitted.

What is read from the run's records (``metrics.jsonl``, one step record per step, and ``summary.json``):

- every step number 1…S recorded exactly once, each epoch's ``steps_per_epoch`` steps in that epoch: every
  global batch of every epoch applied once (a redone step is recorded once, when it is done);
- the split of every step's global batch over the membership that computed it (the membership records say
  from which step each membership trained), rebuilt with ``scaletrain.data.sampler``: the parts of each
  global batch are that batch's samples, once each, and the epoch's batches are the epoch's samples, once
  each (the last incomplete batch is dropped by design). This checks the plan the recorded memberships imply;
  the records do not say which rows each worker actually read, so it cannot catch a worker that read other
  rows than its plan (``tests/parallel/test_elastic.py`` checks that, weight for weight, on short runs);
- each fault's recovery: from the signal to the survivors' next completed step (``recovered``, the same clock
  on this one machine) and the run's own ``seconds_to_recover`` (from its detection), ``steps_redone``; each
  join's ``waited_seconds`` (from its request to its admission); a member that came or went in a change whose
  record does not name it (``joined``, ``left``) is printed, as a fault of the records, not of the training;
- the throughput: steps per second from the first to the last step record, this run's and the reference's.
  "Lost to recoveries" is the excess over the run's median step interval of each interval between two step
  records that holds a fault's signal or a membership change: time in which no step was completed because
  of a loss or an admission. The rest of the difference in wall time from the reference is the run going
  at other speeds between changes (3 workers instead of 4 on 2 cores, a replacement starting up beside
  them), which is printed apart.

Goals (issue 26): the run exits 0 after at least ``--seconds`` of training with faults; every fault seen
as a member leaving; every step of every epoch applied once; the test accuracy within the noise of an
uninterrupted run: two reference runs without faults, one with the chaos run's seed and one with the next
seed; the chaos run must be within max(|reference 1 − reference 2|, ``--noise-floor``) of the reference
with its own seed (``split`` keeps the global batch, so with the same seed it should differ from that
reference by float rounding only: the order of the sums changes with the number of workers).

Run: ``cd benchmarks && PYTHONPATH=../src ../.venv/bin/python chaos.py [--seconds 300 --every 30
--timeout 20 --threads 1 --epochs N --keep DIR --json out.json]``. It takes a 20 s probe, then the chaos
run and two references of about ``--seconds`` each, the chaos run longer (about 20 minutes on this 2-core
CPU with ``--epochs 10``). A failed run's logs are copied to ``/tmp/chaos-failure-N/``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos_checks import coverage_checks, stalls, step_checks, step_times, unrecorded_changes
from scaletrain.processes import process_state
from training_runs import ELASTIC_STRATEGIES, SRC, add_run_flags, fashion_mnist, finish, pid_of, run_records, train_run

TRAIN_SAMPLES = 60_000
PROBE_STEPS = 200


@dataclass
class Fault:
    """One signal sent to one worker, and the replacement started after it."""

    time: float
    rank: int
    pid: int
    signal: str
    replacement: subprocess.Popen | None = None
    checked: bool = False
    notes: list[str] = field(default_factory=list)


def run_flags(args: argparse.Namespace, data: Path, *, epochs: int | None, steps: int | None, seed: int) -> list[str]:
    """The flags of every run here: the chaos run, its replacements, the references and the probe."""
    length = ["--epochs", str(epochs)] if epochs is not None else ["--steps", str(steps)]
    return [
        *("--workers", str(args.workers), *ELASTIC_STRATEGIES[args.strategy], "--sync", "split"),
        *("--min-workers", str(args.min_workers), "--max-workers", str(args.workers)),
        *("--batch-size", str(args.batch_size), *length, "--log-every", "1"),
        *("--threads", str(args.threads), "--seed", str(seed), "--timeout", str(args.timeout)),
        *("--data-dir", str(data)),
    ]


def command_of(flags: list[str], out: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "scaletrain", "train", "lenet", *flags),
        *("--out", str(out), "--progress", "off", "--no-tensorboard", "--no-download"),
    ]


def environment() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}


class MetricsTail:
    """The run's ``metrics.jsonl`` as it grows, read from where the last look ended (a whole re-read ten times
    a second would take CPU from the run on a 2-core machine): the last step number and the members now."""

    def __init__(self, out: Path, workers: int) -> None:
        self.path, self.offset = out / "metrics.jsonl", 0
        self.step, self.members = 0, list(range(workers))

    def look(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as file:
            file.seek(self.offset)
            chunk = file.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line being written is left for the next look
        self.offset += len(complete)
        for line in complete.decode("utf-8").splitlines():
            record = json.loads(line)
            if record.get("kind") == "step":
                self.step = record["step"]
            elif record.get("kind") == "membership":
                self.members = record["members"]


def keep_logs(out: Path, why: str) -> Path:
    """Copy the run's logs (and what this script saw) to the next free /tmp/chaos-failure-N/."""
    number = 1
    while Path(f"/tmp/chaos-failure-{number}").exists():
        number += 1
    kept = Path(f"/tmp/chaos-failure-{number}")
    shutil.copytree(out / "logs", kept / "logs") if (out / "logs").exists() else kept.mkdir(parents=True)
    for name in ("metrics.jsonl", "summary.json", "launcher.out", "launcher.err"):
        if (out / name).exists():
            shutil.copy(out / name, kept / name)
    for joiner in out.glob("joiner-*"):
        shutil.copy(joiner, kept / joiner.name)
    (kept / "why.txt").write_text(why + "\n")
    return kept


def chaos_run(args: argparse.Namespace, flags: list[str], out: Path, total_steps: int, steps_per_second: float):
    """The run with faults; (faults, the launcher's exit status, the joiners' exit statuses, began, ended)."""
    rng = random.Random(args.seed)
    out.mkdir(parents=True)
    command = command_of(flags, out)
    with (out / "launcher.out").open("w") as stdout, (out / "launcher.err").open("w") as stderr:
        launcher = subprocess.Popen(command, env=environment(), stdout=stdout, stderr=stderr)
    began = time.time()
    faults: list[Fault] = []
    signalled: set[int] = set()
    joiners = 0
    next_fault = None
    metrics = MetricsTail(out, args.workers)
    while launcher.poll() is None:
        time.sleep(0.1)
        metrics.look()
        if not metrics.step:
            continue
        now = time.time()
        if next_fault is None:
            next_fault = now + args.every * rng.uniform(0.5, 1.5)
        for fault in faults:  # the launcher kills a frozen worker it started; one that joined is ours to end
            if fault.signal == "SIGSTOP" and not fault.checked and now > fault.time + args.timeout + 5:
                fault.checked = True
                state = process_state(fault.pid)
                if state not in (None, "Z"):
                    started = "a joiner, not the launcher's" if fault.rank >= args.workers else "the launcher's"
                    fault.notes.append(f"frozen ({started}) still there {now - fault.time:.0f} s on: killed here")
                    os.kill(fault.pid, signal.SIGKILL)
        left = (total_steps - metrics.step) / steps_per_second
        if now < next_fault or left < args.every:
            continue
        candidates = [
            (rank, pid)
            for rank in metrics.members
            if rank != 0 and rank not in signalled
            for pid in [pid_of(out, rank)]
            if pid is not None and process_state(pid) not in (None, "Z", "T")
        ]
        if not candidates:
            next_fault = now + 1.0
            continue
        rank, pid = rng.choice(candidates)
        name = rng.choice(["SIGKILL", "SIGSTOP"])
        sent = time.time()
        os.kill(pid, getattr(signal, name))
        signalled.add(rank)
        joiners += 1
        with (out / f"joiner-{joiners}.out").open("w") as stdout:
            replacement = subprocess.Popen(
                [*command, "--join"], env=environment(), stdout=stdout, stderr=subprocess.STDOUT
            )
        faults.append(Fault(time=sent, rank=rank, pid=pid, signal=name, replacement=replacement))
        print(f"  {sent - began:6.1f} s  {name} worker rank {rank} (pid {pid}); replacement started", flush=True)
        next_fault = now + args.every * rng.uniform(0.5, 1.5)
    ended = time.time()
    for fault in faults:  # first, so that no replacement is waited for behind a frozen process
        if fault.signal == "SIGSTOP" and process_state(fault.pid) not in (None, "Z"):
            fault.notes.append("the frozen worker outlived the run: killed")
            os.kill(fault.pid, signal.SIGKILL)
    joiner_codes = []
    for fault in faults:
        try:
            joiner_codes.append(fault.replacement.wait(timeout=args.timeout + 30))
        except subprocess.TimeoutExpired:
            fault.replacement.kill()
            joiner_codes.append(fault.replacement.wait())
            fault.notes.append("its replacement was still running after the run ended: killed")
    return faults, launcher.returncode, joiner_codes, began, ended


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_flags(parser)
    parser.set_defaults(threads=1)
    parser.add_argument("--seconds", type=float, default=300.0, help="how long each run should last, at least")
    parser.add_argument("--every", type=float, default=30.0, help="mean seconds between faults")
    parser.add_argument("--timeout", type=float, default=20.0, help="the runs' --timeout")
    parser.add_argument("--workers", type=int, default=4)
    joinable = ["allreduce", "ps-sharded"]  # the central server admits no joiner
    parser.add_argument("--strategy", choices=joinable, default="allreduce")
    parser.add_argument("--min-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=60, help="must divide by every count of workers")
    parser.add_argument("--epochs", type=int, help="epochs of each run (default: sized from a probe run)")
    parser.add_argument("--keep", type=Path, help="write the runs' folders here and keep them (default: deleted)")
    parser.add_argument("--noise-floor", type=float, default=0.005, help="smallest accuracy band accepted")
    args = parser.parse_args()
    data = fashion_mnist(parser, args.data_dir)
    steps_per_epoch = TRAIN_SAMPLES // args.batch_size
    with tempfile.TemporaryDirectory(prefix="chaos-") as temporary:
        root = args.keep or Path(temporary)
        probe = root / "probe"
        train_run("lenet", probe, run_flags(args, data, epochs=None, steps=PROBE_STEPS, seed=args.seed))
        probe_rate = run_records(probe)[1]["batches_per_second"]
        epochs = args.epochs or math.ceil(args.seconds * probe_rate / steps_per_epoch)
        total_steps = epochs * steps_per_epoch
        print(
            f"probe: {probe_rate:.1f} steps/s with {args.workers} workers; {epochs} epochs of {steps_per_epoch} "
            f"steps (about {total_steps / probe_rate:.0f} s of training each run)"
        )
        flags = run_flags(args, data, epochs=epochs, steps=None, seed=args.seed)
        out = root / "chaos"
        print(f"chaos run, seed {args.seed}: {' '.join(command_of(flags, out))}")
        faults, code, joiner_codes, began, ended = chaos_run(args, flags, out, total_steps, probe_rate)
        if code != 0:
            kept = keep_logs(out, f"the run exited {code}")
            print(f"the chaos run exited {code}; its logs are in {kept}")
            print((out / "launcher.err").read_text()[-3000:])
            return finish(args, {"faults": [vars_of(fault) for fault in faults], "exit": code}, False)
        references = []
        for seed in (args.seed, args.seed + 1):
            folder = root / f"reference-{seed}"
            wall = train_run("lenet", folder, run_flags(args, data, epochs=epochs, steps=None, seed=seed))
            records, summary = run_records(folder)
            times = step_times(records)
            rate = (len(times) - 1) / (times[-1] - times[0])
            references.append({"seed": seed, "wall": wall, "rate": rate, "accuracy": summary["test_accuracy"]})
            print(
                f"reference seed {seed}: test accuracy {summary['test_accuracy']:.4f}, wall {wall:.1f} s, "
                f"{rate:.2f} steps/s (first to last step), {summary['workers_at_end']} workers at the end"
            )
        records, summary = run_records(out)
        report = analyse(args, faults, joiner_codes, records, summary, references, began, ended)
        if not report["met"]:
            print(f"logs kept in {keep_logs(out, 'a goal was not met')}")
    return finish(args, report, report["met"])


def vars_of(fault: Fault) -> dict[str, Any]:
    return {"time": fault.time, "rank": fault.rank, "pid": fault.pid, "signal": fault.signal, "notes": fault.notes}


def analyse(
    args: argparse.Namespace,
    faults: list[Fault],
    joiner_codes: list[int],
    records: list[dict[str, Any]],
    summary: dict[str, Any],
    references: list[dict[str, Any]],
    began: float,
    ended: float,
) -> dict[str, Any]:
    """Print the faults, recoveries, joins, coverage, throughput and accuracy; the numbers and the verdict."""
    changes = summary["membership"]
    times = step_times(records)
    start, wall = began, ended - began
    print(f"\n{len(faults)} faults; {len(changes)} membership changes; {summary['workers_at_end']} workers at the end")
    print(
        f"{'s (launch)':>10} {'rank':>5} {'signal':<8} {'why seen':<18} {'signal→step s':>13} "
        f"{'detect→step s':>13} {'redone':>6}  notes"
    )
    recoveries = []
    for fault in faults:
        change = next((c for c in changes if any(who["rank"] == fault.rank for who in c["left"])), None)
        if change is None:
            print(f"{fault.time - start:>10.1f} {fault.rank:>5} {fault.signal:<8} NOT SEEN LEAVING")
            recoveries.append(None)
            continue
        why = next(who["why"] for who in change["left"] if who["rank"] == fault.rank)
        seconds = change["recovered"] - fault.time
        recoveries.append(seconds)
        print(
            f"{fault.time - start:>10.1f} {fault.rank:>5} {fault.signal:<8} {why:<18} {seconds:>13.2f} "
            f"{change['seconds_to_recover']:>13.2f} {change['steps_redone']:>6}  {'; '.join(fault.notes)}"
        )
    joins = [(change, who) for change in changes for who in change["joined"]]
    print(f"\n{len(joins)} joins of {len(faults)} replacements (exit statuses {joiner_codes}):")
    for change, who in joins:
        print(
            f"  rank {who['rank']} after step {change['step']} ({change['recovered'] - start:.1f} s): waited "
            f"{who.get('waited_seconds', float('nan')):.2f} s to be admitted, first step with it "
            f"{change['seconds_to_recover']:.2f} s after the admission began; {change['workers']} workers"
        )
    unrecorded = unrecorded_changes(changes, args.workers)
    for line in unrecorded:
        print(f"  records: {line}")
    problems = step_checks(records, summary)
    coverage = coverage_checks(summary, TRAIN_SAMPLES, args.seed, args.workers)
    epochs = summary["steps"] // summary["steps_per_epoch"]
    print(
        f"\nsteps: {summary['steps']} ({epochs} epochs of {summary['steps_per_epoch']}), each step number recorded "
        f"once and in its epoch: {'yes' if not problems else 'NO: ' + '; '.join(problems)}"
    )
    print(
        "the split of every global batch over the membership that computed it (rebuilt from the membership "
        f"records) covers each epoch's samples once: {'yes' if not coverage else 'NO: ' + '; '.join(coverage[:5])}"
    )
    rate = (len(times) - 1) / (times[-1] - times[0])
    reference = references[0]
    marks = [fault.time for fault in faults] + [change["recovered"] for change in changes]
    median, lost = stalls(times, marks)
    span, reference_span = times[-1] - times[0], (len(times) - 1) / reference["rate"]
    print(
        f"\nthroughput: {rate:.2f} steps/s against the reference's {reference['rate']:.2f} "
        f"({100 * (1 - rate / reference['rate']):.1f} % lower; seed {references[1]['seed']}'s: "
        f"{references[1]['rate']:.2f}); training {span:.1f} s against {reference_span:.1f} s"
    )
    print(
        f"lost to recoveries: {lost:.1f} s ({100 * lost / span:.1f} % of the training time, about "
        f"{lost / median:.0f} steps at the run's median {1000 * median:.1f} ms a step): the excess over that median "
        "of the step intervals that hold a fault's signal or a membership change"
    )
    print(
        f"the rest of the difference from the reference, {span - reference_span - lost:+.1f} s, is the run going at "
        "other speeds between changes (3 or 4 workers, a replacement starting beside them)"
    )
    print(f"wall: {wall:.1f} s (launch to exit) against the reference's {reference['wall']:.1f} s")
    band = max(abs(references[0]["accuracy"] - references[1]["accuracy"]), args.noise_floor)
    difference = summary["test_accuracy"] - reference["accuracy"]
    accurate = abs(difference) <= band
    print(
        f"\ntest accuracy {summary['test_accuracy']:.4f} against {reference['accuracy']:.4f} (same seed) and "
        f"{references[1]['accuracy']:.4f} (seed {references[1]['seed']}): {difference:+.4f}, band ±{band:.4f} "
        f"(max of the two references' difference and --noise-floor {args.noise_floor}): "
        f"{'within' if accurate else 'NOT within'}"
    )
    seen = all(seconds is not None for seconds in recoveries)
    lasted = span >= args.seconds
    print(f"chaos lasted {span:.0f} s of training (goal ≥ {args.seconds:.0f} s): {'yes' if lasted else 'NO'}")
    met = not problems and not coverage and accurate and seen and lasted and len(faults) > 0
    print(f"goals: {'met' if met else 'NOT met'}")
    return {
        "met": met,
        "faults": [
            {**vars_of(fault), "recovery_seconds": seconds} for fault, seconds in zip(faults, recoveries, strict=True)
        ],
        "joiner_exit_statuses": joiner_codes,
        "membership": changes,
        "steps": summary["steps"],
        "steps_per_second": rate,
        "seconds_lost_to_recoveries": lost,
        "median_step_seconds": median,
        "wall_seconds": wall,
        "test_accuracy": summary["test_accuracy"],
        "references": references,
        "accuracy_band": band,
        "problems": problems + coverage,
        "unrecorded_membership_changes": unrecorded,
    }


if __name__ == "__main__":
    sys.exit(main())
