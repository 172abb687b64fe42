"""The GPU machine's suite: its correctness tests, its figures and CPU measurements on its cores, in one command
that ends before its own limit and writes what it has.

A visit (``--visit``) is a list of parts, each a subprocess under ``timeout`` with its own budget (a part that
fails or overruns is recorded as such with the tail of its output, and the others go on):

- ``issue50`` (the default on the GPU machine): ``gpu-tests`` (``pytest -m gpu``), then ``mixed-precision``
  (:mod:`device_precision`: fp32/TF32, bf16 and fp16 on ResNet-34, VGG16E and a GPT, eager and compiled, loss
  curves, a kernel profile) on the first two cores; beside them ``slow-link`` (:mod:`device_slowlink`: ResNet-20
  on 2 workers of 4 threads over 50 Mbit/s: dense, PowerSGD, top-k, DiLoCo) on cores 2–9 and ``holdout``
  (:mod:`device_holdout`: the scaling cases chosen on 2026-11-28, predicted before they run) on cores 10–15;
- ``issue24`` (the visits of 2026-11-26 and 27): ``gpu-tests`` and :mod:`device_figures`' ``precision``,
  ``gpu-vs-cpu``, ``prunetrain`` and ``adaptive-batch`` on the first two cores; beside them ``scaling``
  (:mod:`device_scaling`) on the other 14;
- ``all``: both (the dry run's default: it would not fit 450 s on the GPU machine).

Every visit starts with ``machine`` (the GPU's name, driver, torch and CUDA versions, the CPU and its cores).
The CPU parts are split from the GPU parts' cores only where there are at least 16; otherwise all share them.

Everything goes under ``--out``, at most eight files: ``figures.json`` and ``report.md`` (rewritten after every
part; the report says what was run and what each figure is), ``gpu-tests.txt`` (pytest's ``-rA`` output),
``suite.log`` (every part's output) and up to four PNGs drawn at the end. Runs and scratch files stay in a
folder outside it.

``--dry-run`` runs every part of every visit on this CPU at tiny sizes with synthetic data (CI runs it; about
3 minutes on 2 cores), so the suite cannot rot between visits to the GPU machine.

Run: ``bash scripts/device-suite.sh [--dry-run] [--visit issue50|issue24|all]`` (``OUT`` names the folder).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import device_report

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"
TAIL = 3000  # characters of a failed part's output kept in the JSON
LOG_LIMIT = 200_000  # characters of one part's output copied into suite.log
GPU_CORES, MIN_CORES_TO_SPLIT = 2, 16
FIGURES = ("precision", "gpu-vs-cpu", "prunetrain", "adaptive-batch")


@dataclass(frozen=True)
class Lane:
    """CPU parts run one after another on their own cores (``cores``: how many; ``None``: all that are left)."""

    parts: tuple[str, ...]
    cores: int | None = None


@dataclass(frozen=True)
class Visit:
    """The GPU parts, one after another on the first cores, and the CPU lanes that run beside them."""

    gpu: tuple[str, ...]
    lanes: tuple[Lane, ...]


VISITS = {
    "issue50": Visit(gpu=("gpu-tests", "mixed-precision"), lanes=(Lane(("slow-link",), 8), Lane(("holdout",)))),
    "issue24": Visit(gpu=("gpu-tests", *FIGURES), lanes=(Lane(("scaling",)),)),
    "all": Visit(gpu=("gpu-tests", "mixed-precision", *FIGURES),
                 lanes=(Lane(("slow-link",), 8), Lane(("scaling", "holdout")))),
}  # fmt: skip
CPU_SCRIPTS = {"scaling": "device_scaling.py", "holdout": "device_holdout.py", "slow-link": "device_slowlink.py"}
#: the parts that take ``--seconds`` and end themselves before it with what they measured
SELF_TIMED = ("mixed-precision", *CPU_SCRIPTS)


@dataclass(frozen=True)
class Budget:
    """Seconds per part, and for the whole suite (it stops starting parts that would end after it)."""

    suite: float
    machine: float
    parts: dict[str, float]


DEVICE = Budget(
    suite=450, machine=60,
    parts={"gpu-tests": 100, "mixed-precision": 320, "slow-link": 420, "holdout": 420, "scaling": 430,
           "precision": 60, "gpu-vs-cpu": 45, "prunetrain": 100, "adaptive-batch": 120},
)  # fmt: skip
DRY = Budget(
    suite=230, machine=30,
    parts={"gpu-tests": 60, "mixed-precision": 150, "slow-link": 200, "holdout": 60, "scaling": 150,
           "precision": 40, "gpu-vs-cpu": 30, "prunetrain": 45, "adaptive-batch": 50},
)  # fmt: skip

MACHINE_SCRIPT = """
import json, os, platform, subprocess, sys
import torch
from scaletrain.measure.machine import machine_info
info = {**machine_info(), "python": sys.version.split()[0], "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda, "affinity_cores": len(os.sched_getaffinity(0))}
if torch.cuda.is_available():
    properties = torch.cuda.get_device_properties(0)
    info.update(gpu=torch.cuda.get_device_name(0), gpu_memory_bytes=properties.total_memory,
                gpu_multiprocessors=properties.multi_processor_count,
                gpu_capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        info["driver"] = subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["driver"] = f"not read: {exc}"
print(json.dumps(info))
"""


class Suite:
    """The figures JSON, the report and the log, written as parts finish."""

    def __init__(self, out: Path, work: Path, dry_run: bool, budget: Budget) -> None:
        self.out, self.work, self.budget = out, work, budget
        self.began = time.time()
        self.figures: dict[str, Any] = {
            "suite": {"dry_run": dry_run, "started_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "budget": vars(budget)},
            "parts": {},
        }
        self.log = (out / "suite.log").open("a", encoding="utf-8")
        self.lock = threading.RLock()  # the lanes record from their own threads

    def say(self, line: str) -> None:
        stamped = f"[{time.time() - self.began:6.1f} s] {line}"
        with self.lock:
            print(stamped, flush=True)
            self.log.write(stamped + "\n")
            self.log.flush()

    def left(self) -> float:
        return self.budget.suite - (time.time() - self.began)

    def record(self, name: str, entry: dict[str, Any]) -> None:
        with self.lock:
            self.figures["parts"][name] = entry
            self.save()

    def save(self, pictures: list[str] | None = None) -> None:
        with self.lock:
            self.figures["suite"]["seconds"] = time.time() - self.began
            partial = self.out / "figures.json.partial"
            partial.write_text(json.dumps(self.figures, indent=1, default=str), encoding="utf-8")
            partial.replace(self.out / "figures.json")
            report = device_report.markdown(self.figures, pictures or [])
            (self.out / "report.md").write_text(report, encoding="utf-8")


class Part:
    """One part running in its own session under ``timeout``, its output in a file."""

    def __init__(self, suite: Suite, name: str, command: list[str], seconds: float, cores: set[int] | None) -> None:
        self.suite, self.name, self.seconds = suite, name, seconds
        self.output = suite.work / f"{name}.log"
        self.began = time.time()
        suite.say(f"{name}: started, {seconds:.0f} s at most" + (f", cores {sorted(cores)}" if cores else ""))
        with self.output.open("w", encoding="utf-8") as sink:
            self.process = subprocess.Popen(
                ["timeout", "-k", "5", f"{seconds:.0f}", *command],
                cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
            )  # fmt: skip

    def finish(self, result_path: Path | None = None) -> dict[str, Any]:
        code = self.process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)  # what the part left in its session (worker processes)
        text = self.output.read_text(encoding="utf-8", errors="replace")
        with self.suite.lock:
            self.suite.log.write(
                f"----- {self.name} output -----\n{text[-LOG_LIMIT:]}\n----- end of {self.name} -----\n"
            )
        status = "ok" if code == 0 else ("overran its budget" if code in (124, 137) else f"failed (exit {code})")
        entry: dict[str, Any] = {"status": status, "seconds": time.time() - self.began, "budget_seconds": self.seconds}
        if code != 0:
            entry["error_tail"] = text[-TAIL:]
        if result_path is not None and result_path.exists():
            try:
                entry["result"] = json.loads(result_path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                entry["result_error"] = f"unreadable result: {exc}"
        self.suite.say(f"{self.name}: {status} after {entry['seconds']:.0f} s")
        return entry


def junit_summary(path: Path, output: Path) -> dict[str, list[str]]:
    """The tests by outcome, from pytest's JUnit XML; from its verbose lines when it was stopped before
    writing the XML (a test still running then is listed as failed)."""
    outcome: dict[str, list[str]] = {"passed": [], "failed": [], "skipped": []}
    if not path.exists():
        kinds = {"PASSED": "passed", "FAILED": "failed", "ERROR": "failed", "SKIPPED": "skipped"}
        for line in output.read_text(encoding="utf-8", errors="replace").splitlines():
            found = re.match(r"(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", line)
            if found:
                outcome[kinds[found[2]]].append(found[1].split("/")[-1].replace(".py", ""))
            elif re.match(r"tests/\S+::\S+ *$", line.strip()):
                outcome["failed"].append(line.strip().split("/")[-1].replace(".py", "") + " (stopped at the limit)")
        return outcome
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}".rsplit(".", 1)[-1]
        kinds = {child.tag for child in case}
        kind = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
        outcome[kind].append(name)
    return outcome


def prepare_data(args: argparse.Namespace, work: Path) -> Path:
    """The data folder the parts read (``fashion-mnist/``, ``ptb/``): the given one, or tiny synthetic
    files in the real formats for a dry run."""
    if not args.dry_run:
        return args.data_dir.resolve()
    import numpy as np

    from scaletrain.data.synthetic import write_synthetic_fashion_mnist

    folder = work / "data"
    write_synthetic_fashion_mnist(folder / "fashion-mnist", train=512, test=64)
    (folder / "ptb").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(1)
    words = [f"w{i}" for i in range(40)] + ["<unk>", "N"]
    for split, lines in (("valid", 200), ("test", 40)):  # Mikolov's format: words and a newline per sentence
        sentences = (" " + " ".join(rng.choice(words, size=int(rng.integers(3, 12)))) + " \n" for _ in range(lines))
        (folder / "ptb" / f"ptb.{split}.txt").write_text("".join(sentences), encoding="utf-8")
    return folder


def core_split(visit: Visit) -> tuple[set[int] | None, list[set[int] | None]]:
    """(the GPU parts' cores, each lane's cores): apart when there are enough, shared otherwise."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < MIN_CORES_TO_SPLIT:
        return None, [None] * len(visit.lanes)
    lanes, first = [], GPU_CORES
    for lane in visit.lanes:
        last = len(cores) if lane.cores is None else min(len(cores), first + lane.cores)
        lanes.append(set(cores[first:last]))
        first = last
    return set(cores[:GPU_CORES]), lanes


def commands(args: argparse.Namespace, python: str, work: Path, data: Path) -> dict[str, tuple[list[str], Path | None]]:
    """Each part's command (its budget's ``--seconds`` added when it starts) and the JSON it writes."""
    dry = ["--dry-run"] if args.dry_run else []
    tests = [python, "-m", "pytest", "-m", "gpu", "tests/gpu", "-v", "-rA", "-p", "no:cacheprovider"]
    table: dict[str, tuple[list[str], Path | None]] = {
        "gpu-tests": ([*tests, "--junitxml", str(work / "junit.xml")], None)
    }
    for name in FIGURES:
        result = work / f"{name}.json"
        command = [python, str(BENCHMARKS / "device_figures.py"), name, "--json", str(result)]
        table[name] = ([*command, "--data-dir", str(data), "--work", str(work / name), *dry], result)
    result = work / "mixed-precision.json"
    table["mixed-precision"] = (
        [python, str(BENCHMARKS / "device_precision.py"), "--json", str(result), "--data-dir", str(data), *dry],
        result,
    )
    for name, script in CPU_SCRIPTS.items():
        result = work / f"{name}.json"
        command = [python, str(BENCHMARKS / script), "--json", str(result), "--work", str(work / name)]
        table[name] = ([*command, "--data-dir", str(data), *dry], result)
    return table


def run_part(suite: Suite, name: str, command: list[str], result: Path | None, cores: set[int] | None,
             args: argparse.Namespace, work: Path) -> None:  # fmt: skip
    """One part within its budget and the suite's time; its entry recorded."""
    seconds = min(suite.budget.parts[name], suite.left() - 5)
    if seconds < 10:
        suite.record(name, {"status": "not started: the suite's time was spent", "seconds": 0})
        return
    if name in SELF_TIMED:  # the part ends itself before its budget, with what it measured
        command = [*command, "--seconds", f"{seconds - 10:.0f}"]
    part = Part(suite, name, command, seconds, cores)
    entry = part.finish(result)
    if name == "gpu-tests":
        shutil.copyfile(part.output, args.out / "gpu-tests.txt")
        entry["result"] = junit_summary(work / "junit.xml", part.output)
    suite.record(name, entry)


def run(args: argparse.Namespace) -> int:
    budget = DRY if args.dry_run else DEVICE
    if args.seconds is not None:  # a shorter visit: every part's budget within the suite's
        parts = {name: min(seconds, args.seconds - 20) for name, seconds in budget.parts.items()}
        budget = Budget(suite=args.seconds, machine=budget.machine, parts=parts)
    visit_name = args.visit or ("all" if args.dry_run else "issue50")
    visit = VISITS[visit_name]
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="device-suite-", dir=args.work))
    suite = Suite(args.out, work, args.dry_run, budget)
    suite.figures["suite"].update(visit=visit_name, command=" ".join(["device_suite.py", *sys.argv[1:]]),
                                  commit=commit_of())  # fmt: skip
    python = sys.executable
    suite.say(f"{'dry run' if args.dry_run else 'GPU machine'}, visit {visit_name}: out {args.out}, scratch {work}")
    data = prepare_data(args, work)
    gpu_cores, lane_cores = core_split(visit)
    wanted = set(args.parts.split(",")) if args.parts else None

    machine = Part(suite, "machine", [python, "-c", MACHINE_SCRIPT], budget.machine, None)
    entry = machine.finish()
    text = machine.output.read_text(encoding="utf-8").strip().splitlines()
    if entry["status"] == "ok" and text:
        entry["result"] = json.loads(text[-1])
    lanes = {
        " then ".join(lane.parts): sorted(cores or []) for lane, cores in zip(visit.lanes, lane_cores, strict=True)
    }
    entry["result"] = {**entry.get("result", {}), "gpu_cores": sorted(gpu_cores or []), "lanes": lanes}
    suite.record("machine", entry)

    table = commands(args, python, work, data)

    def lane(parts: tuple[str, ...], cores: set[int] | None) -> None:
        for name in parts:
            if wanted is None or name in wanted:
                run_part(suite, name, *table[name], cores, args, work)

    threads = [
        threading.Thread(target=lane, args=(chosen.parts, cores), name=f"lane {'+'.join(chosen.parts)}")
        for chosen, cores in zip(visit.lanes, lane_cores, strict=True)
    ]
    for thread in threads:
        thread.start()
    lane(visit.gpu, gpu_cores)
    for thread in threads:
        thread.join()

    pictures: list[str] = []
    try:
        pictures = device_report.pictures(suite.figures, args.out)
    except Exception as exc:  # the report without pictures is still the report
        suite.say(f"pictures failed: {type(exc).__name__}: {exc}")
    suite.figures["suite"]["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    suite.save(pictures)
    suite.say(f"done in {time.time() - suite.began:.0f} s; {', '.join(sorted(p.name for p in args.out.iterdir()))}")
    suite.log.close()
    if not args.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def commit_of() -> str:
    """The working tree's commit where git can say it (the GPU machine's copy may have no ``.git``)."""
    try:
        found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                               text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return found.stdout.strip() or "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="where the (at most eight) files go")
    parser.add_argument("--data-dir", type=Path, default=REPO / ".device-data", help="fashion-mnist/ and ptb/")
    parser.add_argument("--work", type=Path, help="where the scratch folder is made (default: the system's)")
    parser.add_argument("--keep-work", action="store_true", help="keep the runs and scratch files")
    parser.add_argument("--dry-run", action="store_true", help="every part on this CPU at tiny sizes")
    parser.add_argument(
        "--visit", choices=sorted(VISITS), help="which parts (default: issue50 on a GPU, all in a dry run)"
    )
    parser.add_argument(
        "--parts", help="only these parts of the visit, comma-separated (" + ", ".join(DEVICE.parts) + ")"
    )
    parser.add_argument("--seconds", type=float, help="the whole suite's budget (default: 450 on a GPU, 230 dry)")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
