"""Strategies side by side, and the parameter server's transfer cost against raw c10d send/recv.

A) Every strategy trains LeNet-5 on Fashion-MNIST (found on disk, never downloaded; else a labelled
   synthetic look-alike) with 2 workers, the same batch size, steps, seed and 1 torch thread per
   process, through the public ``scaletrain.train(...)`` (TensorBoard and progress off). ``local``
   (1 worker) is the reference. Repeats run round-robin over the configurations, so that drift of
   this machine's speed hits them all alike. Per configuration: median batches/s (``summary.json``),
   speedup against local, and median compute / communication / wait ms per step.
B) Two spawned processes on 127.0.0.1 (gloo). Rank 0 runs a ``ShardServer`` over the tensors of a
   real model (LeNet-5: 431,080 floats; ptb-lstm: 4,653,200), rank 1 a ``PSExchange`` doing
   push(gradient)+pull(weights) round trips. Over a second pair group the same two processes do a
   raw ``dist.send``/``dist.recv`` of one float32 tensor of the same size each way (the physical
   limit here). Blocks of PS and raw alternate (order flipped every block) after a warm-up; medians
   per round trip. The PS round trip includes the server's SGD step and the worker's gradient
   flatten, so those are timed alone too and subtracted in the "net" ratio. Part B runs
   ``--transfer-runs`` times (fresh processes each time); PASS when the median ratio over the runs
   is at most 1.5.

Run: ``PYTHONPATH=src .venv/bin/python benchmarks/strategies.py [--steps 150 --repeats 3
--batch-size 64 --round-trips 200 --warmup 20 --blocks 4 --transfer-runs 3 --json out.json]`` (about 5 min on a
quiet 2-core machine; part B alone, ``--skip-strategies``, under a minute).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from scaletrain.api import train  # = scaletrain.train, which the train/ subpackage can shadow
from scaletrain.data.idx import find_fashion_mnist
from scaletrain.data.synthetic import write_synthetic_fashion_mnist
from scaletrain.errors import DataError, ScaletrainError
from scaletrain.parallel.rendezvous import Rendezvous, connect
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.protocol import pair_groups
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.workloads import create_workload

PS = {"strategy": "ps", "workers": 2}
CONFIGS: dict[str, dict[str, Any]] = {  # scaletrain.train settings of each configuration
    "local": {"strategy": "local", "workers": 1},
    "allreduce-join": {"strategy": "allreduce", "workers": 2, "sync": "join"},
    "allreduce-split": {"strategy": "allreduce", "workers": 2, "sync": "split"},
    **{f"ps-{server}-{sync}": {**PS, "server": server, "sync": sync}
       for server in ("central", "sharded") for sync in ("join", "split", "async")},
    "ps-central-join-exclusive": {**PS, "server": "central", "sync": "join", "ps_admission": "exclusive"},
}  # fmt: skip
PER_STEP = ("compute_seconds_per_step", "communication_seconds_per_step", "wait_seconds_per_step")
FIXED = {"threads": 1, "tensorboard": False, "progress": "off", "download": False}
LR, MOMENTUM, PASS_RATIO = 0.01, 0.9, 1.5


def run_strategies(args: argparse.Namespace, scratch: Path) -> tuple[dict[str, Any], str]:
    """Table A: every configuration ``args.repeats`` times, interleaved round-robin."""
    try:
        data_dir, data = None, f"Fashion-MNIST from {find_fashion_mnist(None, download=False)}"
    except DataError:
        data_dir = write_synthetic_fashion_mnist(scratch / "synthetic", train=6000, test=1000)
        data = f"SYNTHETIC Fashion-MNIST look-alike (real set not found) in {data_dir}"
    fixed = {"steps": args.steps, "batch_size": args.batch_size, "data_dir": data_dir, **FIXED}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in args.configs}
    for repeat in range(args.repeats):
        for name in args.configs:
            out = scratch / f"{name}-{repeat}"
            try:
                summary = train("lenet", **CONFIGS[name], **fixed, out=out)
            except ScaletrainError as exc:
                print(f"  {name} repeat {repeat}: FAILED {exc}", flush=True)
                continue
            runs[name].append({key: summary[key] for key in ("batches_per_second", *PER_STEP)})
            print(f"  repeat {repeat} {name}: {summary['batches_per_second']:.1f} batches/s", flush=True)
    keys = ("batches_per_second", *PER_STEP)
    table = {
        name: {k: statistics.median(r[k] for r in results) if results else None for k in keys} | {"runs": results}
        for name, results in runs.items()
    }
    reference = table.get("local", {}).get("batches_per_second")
    for row in table.values():
        rate = row.get("batches_per_second")
        row["speedup"] = rate / reference if rate and reference else None
    return table, data


def print_strategies(table: dict[str, Any], data: str, args: argparse.Namespace) -> None:
    print(f"\nA) strategies: lenet, {data}; batch {args.batch_size}, {args.steps} steps, 1 thread/process, ")
    print(f"   median of {args.repeats} interleaved repeats (ms per step are means over workers)")
    print(f"{'configuration':<26} {'batches/s':>9} {'speedup':>7} {'compute':>8} {'comm':>7} {'wait':>7}")
    for name, row in table.items():
        if row["batches_per_second"] is None:
            print(f"{name:<26} {'failed':>9}")
            continue
        ms = [f"{1000 * row[key]:>7.2f}" for key in PER_STEP]
        print(f"{name:<26} {row['batches_per_second']:>9.1f} {row['speedup']:>6.2f}x {ms[0]:>8} {ms[1]} {ms[2]}")
    print(
        f"   note: this machine has {os.cpu_count()} cores; 2 workers (+ the central server process) share "
        "them,\n   so speedup is bounded by CPU contention, not by the loopback network."
    )


def tensors(shapes: list[tuple[int, ...]], seed: int) -> nn.ParameterList:
    """Parameters with the shapes of a real model (same tensor count, so the same packing work)."""
    generator = torch.Generator().manual_seed(seed)
    return nn.ParameterList(nn.Parameter(torch.randn(s, generator=generator)) for s in shapes)


def _time(function: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        function()
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def _server_update_seconds(shapes: list[tuple[int, ...]], repeats: int) -> float:
    """``ShardServer``'s own work per gradient, no transfer: a synchronous ``contribute`` with one
    contributor (nothing to add up: views of the received gradient go to the fused SGD momentum step)."""
    params = list(tensors(shapes, seed=2).parameters())
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, fused=True)  # as make_optimizer builds it
    server = ShardServer(master=params, optimizer=optimizer, peers={}, contributors=1, synchronous=True)
    gradient = torch.randn(sum(p.numel() for p in params)) * 1e-3
    return _time(lambda: server.contribute(gradient, server.version), repeats)


def transfer_process(rank: int, port: int, models: dict[str, list], options: dict[str, int], out: str) -> None:
    """Body of each spawned process of part B; rank 1 writes the timings to ``out/rank-1.json``."""
    torch.set_num_threads(1)
    connect(Rendezvous(rank=rank, world_size=2, master_addr="127.0.0.1", master_port=port), timeout=300)
    groups = [[pair_groups(2, [(0, 1)])[(0, 1)] for _ in range(2)] for _ in models]
    results = {}
    for (name, shapes), (ps_group, raw_group) in zip(models.items(), groups, strict=True):
        model = tensors([tuple(s) for s in shapes], seed=rank)
        if rank == 0:
            _server_side(model, ps_group, raw_group, options)
        else:
            results[name] = _worker_side(model, ps_group, raw_group, options)
    dist.destroy_process_group()
    if rank == 1:
        Path(out, "rank-1.json").write_text(json.dumps(results), encoding="utf-8")


def _server_side(model: nn.Module, ps_group: Any, raw_group: Any, options: dict[str, int]) -> None:
    """Rank 0: time an update alone, then serve the PS (its own thread) and the raw transfers."""
    params = list(model.parameters())
    update = _server_update_seconds([tuple(p.shape) for p in params], repeats=50)
    dist.send(torch.tensor([update], dtype=torch.float64), dst=1, group=raw_group)
    optimizer = torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, fused=True)
    server = ShardServer(master=params, optimizer=optimizer, peers={1: ps_group}, contributors=1, synchronous=True)
    server.start()
    numel = sum(p.numel() for p in params)
    inbound, outbound = torch.empty(numel), torch.randn(numel)
    for _ in range(options["warmup"] + options["round_trips"]):  # blocked (idle) during PS blocks
        dist.recv(inbound, src=1, group=raw_group)
        dist.send(outbound, dst=1, group=raw_group)
    server.join()


def _worker_side(model: nn.Module, ps_group: Any, raw_group: Any, options: dict[str, int]) -> dict[str, float]:
    """Rank 1: alternate blocks of PS round trips and raw round trips; time each."""
    params = list(model.parameters())
    numel = sum(p.numel() for p in params)
    update = torch.zeros(1, dtype=torch.float64)
    dist.recv(update, src=0, group=raw_group)
    optimizer = torch.optim.SGD(params, lr=LR)  # PSExchange.step takes it but does not use it
    for p in params:
        p.grad = torch.randn_like(p) * 1e-3
    exchange = PSExchange(rank=1, plan=lambda tensors: [0] * len(tensors), groups={0: ps_group})
    exchange.start(model, optimizer)
    outbound, inbound = torch.randn(numel), torch.empty(numel)

    def ps_trip() -> None:
        exchange.step(model, optimizer, None)

    def raw_trip() -> None:
        dist.send(outbound, dst=0, group=raw_group)
        dist.recv(inbound, src=0, group=raw_group)

    packed = torch.empty(numel)

    def pack_unpack() -> None:  # the worker-side copy of PSExchange.step (weights arrive in place)
        torch.cat([p.grad.reshape(-1) for p in params], out=packed)

    for _ in range(options["warmup"]):
        ps_trip()
        raw_trip()
    times: dict[str, list[float]] = {"ps": [], "raw": []}
    trips, blocks = options["round_trips"], options["blocks"]
    for block in range(blocks):
        count = trips // blocks + (1 if block < trips % blocks else 0)
        for kind in ("ps", "raw") if block % 2 == 0 else ("raw", "ps"):
            trip = ps_trip if kind == "ps" else raw_trip
            for _ in range(count):
                begin = time.perf_counter()
                trip()
                times[kind].append(time.perf_counter() - begin)
    pack = _time(pack_unpack, 50)
    exchange.finish(model)
    return {
        "parameters": numel,
        "megabytes": numel * 4 / 1e6,
        "ps_seconds": statistics.median(times["ps"]),
        "raw_seconds": statistics.median(times["raw"]),
        "server_update_seconds": float(update[0]),
        "worker_pack_seconds": pack,
    }


def run_transfers(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    """Table B: spawn the two processes ``args.transfer_runs`` times; per model, every run's row and the
    medians over the runs."""
    models = {name: [list(p.shape) for p in create_workload(name).build_model().parameters()] for name in args.models}
    options = {"warmup": args.warmup, "round_trips": args.round_trips, "blocks": args.blocks}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in models}
    for run in range(args.transfer_runs):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        folder = scratch / f"run-{run}"
        folder.mkdir()
        mp.spawn(transfer_process, args=(port, models, options, str(folder)), nprocs=2, join=True)
        for name, row in json.loads((folder / "rank-1.json").read_text(encoding="utf-8")).items():
            ps, raw = row["ps_seconds"], row["raw_seconds"]
            row["ratio"] = ps / raw
            row["net_ratio"] = (ps - row["server_update_seconds"] - row["worker_pack_seconds"]) / raw
            row["raw_gigabytes_per_second"] = 2 * row["megabytes"] / 1e3 / raw
            runs[name].append(row)
            print(f"  transfer run {run} {name}: PS/raw {row['ratio']:.2f}", flush=True)
    table = {}
    for name, rows in runs.items():
        table[name] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        table[name]["ratios"] = [row["ratio"] for row in rows]
        table[name]["pass"] = table[name]["ratio"] <= PASS_RATIO
    return table


def print_transfers(table: dict[str, Any], args: argparse.Namespace) -> None:
    print("\nB) parameter server push+pull vs raw c10d send/recv of the same bytes (gloo, 127.0.0.1)")
    print(
        f"   median per round trip of {args.round_trips} (after {args.warmup} warm-up), {args.blocks} blocks;"
        f" every column the median over {args.transfer_runs} runs of fresh processes"
    )
    head = ("floats", "MB", "PS ms", "raw ms", "ratio", "update ms", "pack ms", "net ratio", "raw GB/s")
    print(f"{'model':<9}" + "".join(f"{h:>10}" for h in head) + "  verdict  (ratio per run)")
    for name, row in table.items():
        cells = [f"{row['parameters']:,.0f}", f"{row['megabytes']:.2f}"]
        cells += [f"{1000 * row[k]:.2f}" for k in ("ps_seconds", "raw_seconds")] + [f"{row['ratio']:.2f}"]
        cells += [f"{1000 * row[k]:.2f}" for k in ("server_update_seconds", "worker_pack_seconds")]
        cells += [f"{row['net_ratio']:.2f}", f"{row['raw_gigabytes_per_second']:.2f}"]
        verdicts = ["PASS" if ratio <= PASS_RATIO else "FAIL" for ratio in (row["ratio"], row["net_ratio"])]
        per_run = ", ".join(f"{ratio:.2f}" for ratio in row["ratios"])
        print(f"{name:<9}" + "".join(f"{c:>10}" for c in cells) + "  {}; net {}".format(*verdicts) + f"  ({per_run})")
    print(
        "   update = the server's own work per gradient (fused SGD momentum step), timed alone;\n"
        "   pack = the worker's gradient flatten into its send buffer (weights arrive in place), timed alone;\n"
        "   net ratio = (PS - update - pack) / raw: the PS's own transfer cost (header messages, threads).\n"
        f"   verdict: PASS when the median PS <= {PASS_RATIO:g} x raw (ratio); net: the same test on the net ratio."
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150, help="training steps per run (A)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3, help="runs per configuration, round-robin (A)")
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--round-trips", type=int, default=200, help="timed round trips per method (B)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed round trips per method first (B)")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks PS/raw (B)")
    parser.add_argument("--transfer-runs", type=int, default=3, help="runs of part B in fresh processes; medians (B)")
    parser.add_argument("--models", nargs="+", default=["lenet", "ptb-lstm"], help="tensor shapes to use (B)")
    parser.add_argument("--skip-strategies", action="store_true", help="only part B")
    parser.add_argument("--skip-transfers", action="store_true", help="only part A")
    parser.add_argument("--json", type=Path, help="save all numbers here")
    args = parser.parse_args()
    began = time.time()
    report: dict[str, Any] = {"settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="st-strategies-") as folder:
        scratch = Path(folder)
        if not args.skip_strategies:
            report["strategies"], report["data"] = run_strategies(args, scratch)
        if not args.skip_transfers:
            (scratch / "transfers").mkdir()
            report["transfers"] = run_transfers(args, scratch / "transfers")
    if "strategies" in report:
        print_strategies(report["strategies"], report["data"], args)
    if "transfers" in report:
        print_transfers(report["transfers"], args)
    print(f"\ntotal {time.time() - began:.0f} s, torch {torch.__version__}, {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
