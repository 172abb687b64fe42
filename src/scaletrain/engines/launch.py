"""Run a foreign engine: its processes started here, watched like scaletrain's own, its figures as a summary.

Every process of the layout (:meth:`Engine.roles <scaletrain.engines.base.Engine.roles>`) is started with
its engine's python on the program, told of the others by its engine's variables, on loopback or on an
emulated network (one host each). The run fails in one line naming the process when one dies, exits with
an error, stays frozen for ``timeout`` seconds, or trains but makes no progress: its heartbeat
(``progress-<role>-<index>``, the contract in :mod:`scaletrain.engines`) unchanged for ``timeout`` seconds,
or none written within ``start_timeout`` of its start (start-up, imports and the first step); the other
processes are stopped. When every process that ends by itself has ended, the servers that serve until
stopped are stopped. What the trainers wrote
(:mod:`scaletrain.engines` states it) becomes ``summary.json`` with scaletrain's meter
(:func:`scaletrain.train.summary.throughput`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from scaletrain.engines.base import Engine, Host, Role, program_path
from scaletrain.engines.install import engine_named, installed, python_of, require
from scaletrain.engines.prepare import EngineRun, prepare
from scaletrain.errors import ConfigError, Interrupted, ScaletrainError
from scaletrain.netem.network import EmulatedNetwork, parse_rate
from scaletrain.parallel.launch import stop_processes
from scaletrain.parallel.ports import free_port
from scaletrain.parallel.preloaded import die_with_parent
from scaletrain.processes import is_stopped
from scaletrain.train.summary import SUMMARY_NAME, THROUGHPUT_NOTE, WorkerStats, throughput

__all__ = ["EngineFailed", "check_engine", "check_layout", "check_run", "known_engine", "run_engine"]

POLL_SECONDS = 0.2
CAUSE_SETTLE_SECONDS = 0.5  # after a failure, how long the others get to show whether they caused it
FROZEN = "stopped answering (it is frozen: state T, e.g. after SIGSTOP)"  # how a frozen process is reported
LOGS = "logs"
ENGINE_FOLDER = "engine"
SPLIT = ("compute", "communication", "wait", "data")  # a step's parts as the meter reports them
START_SECONDS = 120.0  # the least time a process that trains has for start-up, imports and its first step
PROGRESS = "progress"  # the heartbeat's file name: progress-<role>-<index>
WAITING, DONE = "exchange", "done"  # the heartbeat's phases of a process that waits for the others


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
    started: float = field(default_factory=time.monotonic)
    beat: str = ""  # its heartbeat's last content seen ("" before the first): "<phase> <count>"
    beat_at: float | None = None  # when that content was first seen

    @property
    def phase(self) -> str:
        return self.beat.split(" ")[0]

    def quiet(self, clock: float) -> float:
        """Seconds since its heartbeat last changed, or since it started when it has none yet."""
        return clock - (self.started if self.beat_at is None else self.beat_at)


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
    start_timeout: float | None = None,
) -> dict[str, Any]:
    """Train ``run`` with its engine into ``out``; the summary (also written to ``out/summary.json``).
    ``start_timeout``: how long a process that trains may take to its first step (default: ``timeout``, at
    least :data:`START_SECONDS`)."""
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
            _watch(engine, processes, timeout, progress=Path(spec["out"]), start_timeout=start_timeout)
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


def _watch(
    engine: Engine,
    processes: list[_Process],
    timeout: float,
    *,
    progress: Path | None = None,
    start_timeout: float | None = None,
) -> None:
    """Return once every process that ends by itself has ended well (the others then stopped); raise
    :class:`EngineFailed` naming the first process that failed or stayed frozen for ``timeout`` seconds, or,
    given the folder of the heartbeats ``progress``, a process that trains and made no progress
    (:func:`_check_progress`)."""
    start = start_timeout if start_timeout is not None else max(timeout, START_SECONDS)
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
        if progress is not None:
            _check_progress(engine, processes, progress, timeout, start, clock)
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


def _check_progress(
    engine: Engine, processes: list[_Process], folder: Path, timeout: float, start: float, clock: float
) -> None:
    """Fail naming a running process that trains whose heartbeat has not changed for ``timeout`` seconds (or
    that wrote none within ``start`` seconds of its start), and so hangs though it is neither frozen nor
    ended. Of several, one that is not waiting for the others comes first: a peer stuck in its own work
    leaves the rest waiting in the exchange. Nothing is judged while a process is frozen (that one is named
    once frozen for ``timeout``). Processes whose heartbeat says ``done`` wait for the others; they fail only
    when no process that trains has moved for ``timeout`` seconds."""
    running = [p for p in processes if p.popen.poll() is None]
    if any(p.stopped_since is not None for p in running):
        return
    watched = [p for p in running if p.role.trains]
    for process in watched:
        try:
            beat = (folder / f"{PROGRESS}-{process.role.name}-{process.role.index}").read_text(encoding="utf-8")
        except OSError:
            continue
        if beat.strip() and beat.strip() != process.beat:
            process.beat, process.beat_at = beat.strip(), clock
    overdue = [p for p in watched if p.phase != DONE and p.quiet(clock) > (timeout if p.beat else start)]
    if overdue:
        cause = min(overdue, key=lambda p: (p.phase == WAITING, -p.quiet(clock)))
        stuck = [p for p in watched if p.phase not in (WAITING, DONE) and p.quiet(clock) > timeout / 2]
        if cause.phase != WAITING or not stuck:  # else that peer will be named once its own bound has passed
            _fail(engine, processes, cause, _stalled(cause, clock, timeout, start))
    last = min(p.quiet(clock) for p in processes if p.role.trains) if watched else 0.0  # since any one moved
    if watched and all(p.phase == DONE for p in watched) and last > timeout:
        how = f"finished its steps but did not end within {timeout:.0f} s of the last progress (--timeout)"
        _fail(engine, processes, watched[0], how)


def _stalled(process: _Process, clock: float, timeout: float, start: float) -> str:
    """How a process that made no progress is reported, from what its heartbeat last said."""
    quiet = process.quiet(clock)
    if not process.beat:
        return f"did not finish its first step within {quiet:.0f} s of starting (at most {start:.0f} s): it hangs"
    phase, _, count = process.beat.partition(" ")
    where = {
        "train": f"after step {count}",
        WAITING: f"waiting for the others in the exchange after step {count}",
        "evaluate": f"while scoring the test set (batch {count})",
    }.get(phase, f"(its heartbeat says {process.beat!r})")
    verdict = ": it or a peer hangs" if phase == WAITING else ": it hangs"
    return f"made no progress for {quiet:.0f} s {where} (--timeout {timeout:.0f} s){verdict}"


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
    schedule = spec.get("schedule")  # gpt's: AdamW at a scheduled rate (the others: SGD at a constant one)
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
        **(
            {"optimizer": "AdamW", "lr_schedule": schedule["kind"], "lr_warmup": schedule["warmup"]} if schedule else {}
        ),
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
