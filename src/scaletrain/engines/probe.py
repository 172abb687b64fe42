"""Start a foreign engine's program as a probe: the times ``scaletrain profile --framework`` measures, timed by
the engine itself in its own environment.

A probe is a spec with a ``probe`` block (the contract in :mod:`scaletrain.engines`). ``local``: ``processes``
programs at once, each alone (no cluster variables), each timing t_grad and t_update after a barrier of them
all. ``sync``: the layout of a synchronous run of ``workers`` (its servers and scheduler too), every worker
timing the engine's own exchange. The processes are watched as a run's are (:mod:`scaletrain.engines.launch`).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from scaletrain.engines.base import Role
from scaletrain.engines.install import python_of
from scaletrain.engines.launch import ENGINE_FOLDER, LOGS, EngineFailed, _host, _start, _watch, check_run
from scaletrain.engines.prepare import SPEC_NAME, EngineRun, prepare
from scaletrain.netem.network import EmulatedNetwork, parse_rate
from scaletrain.parallel.launch import stop_processes
from scaletrain.workloads import create_workload

__all__ = ["probe_engine"]


def probe_engine(
    framework: str,
    workload: str,
    *,
    mode: str,
    processes: int,
    batch_size: int,
    probe: dict[str, Any],
    out: Path,
    data_dir: Path | None = None,
    network: str | None = None,
    timeout: float = 600.0,
) -> list[dict[str, Any]]:
    """Run one probe of ``framework`` into ``out`` (``processes``: local programs at once, or sync workers);
    each timing worker's samples (``probe-worker-<i>.json``) in order of its index."""
    defaults = create_workload(workload).defaults
    workers = processes if mode == "sync" else 1
    run = EngineRun(
        framework=framework,
        workload=workload,
        mode=mode,
        workers=workers,
        servers=0,
        batch_size=batch_size,
        lr=defaults.lr,
        momentum=defaults.momentum,
        weight_decay=0.0,
        epochs=None,
        steps=1,
        warmup_steps=0,
        threads=probe.get("threads", 1),
        seed=0,
        data_dir=data_dir,
    )
    engine = check_run(run)
    spec = prepare(run, out / ENGINE_FOLDER)
    spec["probe"] = {**probe, "processes": processes}
    (Path(spec["out"]) / SPEC_NAME).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    if mode == "sync":
        roles = engine.roles(mode, workers, 0)
    else:
        roles = [Role("worker", index, trains=True) for index in range(processes)]
    (out / LOGS).mkdir(parents=True, exist_ok=True)
    started = []
    with contextlib.ExitStack() as stack:
        emulated = None
        if network is not None and mode == "sync":
            emulated = stack.enter_context(EmulatedNetwork(len(roles), parse_rate(network)))
        hosts = [_host(emulated, k) for k in range(len(roles))]
        python = python_of(engine)
        try:
            for k, role in enumerate(roles):
                # a local probe's processes are each alone: told of no cluster
                together = (roles, hosts, k) if mode == "sync" else ([role], [hosts[k]], 0)
                started.append(_start(engine, python, spec, role, together[0], together[1], together[2], emulated, out))
            _watch(engine, started, timeout)
        finally:
            stop_processes([process.popen for process in started])
            for process in started:
                process.log_file.close()
    results = []
    for index in range(workers if mode == "sync" else processes):
        path = Path(spec["out"]) / f"probe-worker-{index}.json"
        try:
            results.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError) as exc:
            raise EngineFailed(f"the {framework} probe ended without its measurements ({path}: {exc})") from None
    return results
