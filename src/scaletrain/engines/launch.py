"""Run a foreign engine: its processes started here, watched like scaletrain's own, its figures as a summary.

Every process of the layout (:meth:`Engine.roles <scaletrain.engines.base.Engine.roles>`) is started with
its engine's python on the program, told of the others by its engine's variables, on loopback or on an
emulated network (one host each). The run fails in one line naming the process when one dies, exits with
an error, or stays frozen for ``timeout`` seconds; the other processes are stopped. When every process
that ends by itself has ended, the servers that serve until stopped are stopped. What the trainers wrote
(:mod:`scaletrain.engines` states it) becomes ``summary.json`` with scaletrain's meter
(:func:`scaletrain.train.summary.throughput`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from scaletrain.engines.base import Engine, Host, Role, program_path
from scaletrain.engines.install import engine_named, installed, python_of, require
from scaletrain.engines.prepare import EngineRun, prepare
from scaletrain.errors import ConfigError, Interrupted, ScaletrainError
from scaletrain.netem.network import EmulatedNetwork, parse_rate
from scaletrain.parallel.launch import free_port, is_stopped, stop_processes
from scaletrain.parallel.preloaded import die_with_parent
from scaletrain.train.summary import SUMMARY_NAME, THROUGHPUT_NOTE, WorkerStats, throughput

__all__ = ["EngineFailed", "check_engine", "check_layout", "check_run", "known_engine", "run_engine"]

POLL_SECONDS = 0.2
CAUSE_SETTLE_SECONDS = 0.5  # after a failure, how long the others get to show whether they caused it
FROZEN = "stopped answering (it is frozen: state T, e.g. after SIGSTOP)"  # how a frozen process is reported
LOGS = "logs"
ENGINE_FOLDER = "engine"
SPLIT = ("compute", "communication", "wait", "data")  # a step's parts as the meter reports them


class EngineFailed(ScaletrainError):
    """A process of a foreign run failed; every other one has been stopped."""

    exit_code = 1


@dataclass
class _Process:
    role: Role
    popen: subprocess.Popen
    log: Path
    log_file: IO[bytes]
    stopped_since: float | None = None


def known_engine(framework: str, workload: str) -> Engine:
    """The engine called ``framework`` when it trains ``workload`` (else one line); installed or not."""
    engine = engine_named(framework)
    if workload not in engine.workloads:
        raise ConfigError(
            f"the {engine.name} engine has no workload {workload!r}: it trains {', '.join(engine.workloads)}"
        )
    return engine


def check_engine(framework: str, workload: str) -> Engine:
    """The engine called ``framework``, once it is installed and trains ``workload`` (else one line)."""
    engine = known_engine(framework, workload)
    require(engine)
    return engine


def check_layout(run: EngineRun) -> Engine:
    """The engine of ``run`` when it runs the workload in the run's mode (else one line); installed or not,
    so that manifests for a cluster can be checked on a machine without the engine."""
    engine = known_engine(run.framework, run.workload)
    if run.mode not in [mode for mode, _ in engine.modes]:
        raise ConfigError(f"the {engine.name} engine runs {engine.describe_modes()}, not {run.mode!r}")
    limited = dict(engine.workload_modes).get(run.workload)
    if limited is not None and run.mode not in limited:
        raise ConfigError(
            f"the {engine.name} engine trains {run.workload} in {' and '.join(limited)} mode, not {run.mode}"
        )
    return engine


def check_run(run: EngineRun) -> Engine:
    """The engine of ``run``, once it runs the workload and mode and is installed (else one line)."""
    engine = check_layout(run)
    require(engine)
    return engine


def run_engine(
    run: EngineRun,
    out: Path,
    *,
    network: str | None = None,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Train ``run`` with its engine into ``out``; the summary (also written to ``out/summary.json``)."""
    engine = check_run(run)
    python = python_of(engine)
    began = time.time()
    for stale in (out / ENGINE_FOLDER).glob("*"):  # what an earlier attempt in this folder left is not this run's
        if stale.is_file():
            stale.unlink()
    spec = prepare(run, out / ENGINE_FOLDER)
    roles = engine.roles(run.mode, run.workers, run.servers)
    (out / LOGS).mkdir(parents=True, exist_ok=True)
    (out / SUMMARY_NAME).unlink(missing_ok=True)
    processes: list[_Process] = []
    with contextlib.ExitStack() as stack:
        emulated = None
        if network is not None and len(roles) > 1:
            emulated = stack.enter_context(EmulatedNetwork(len(roles), parse_rate(network)))
        hosts = [_host(emulated, k) for k in range(len(roles))]
        try:
            for k, role in enumerate(roles):
                processes.append(_start(engine, python, spec, role, roles, hosts, k, emulated, out))
            _watch(engine, processes, timeout)
        except KeyboardInterrupt:
            stop_processes([p.popen for p in processes])
            raise Interrupted("interrupted; every process of the foreign run was stopped") from None
        except BaseException:
            stop_processes([p.popen for p in processes])
            raise
        finally:
            for process in processes:
                process.log_file.close()
    return _summarise(engine, run, spec, out, began, network)


def _host(emulated: EmulatedNetwork | None, k: int) -> Host:
    """Where process ``k`` listens: its own emulated host, or loopback (a free port either way)."""
    if emulated is None:
        return Host("127.0.0.1", free_port(), "lo")
    return Host(emulated.address(k), free_port(), emulated.interface(k))


def _start(
    engine: Engine,
    python: Path,
    spec: dict[str, Any],
    role: Role,
    roles: list[Role],
    hosts: list[Host],
    k: int,
    emulated: EmulatedNetwork | None,
    out: Path,
) -> _Process:
    log = out / LOGS / f"{role.name}-{role.index}.log"
    log_file = log.open("wb")
    environment = {
        **{key: value for key, value in os.environ.items() if key != "PYTHONPATH"},  # nothing of scaletrain's
        **engine.environment(role, roles, hosts),
        **(emulated.environment(k) if emulated else {}),
    }
    command = [str(python), str(program_path(engine)), "--spec", str(Path(spec["out"]) / "spec.json")]
    command += ["--role", role.name, "--index", str(role.index)]
    prefix = emulated.command_prefix(k) if emulated else []
    popen = subprocess.Popen(
        [*prefix, *command], env=environment, stdout=log_file, stderr=log_file, preexec_fn=die_with_parent
    )
    return _Process(role, popen, log, log_file)


def _watch(engine: Engine, processes: list[_Process], timeout: float) -> None:
    """Return once every process that ends by itself has ended well (the others then stopped); raise
    :class:`EngineFailed` naming the first process that failed or stayed frozen for ``timeout`` seconds."""
    finished_at: float | None = None
    while True:
        clock = time.monotonic()
        for process in processes:
            code = process.popen.poll()
            if code is None:
                frozen = is_stopped(process.popen.pid)
                process.stopped_since = (process.stopped_since or clock) if frozen else None
                if process.stopped_since is not None and clock - process.stopped_since > timeout:
                    _fail(engine, processes, process, FROZEN)
            elif code != 0:
                _fail(engine, processes, *_cause(processes, process))
        ending = [p for p in processes if p.role.ends_itself]
        if all(p.popen.poll() == 0 for p in ending):
            stop_processes([p.popen for p in processes if p.popen.poll() is None])
            return
        if any(p.popen.poll() == 0 for p in ending):  # some ended: the rest must follow within the timeout
            finished_at = finished_at or clock
            if clock - finished_at > timeout:
                waiting = next(p for p in ending if p.popen.poll() is None)
                _fail(engine, processes, waiting, f"did not end within {timeout:.0f} s of the others (--timeout)")
        time.sleep(POLL_SECONDS)


def _cause(processes: list[_Process], failed: _Process) -> tuple[_Process, str]:
    """The process that failed first, not one that failed because it lost its peer: once the others have had
    a moment to fail too, a frozen one, then one killed by a signal, else ``failed``."""
    time.sleep(CAUSE_SETTLE_SECONDS)
    for process in processes:
        if process.popen.poll() is None and is_stopped(process.popen.pid):
            return process, FROZEN
    for process in processes:
        code = process.popen.poll()
        if code is not None and code < 0:
            return process, f"was killed by signal {-code}"
    return failed, f"exited with code {failed.popen.poll()}"


def _fail(engine: Engine, processes: list[_Process], cause: _Process, how: str) -> None:
    stop_processes([p.popen for p in processes])
    said = _last_words(engine, cause.log)
    tail = f": {said}" if said else ""
    raise EngineFailed(
        f"{engine.name} {cause.role.label} (pid {cause.popen.pid}) {how}{tail}; stopped the other processes. "
        f"Logs in {cause.log.parent}"
    )


def _last_words(engine: Engine, log: Path) -> str:
    """The last line a process wrote that is not its framework's start-up noise."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    said = [line for line in lines if not engine.is_noise(line)]
    return said[-1][:300] if said else ""


def _summarise(
    engine: Engine, run: EngineRun, spec: dict[str, Any], out: Path, began: float, network: str | None
) -> dict[str, Any]:
    folder = Path(spec["out"])
    stats = []
    for path in sorted(folder.glob("stats-*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        fields = {name: record.get(name) for name in WorkerStats.__dataclass_fields__ if name in record}
        stats.append(WorkerStats(**fields))
    if not stats:
        raise EngineFailed(f"the {engine.name} run ended without writing its measurements (stats-*.json in {folder})")
    try:
        quality = json.loads((folder / "quality.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EngineFailed(f"the {engine.name} run ended without a readable quality.json in {folder}: {exc}") from None
    summary = {
        "workload": run.workload,
        "framework": engine.name,
        "engine_version": (installed(engine) or {}).get("version"),
        "mode": run.mode,
        "workers": run.workers,
        "servers": sum(role.name in ("ps", "server") for role in engine.roles(run.mode, run.workers, run.servers)),
        "batch_size": run.batch_size,
        "lr": run.lr,
        "momentum": run.momentum,
        "weight_decay": run.weight_decay,
        "seed": run.seed,
        "network": network,
        # updates applied: one per global batch; an asynchronous run applies every worker's batches
        "steps": sum(spec["steps"]) if run.mode == "async" else spec["steps"][0],
        "worker_steps": spec["steps"],
        "steps_per_epoch": spec["steps_per_epoch"],
        "epochs": run.epochs,
        "warmup_steps": run.warmup_steps,
        "clip_norm": run.clip_norm,
        "options": run.options,
        "metric": spec["metric"],
        **quality,
        **throughput(stats, run.batch_size),
        **({f"{part}_seconds_per_step": None for part in SPLIT} if run.mode in engine.unsplit else {}),
        "throughput_note": THROUGHPUT_NOTE,
        "per_worker": [vars(s) for s in stats],
        "wall_seconds": time.time() - began,
    }
    (out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary
