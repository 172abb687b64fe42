"""One training run from a user's settings: the config built from the workload's defaults, a TOML file
and the settings, then run in this process, started here as local processes, or joined as one process
of a job started elsewhere (a node file, torchrun)."""

from __future__ import annotations

import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from scaletrain.config import TrainConfig, default_strategy, load_toml, merge
from scaletrain.efficient import with_flagged_options
from scaletrain.errors import ConfigError
from scaletrain.parallel.launch import launch_local
from scaletrain.parallel.preflight import check_before_start
from scaletrain.parallel.process import join_process, layout_of, run_process
from scaletrain.parallel.rendezvous import ENV_RANK, ENV_WORLD_SIZE, Rendezvous
from scaletrain.parallel.strategies import (
    STRATEGIES,
    check_strategy_settings,
    expand_spec,
    strategy_flags,
    with_strategy_flags,
)
from scaletrain.parallel.strategies.elastic_rules import check_elastic
from scaletrain.plugins import load_plugins
from scaletrain.workloads import Origin, Workload

__all__ = ["make_config", "refuse_unread", "run_training"]


def make_config(workload: str | None, *, config_file: Path | None = None, **settings: Any) -> TrainConfig:
    """Build a :class:`TrainConfig`: workload defaults < ``config_file`` (TOML) < ``settings``.

    ``settings`` whose value is ``None`` count as not given. A technique's own settings
    (``lasso_ratio=0.3`` with ``technique="prunetrain"``) become its ``technique_options``, and a strategy's
    option given by its keyword its ``strategy_options``; the strategy then judges them (and the wire and
    ``overlap``: :func:`~scaletrain.parallel.strategies.check_strategy_settings`). ``workload`` None takes the
    config file's ``workload`` key; a workload given wins over the file's.

    >>> make_config("lenet", batch_size=64).batch_size
    64
    """
    load_plugins()  # from Python as from the command line: the registries hold the plug-ins' names
    from_file = load_toml(config_file, also=strategy_flags()) if config_file is not None else {}
    if workload is None and "workload" not in from_file:
        where = (
            f"a 'workload' key in {config_file}" if config_file is not None else "a --config file with a 'workload' key"
        )
        raise ConfigError(f"no workload to train: name one (scaletrain train lenet) or give {where}")
    named = {} if workload is None else {"workload": workload}
    given = {key: value for key, value in with_flagged_options(settings).items() if value is not None}
    merged = with_strategy_flags(expand_spec(merge(from_file, named, given)))
    refuse_unread(merged)
    config = TrainConfig(**merged)
    check_strategy_settings(config)
    return config


def refuse_unread(settings: dict[str, Any]) -> None:
    """Refuse settings (TrainConfig fields as given, a spec split) that the run's strategy would never read: a
    server's setting for a strategy without servers (a strategy's own options it judges itself). A setting given
    at its default value asks for nothing and passes.

    >>> refuse_unread({"workers": 2, "server": "sharded"})
    Traceback (most recent call last):
    ...
    scaletrain.errors.ConfigError: --server sharded is a parameter server's setting, and allreduce has no servers; ...
    """
    defaults = {f.name: f.default for f in fields(TrainConfig)}
    name = settings.get("strategy") or default_strategy(settings.get("workers", 1))
    strategy = STRATEGIES.get(name)
    server = settings.get("server")
    if strategy is not None and not strategy.servers and server is not None and server != defaults["server"]:
        raise ConfigError(
            f"--server {server} is a parameter server's setting, and {name} has no servers; "
            "add --strategy ps (see --server and --sync), or drop --server"
        )


def run_training(config: TrainConfig, own: Workload | None = None) -> dict[str, Any]:
    """Run ``config`` (with ``own``, a workload object, instead of making ``config.workload``); the summary.

    With more than one process only rank 0 gets the summary; the others get their rank and folder.
    Processes started here make ``own`` again from ``config.workload`` when that is what made it
    (``own.origin``), and get it pickled otherwise (:mod:`scaletrain.parallel.handover`); processes
    started elsewhere (torchrun, a node file) each bring their own.
    """
    layout = layout_of(config)  # checks the strategy flags before anything starts
    check_strategy_settings(config)  # a config built directly, not by make_config, is judged too
    check_elastic(config, layout)
    if config.join:  # a worker started mid-run: the run it joins is already going
        if config.out is None:
            raise ConfigError("--join needs the --out of the run it joins (where the run says where to meet it)")
        return join_process(config, own)
    if config.nodefile is not None:
        return _run_launched(config, Rendezvous.from_nodefile(config.nodefile, config.index), own)
    if layout.world_size == 1:  # the same driver as every process of a distributed run, in this process
        return run_process(check_before_start(config, layout, own), Rendezvous.alone(), own)
    if ENV_RANK in os.environ and ENV_WORLD_SIZE in os.environ:
        return _run_launched(config, Rendezvous.from_env(), own)
    checked = check_before_start(config, layout, own)
    made_from_config = own is None or own.origin == Origin(config.workload, config.options)
    return launch_local(checked, layout, None if made_from_config else own)


def _run_launched(config: TrainConfig, rendezvous: Rendezvous, workload: Workload | None) -> dict[str, Any]:
    """This process is one of several started by someone else (torchrun, a node file on each machine)."""
    if config.network is not None:
        raise ConfigError(
            "--network emulates a network for processes started here; drop it with --nodefile or torchrun"
        )
    if config.out is None:
        raise ConfigError("give --out when another launcher starts the processes, so they share one folder name")
    summary = run_process(config, rendezvous, workload)
    return summary if summary is not None else {"rank": rendezvous.rank, "out": str(config.out)}
