"""Starting the processes of a run on this machine, watching them, and never leaving one behind.

``--workers N`` starts N worker processes (plus the server for ``ps central``) on 127.0.0.1 with
a free port, each with the torchrun variables set, so a process cannot tell this launcher from
torchrun. The launcher watches them: in a synchronous run the first process that fails stops
every other one at once and the run fails with one message naming it; in an asynchronous run a
lost worker is left to the server, which finishes with the others. A process that stops
answering without dying (``SIGSTOP``, a frozen machine) is found the same way: its peers' waits
time out, and the launcher names it from its state (``T`` in ``/proc/PID/stat``) and stops it once it
has been frozen for the run's ``--timeout``. Children die with the launcher
(``PR_SET_PDEATHSIG``), and Ctrl-C stops them all. Messages from the processes go to their logs
(``OUT/logs/rank-K.log``, tracebacks included); the terminal gets rank 0's progress and one line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from scaletrain.config import TrainConfig, to_json_dict
from scaletrain.errors import ConfigError, Interrupted, ScaletrainError
from scaletrain.netem.network import EmulatedNetwork, parse_rate
from scaletrain.parallel.failures import DROPPED_EXIT_CODE
from scaletrain.parallel.handover import remove_handover, send_workload
from scaletrain.parallel.ports import free_port
from scaletrain.parallel.preloaded import PreloadedProcess, child_search_path, die_with_parent, start_module
from scaletrain.parallel.process import ADDRESS_NAME, joined_workers, write_address
from scaletrain.parallel.rendezvous import (
    ENV_LOCAL_RANK,
    ENV_LOCAL_WORLD_SIZE,
    ENV_MASTER_ADDR,
    ENV_MASTER_PORT,
    ENV_RANK,
    ENV_WORLD_SIZE,
)
from scaletrain.parallel.strategies import SERVER, Layout
from scaletrain.processes import is_stopped
from scaletrain.train.checkpoint import make_folder, refuse_overwrite, resume_advice
from scaletrain.train.summary import SUMMARY_NAME
from scaletrain.workloads import Workload

__all__ = ["ENV_LAUNCHER", "Process", "RunFailed", "launch_local", "spawn_rank", "stop_processes"]

POLL_SECONDS = 0.05
GRACE_SECONDS = 5.0
CAUSE_SETTLE_SECONDS = 0.3
#: An elastic run's frozen worker is killed this long after ``--timeout``: its peers' waits time out first,
#: so they name it as having stopped answering rather than died.
FROZEN_GRACE_SECONDS = 3.0
_TERMINAL = {"line_open": False}  # whether rank 0's stderr, as copied here, ended mid-line (see _tee)
LOGS_DIR = "logs"
#: Set for the processes this launcher starts: they report errors in their logs, the launcher on the terminal.
ENV_LAUNCHER = "SCALETRAIN_LAUNCHER"
#: A process the launcher started: a fork of the preloaded server, or ``python -m`` in a process of its own.
Process = subprocess.Popen | PreloadedProcess


class RunFailed(ScaletrainError):
    """A process of the run failed; every other one has been stopped."""

    exit_code = 1


@dataclass
class _Child:
    rank: int
    role: str
    process: Process
    log: Path
    log_file: IO[bytes]
    failed_at: float | None = None  # when the launcher first saw it fail
    stopped_since: float | None = None  # when the launcher first saw it frozen (state T)
    finished_at: float | None = None  # when the launcher first saw it exit successfully


def launch_local(config: TrainConfig, layout: Layout, workload: Workload | None = None) -> dict[str, Any]:
    """Run ``config`` with ``layout.world_size`` local processes; return rank 0's summary.

    ``workload``: an object the processes train instead of making ``config.workload``; it reaches them
    pickled, its tensors shared (:mod:`scaletrain.parallel.handover`).
    """
    out = config.out
    refuse_overwrite(out, resume=config.resume)
    made = not out.exists()
    make_folder(out)
    handover = _hand_over(workload, out, remove_folder=made) if workload is not None else None
    (out / SUMMARY_NAME).unlink(missing_ok=True)
    config_path = out / "launch-config.json"
    config_path.write_text(json.dumps(to_json_dict(config), indent=2), encoding="utf-8")
    port = free_port()
    children: list[_Child] = []
    with contextlib.ExitStack() as stack:
        if handover is not None:
            stack.callback(remove_handover, out)  # last, once every process has ended
        network = None
        if config.network is not None:
            network = stack.enter_context(EmulatedNetwork(layout.world_size, parse_rate(config.network)))
        try:
            if config.min_workers is not None:  # where workers started later (--join) find the run
                write_address(out, network.address(0) if network else "127.0.0.1", port)
                stack.callback((out / ADDRESS_NAME).unlink, missing_ok=True)
            for rank in range(layout.world_size):
                children.append(_start(rank, layout, [config_path, *filter(None, [handover])], port, out, network))
            _watch(children, layout, config.timeout, config.min_workers)
        except KeyboardInterrupt:
            _stop(children)
            raise Interrupted(f"interrupted; every process of the run was stopped; {resume_advice(out)}") from None
        except RunFailed:
            _stop(children)
            # A server that outlives lost workers finishes when none is left, even when they stopped with an
            # error of their own (every worker's loss diverged): the run failed, and no summary says otherwise.
            (out / SUMMARY_NAME).unlink(missing_ok=True)
            raise
        except BaseException:
            _stop(children)
            raise
        finally:
            for child in children:
                child.log_file.close()
    return json.loads((out / SUMMARY_NAME).read_text(encoding="utf-8"))


def _hand_over(workload: Workload, out: Path, *, remove_folder: bool) -> Path:
    try:
        return send_workload(workload, out)
    except ConfigError:
        if remove_folder and not any(out.iterdir()):  # nothing started: leave no run folder behind
            out.rmdir()
        raise


def _start(
    rank: int, layout: Layout, files: list[Path], port: int, out: Path, network: EmulatedNetwork | None
) -> _Child:
    logs = out / LOGS_DIR
    logs.mkdir(exist_ok=True)
    log = logs / f"rank-{rank}.log"
    log_file = log.open("wb")
    # Rank 0 reports progress on this terminal (and in its log); the others write to their logs.
    process = spawn_rank(
        rank,
        layout.world_size,
        port,
        ["scaletrain.parallel.worker", *map(str, files)],
        network=network,
        stdout=log_file,
        stderr=subprocess.PIPE if rank == 0 else log_file,
    )
    if rank == 0:
        threading.Thread(target=_tee, args=(process.stderr, log_file), daemon=True).start()
    return _Child(rank, layout.role(rank), process, log, log_file)


def spawn_rank(
    rank: int,
    world_size: int,
    port: int,
    module_args: list[str],
    *,
    network: EmulatedNetwork | None,
    stdout: IO[bytes] | int | None,
    stderr: IO[bytes] | int | None,
) -> Process:
    """Start ``python -m MODULE ARGS`` as ``rank`` of ``world_size`` with the torchrun variables set.

    The process is a fork of a preloaded one where it can be (:mod:`scaletrain.parallel.preloaded`).
    With an emulated network it lives in its own namespace behind a rate-limited link; either way it
    dies with this process.
    """
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding the scaletrain package
    environment = {
        **os.environ,
        ENV_RANK: str(rank),
        ENV_WORLD_SIZE: str(world_size),
        ENV_MASTER_ADDR: network.address(0) if network else "127.0.0.1",
        ENV_MASTER_PORT: str(port),
        ENV_LOCAL_RANK: str(rank),
        ENV_LOCAL_WORLD_SIZE: str(world_size),
        ENV_LAUNCHER: "local",
        # The children import the same scaletrain as this process, installed or not, and what this process's
        # sys.path reaches (a script's sys.path.insert), as multiprocessing's spawn hands its children.
        "PYTHONPATH": os.pathsep.join(child_search_path(package_root)),
        **(network.environment(rank) if network else {}),
    }
    if network is None:
        return start_module(module_args, environment, stdout=stdout, stderr=stderr)
    return subprocess.Popen(
        [*network.command_prefix(rank), sys.executable, "-m", *module_args],
        env=environment,
        stdout=stdout,
        stderr=stderr,
        preexec_fn=die_with_parent,
    )


def _tee(source: IO[bytes], log_file: IO[bytes]) -> None:
    """Copy rank 0's stderr to this terminal and to its log, as it comes (progress bars included)."""
    for chunk in iter(lambda: source.read1(4096), b""):
        _TERMINAL["line_open"] = not chunk.endswith(b"\n")  # rank 0 may stop mid-line (frozen, killed)
        if hasattr(sys.stderr, "buffer"):
            sys.stderr.buffer.write(chunk)
        else:  # a replaced stderr (e.g. under a test runner) takes text
            sys.stderr.write(chunk.decode(errors="replace"))
        sys.stderr.flush()
        with contextlib.suppress(ValueError):  # the log was closed after the run ended
            log_file.write(chunk)
            log_file.flush()


def _watch(children: list[_Child], layout: Layout, timeout: float, min_workers: int | None = None) -> None:
    """Return when every process has finished; raise :class:`RunFailed` when the run cannot go on.

    A synchronous run fails with its first failed process. An elastic all-reduce run (``min_workers``,
    :mod:`scaletrain.parallel.strategies.elastic`) goes on without a worker other than rank 0 that dies, is dropped by
    the survivors, or stays frozen (killed once frozen for ``timeout`` + :data:`FROZEN_GRACE_SECONDS`,
    so that it cannot come back), while at least ``min_workers`` remain. In a run whose server outlives lost
    workers (:meth:`Strategy.outlives_lost_workers <scaletrain.parallel.strategies.Strategy.outlives_lost_workers>`:
    the asynchronous central server) a worker that dies or freezes is lost and the server finishes
    with the others; a worker that stops with an error of its own (exit code 2: bad settings or
    data, a diverged loss) would stop every other worker in the same way, so it fails the run.
    """
    outlives = layout.outlives_lost_workers  # the server finishes without lost workers
    lost: set[int] = set()  # an elastic run's workers that left

    def workers() -> int:  # an elastic run's workers: those started here, and those that joined it (--join)
        return layout.workers + joined_workers(children[0].log.parent.parent, layout.world_size) - len(lost)

    while True:
        running = False
        clock = time.monotonic()
        for child in children:
            code = _observe(child, clock)
            if code is None:
                running = True
                frozen = child.stopped_since is not None
                if frozen and _survivable(child, min_workers, workers()):
                    if clock - child.stopped_since > timeout + FROZEN_GRACE_SECONDS:
                        child.process.kill()  # the survivors went on without it: it must never come back
                    continue
                # A frozen worker of such a run is the server's to count as lost; anyone else fails the run.
                if frozen and clock - child.stopped_since > timeout and not (outlives and child.role != SERVER):
                    _fail(children, elastic=min_workers is not None)
                continue
            lost_worker = outlives and child.role != SERVER and code not in (0, ConfigError.exit_code)
            left = code < 0 or code == DROPPED_EXIT_CODE or child.stopped_since is not None
            if left and (child.rank in lost or _survivable(child, min_workers, workers())):
                lost.add(child.rank)
                continue
            if code != 0 and not lost_worker:
                _fail(children, elastic=min_workers is not None)
        if min_workers is not None and running and _only_frozen_left(children, lost):
            _stop(children)  # the survivors finished the run without the frozen workers
            return
        if outlives and _server_done(children):
            # The server finished without the workers still running: they were lost (it counted them).
            _stop(children)
            return
        if not running:
            return
        time.sleep(POLL_SECONDS)


def _only_frozen_left(children: list[_Child], lost: set[int]) -> bool:
    """Whether every process of the run has finished successfully but for frozen and lost ones."""
    return all(child.process.poll() == 0 or child.stopped_since is not None or child.rank in lost for child in children)


def _survivable(child: _Child, min_workers: int | None, remaining: int) -> bool:
    """Whether an elastic run goes on without ``child`` (``remaining`` workers, it included): never without
    rank 0, which hosts the rendezvous store."""
    return min_workers is not None and child.rank != 0 and remaining - 1 >= min_workers


def _server_done(children: list[_Child]) -> bool:
    """Whether the central server has exited successfully while some workers have not, for a while."""
    server = next((child for child in children if child.role == SERVER), None)
    if server is None or server.process.poll() != 0:
        return False
    server.finished_at = server.finished_at or time.monotonic()
    return time.monotonic() - server.finished_at > GRACE_SECONDS


def _fail(children: list[_Child], *, elastic: bool = False) -> None:
    cause = _first_cause(children)
    stopped = cause.stopped_since is not None
    _stop(children)
    message = _failure_message(cause, cause.process.returncode, stopped=stopped)
    if elastic and cause.rank == 0:
        message += " (--min-workers goes on without a lost worker, but not without rank 0: it hosts the store)"
    if _TERMINAL["line_open"]:  # the one line must start a line of its own
        print(file=sys.stderr, flush=True)
    error = RunFailed(message)
    if cause.process.returncode == ConfigError.exit_code:
        error.exit_code = ConfigError.exit_code  # the process refused the settings: bad input, as in one process
    raise error


def _observe(child: _Child, clock: float) -> int | None:
    """Poll ``child``; note when it was first seen frozen or failed. Returns its exit code, None while it runs."""
    code = child.process.poll()
    if code is None:
        child.stopped_since = (child.stopped_since or clock) if is_stopped(child.process.pid) else None
    elif code != 0:
        child.failed_at = child.failed_at or clock
    return code


def _first_cause(children: list[_Child]) -> _Child:
    """The process that failed first, not one that failed because it lost its peer.

    The peers of a killed or frozen process notice within moments (or at their timeout) and exit
    with an error too. A frozen process is the cause, then one killed by a signal, then one that
    stopped with an error of its own (exit code 2), then the one seen failing first, lowest rank
    first.
    """
    time.sleep(CAUSE_SETTLE_SECONDS)
    clock = time.monotonic()
    for child in children:
        _observe(child, clock)
    candidates = [child for child in children if child.stopped_since is not None or child.failed_at is not None]

    def order(child: _Child) -> tuple:
        code = child.process.returncode
        if child.stopped_since is not None:
            return (0, child.rank)
        return (1 if code < 0 else 2 if code == ConfigError.exit_code else 3, child.failed_at, child.rank)

    return min(candidates, key=order)


def _failure_message(child: _Child, code: int | None, *, stopped: bool = False) -> str:
    if stopped:
        how = "stopped answering (it is frozen: state T, e.g. after SIGSTOP)"
    else:
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    said = "" if stopped else _last_error(child.log)
    if code == ConfigError.exit_code and said:
        # The process refused its settings or data (or the loss diverged): its own words are the message.
        return (
            f"{child.role} rank {child.rank}: {said.removeprefix(f'rank {child.rank}: ')} (logs in {child.log.parent})"
        )
    tail = f": {said}" if said else ""
    return (
        f"{child.role} rank {child.rank} (pid {child.process.pid}) {how}{tail}; stopped the other processes. "
        f"Logs in {child.log.parent}; {resume_advice(child.log.parent.parent)}"
    )


def _last_error(log: Path) -> str:
    """The last error line a process wrote to its log (without the ``scaletrain: error:`` prefix), or its last line."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [
        line.removeprefix("scaletrain: error:").strip() for line in lines if line.startswith("scaletrain: error:")
    ]
    return (errors or lines or [""])[-1]


def _stop(children: list[_Child]) -> None:
    stop_processes([child.process for child in children])


def stop_processes(processes: list[Process]) -> None:
    """SIGTERM every process still running, then SIGKILL whatever is left after a grace period."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.send_signal(signal.SIGCONT)  # a frozen process handles SIGTERM only once it runs again
    deadline = time.monotonic() + GRACE_SECONDS
    for process in processes:
        remaining = max(0.0, deadline - time.monotonic())
        try:
            process.wait(remaining)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
