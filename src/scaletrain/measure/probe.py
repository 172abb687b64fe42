"""One process of a profile measurement, started by :mod:`scaletrain.measure.profile`.

``python -m scaletrain.measure.probe JOB.json RESULT.json`` with the torchrun variables set. The jobs:

- ``grad``: after a barrier every rank times forward+backward (t_grad) and the optimizer step (t_update) of its
  own copy of the model on a real batch, so ``world_size`` ranks measure t_grad while as many processes compete
  for the cores;
- ``transfer``: rank 0 plays the parameter server and rank 1 a worker over a two-process gloo group, with the
  server's calls and message shapes (a header, then one flat buffer of the wire codec's type, tags per
  direction): round trips of push(gradient) + pull(weights) per size in bytes;
- ``allreduce``: every rank runs the training's :class:`AllReduceExchange` step on gradients of the network's
  shapes and keeps the communication it reports and, apart, the wait for the slowest rank;
- ``central`` and ``central-async``: rank 0 a synchronous or asynchronous central :class:`ShardServer` (rate 0),
  every other rank a worker running :class:`PSExchange` steps and keeping communication + wait per step (an
  asynchronous worker pushes whenever ready and queues behind the others);
- ``sharded``: every rank a worker and the synchronous owner of its shard, as ``ps sharded`` runs them;
- ``codec``: one process times the wire codec's own work on gradients of the network's shapes: its all-reduce and
  float32's, each at world size 1, and a parameter server's compress and decompress.

Each exchange follows a real gradient of the workload, as in a training step, whose seconds are kept too
(``compute``). Exchanges and codec are timed past any dense start of the codec (:meth:`WireCodec.steady`), with
the run's ``-W`` options: what a run sends once it compresses.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from scaletrain.efficient.base import stacked
from scaletrain.efficient.channels_last import memory_format_technique
from scaletrain.efficient.precision import Precision
from scaletrain.measure.profile import network
from scaletrain.parallel.rendezvous import Rendezvous, connect
from scaletrain.parallel.sharding import assign_greedy
from scaletrain.parallel.strategies.allreduce import AllReduceExchange
from scaletrain.parallel.strategies.ps.exchange import PSExchange
from scaletrain.parallel.strategies.ps.protocol import (
    REPLY,
    REPLY_FIELDS,
    REQUEST,
    REQUEST_FIELDS,
    pair_groups,
    post_message,
    send_message,
)
from scaletrain.parallel.strategies.ps.server import ShardServer
from scaletrain.parallel.strategies.ps.shards import tensor_bytes
from scaletrain.plugins import load_plugins
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.tensors.device import resolve_device, synchronize, to_device
from scaletrain.tensors.optimizers import build_optimizer
from scaletrain.train.meter import now
from scaletrain.train.runtime import configure_process
from scaletrain.workloads import Part, create_workload

__all__ = [
    "main",
    "time_allreduce",
    "time_central",
    "time_codec",
    "time_gradient",
    "time_sharded",
    "time_transfers",
]

SMALL_LIMIT = 65536  # bytes


def time_gradient(job: dict[str, Any], barrier: Any = None) -> dict[str, Any]:
    """Median-able samples of t_grad per batch size and of t_update, after ``job['warmup']`` rounds."""
    configure_process(job["threads"])  # threads and allocator as in a training process
    workload = create_workload(job["workload"], job["options"])
    data = workload.load_data(Path(job["data_dir"]) if job["data_dir"] else None, download=job["download"])
    torch.manual_seed(0)
    device = resolve_device(job.get("device", "cpu"))
    model = network(workload, job.get("architecture") or {}).to(device)
    model.train()
    # t_update is the step of the run's optimizer (Adam's reads and writes two moments more than SGD's momentum)
    kind, options = job.get("optimizer", "sgd"), job.get("optimizer_options") or {}
    momentum = job["momentum"] if kind.lower() == "sgd" else None
    optimizer = build_optimizer(kind, options, model.parameters(), lr=job["lr"], momentum=momentum, weight_decay=0.0)
    autocast = _forward_context(job, device)
    batch_size = job["batch_size"]
    grads: dict[str, list[float]] = {}
    updates: list[float] = []
    backwards: list[float] = []  # backward's part of the whole batch's t_grad: what --overlap can hide behind
    # Every round computes on the first weights. Stepping again and again on one batch takes them where no run goes:
    # the LSTM's rate of 1 without the run's clipping diverged after 4 steps and computed 15 to 29 times slower.
    first = [tensor.detach().clone() for tensor in model.state_dict().values()]
    losses: list[float] = []  # the whole batch's loss each timed round: the same weights, the same loss
    for parts in job["parts"]:  # 1 = the whole batch; n = the 1/n share a split worker computes
        batch = next(iter(workload.train_batches(data, epoch=0, batch_size=batch_size, seed=0, part=Part(0, parts))))
        batch = to_device(batch, device)
        samples = []
        if barrier is not None:
            barrier()  # every rank starts this batch size together
        for round_number in range(job["warmup"] + job["repeats"]):
            state = workload.initial_state(model, batch_size // parts)
            optimizer.zero_grad(set_to_none=True)
            synchronize(device)  # CUDA runs asynchronously: clocks are read after its queued work
            begin = now()
            with autocast.forward_context():
                objective, _, _ = workload.training_loss(model, batch, state)
            synchronize(device)
            forward = now()
            objective.backward()
            synchronize(device)
            middle = now()
            optimizer.step()
            synchronize(device)
            end = now()
            with torch.no_grad():
                for tensor, value in zip(model.state_dict().values(), first, strict=True):
                    tensor.copy_(value)
            if round_number >= job["warmup"]:
                samples.append(middle - begin)
                if parts == 1:
                    updates.append(end - middle)
                    backwards.append(middle - forward)
                    losses.append(float(objective.detach()))
        grads[str(parts)] = samples
    return {"t_grad": grads, "t_update": updates, "t_backward": backwards, "losses": losses}


def _forward_context(job: dict[str, Any], device: torch.device) -> Any:
    """The forward pass as the training loop runs it: the activations' layout, then autocast."""
    layout = memory_format_technique(job.get("memory_format", "auto"), device.type)
    return stacked(layout, Precision(precision=job.get("precision", "fp32"), device_type=device.type))


def time_transfers(job: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank 1 pushes a buffer of each size to rank 0 and pulls one back, in the parameter server's messages
    (header and body, both receives posted first); round trips timed on rank 1, each direction timed on
    its receiver from the header's arrival to the body's."""
    group = dist.new_group([0, 1])
    # the parameter server's headers: a request's and a reply's, as they travel
    request, reply = torch.zeros(REQUEST_FIELDS, dtype=torch.int64), torch.zeros(REPLY_FIELDS, dtype=torch.int64)
    results: dict[str, dict[str, list[float]]] = {}
    codec = WireCodec.of(job.get("wire", "fp32"))
    for size in job["sizes"]:
        buffer = codec.buffer(max(1, size // codec.bytes_per_value))
        round_trips, one_way = [], []
        # Small messages are cheap and their times noisy (scheduling): many more rounds for them.
        warmup, repeats = (job["warmup"], job["repeats"]) if size > SMALL_LIMIT else (5, max(job["repeats"], 50))
        inbound = torch.empty_like(buffer)
        for round_number in range(warmup + repeats):  # as a PSExchange and a ShardServer exchange messages
            peer = 0 if rank == 1 else 1
            header, body = post_message(
                reply if rank == 1 else request, inbound, peer, group, REPLY if rank == 1 else REQUEST
            )
            if rank == 1:
                begin = now()
                send_message(request, buffer, 0, group, REQUEST)
            header.wait()
            arrived = now()
            body.wait()
            end = now()
            if rank == 0:
                send_message(reply, buffer, 1, group, REPLY)
            sample = (end - begin if rank == 1 else 0.0, end - arrived)
            if round_number >= warmup:
                round_trips.append(sample[0])
                one_way.append(sample[1])
        results[str(buffer.numel() * codec.bytes_per_value)] = {"round_trip": round_trips, "one_way": one_way}
    return results


def _exchange_model(job: dict[str, Any]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The network of the job with random gradients, and an optimizer of rate 0 (the weights stay)."""
    configure_process(job["threads"])
    workload = create_workload(job["workload"], job["options"])
    torch.manual_seed(dist.get_rank())
    model = network(workload, job.get("architecture") or {})
    for parameter in model.parameters():
        parameter.grad = torch.randn_like(parameter)
    return model, torch.optim.SGD(model.parameters(), lr=0.0)


def _codec(job: dict[str, Any]) -> WireCodec:
    """The run's wire codec with its options, past any dense start."""
    return WireCodec.of(job.get("wire", "fp32"), options=job.get("wire_options")).steady()


def time_codec(job: dict[str, Any]) -> dict[str, Any]:
    """Seconds per step of the codec's own work, one process alone: ``allreduce`` and the float32 one
    (``fp32``) alternately, then ``compress`` and ``decompress`` where a parameter server can carry it."""
    model, _ = _exchange_model(job)
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    layout = TensorLayout.of(gradients)
    codec, dense = _codec(job), WireCodec()
    samples: dict[str, list[float]] = {"allreduce": [], "fp32": []}
    for round_number in range(job["warmup"] + job["repeats"]):
        for name, each in (("allreduce", codec), ("fp32", dense)):
            flat = each.pack(gradients)
            begin = now()
            each.allreduce(flat, layout, stream="all-reduce")
            if round_number >= job["warmup"]:
                samples[name].append(now() - begin)
    if not codec.all_reduce_only:
        samples |= {"compress": [], "decompress": []}
        flat = codec.pack(gradients)
        for round_number in range(job["warmup"] + job["repeats"]):
            begin = now()
            payload, context = codec.compress(flat, layout, stream="push")
            middle = now()
            codec.decompress(payload, context)
            if round_number >= job["warmup"]:
                samples["compress"].append(middle - begin)
                samples["decompress"].append(now() - middle)
    return samples


def _gradient_step(job: dict[str, Any], model: torch.nn.Module) -> Any:
    """A closure: forward + backward of one real batch of the job's workload on ``model``; returns its seconds.
    The exchange probes run it before each exchange, as a training step does, so the computation is timed
    under the exchange's own traffic and threads (a parameter server's serving threads, its peers' pushes)."""
    workload = create_workload(job["workload"], job["options"])
    data = workload.load_data(Path(job["data_dir"]) if job["data_dir"] else None, download=job["download"])
    batch = next(iter(workload.train_batches(data, epoch=0, batch_size=job["batch_size"], seed=0, part=Part(0, 1))))
    model.train()
    context = _forward_context(job, torch.device("cpu"))  # the exchanges' probes run on the CPU

    def step() -> float:
        state = workload.initial_state(model, job["batch_size"])
        model.zero_grad(set_to_none=True)
        begin = now()
        with context.forward_context():
            objective, _, _ = workload.training_loss(model, batch, state)
        objective.backward()
        return now() - begin

    return step


def _time_steps(job: dict[str, Any], model: torch.nn.Module, step: Any, exchanged: Any, waited: Any) -> dict[str, Any]:
    """``job['repeats']`` steps of gradient, then exchange (``step``), after ``job['warmup']`` untimed ones: each
    part's seconds per step. ``exchanged(times)``: the seconds the exchange counts; ``waited(times)``: the wait for
    the slowest worker that it leaves out (0 where the exchange's own time holds it)."""
    # the exchanges' probes hold the model on the CPU: a profile for another device times no gradient beside them
    on_cpu = resolve_device(job.get("device", "cpu")).type == "cpu"
    compute = _gradient_step(job, model) if on_cpu else None
    samples: dict[str, list[float]] = {"exchange": [], "compute": [], "wait": []}
    for round_number in range(job["warmup"] + job["repeats"]):
        seconds = compute() if compute is not None else None
        times = step()
        if round_number >= job["warmup"]:
            samples["exchange"].append(exchanged(times))
            samples["wait"].append(waited(times))
            samples["compute"] += [seconds] if seconds is not None else []
    return samples


def _in_exchange(times: Any) -> float:
    """A parameter-server worker's wait for its reply is in its exchange's seconds: nothing apart."""
    return 0.0


def time_allreduce(job: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Seconds of ``job['repeats']`` all-reduce steps among ``world_size`` ranks (a real gradient, then the
    exchange's communication: the run's wire codec on gradients of the network's shapes)."""
    model, optimizer = _exchange_model(job)
    exchange = AllReduceExchange(world_size, _codec(job))
    exchange.start(model, optimizer)
    return _time_steps(
        job,
        model,
        lambda: exchange.step(model, optimizer, None),
        lambda times: times.communication,
        lambda times: times.wait,
    )


def time_sharded(job: dict[str, Any], world_size: int) -> dict[str, Any]:
    """Every rank a worker and the owner of its shard (Algorithm 3.7's greedy plan, :class:`ShardServer`
    synchronous, rate 0), as ``ps sharded`` runs them: each worker's gradient and communication + wait per step."""
    model, optimizer = _exchange_model(job)
    ranks = list(range(world_size))
    groups = pair_groups(world_size, [(a, b) for a in ranks for b in ranks if a < b], timeout=job["timeout"])
    peers = {b if a == dist.get_rank() else a: group for (a, b), group in groups.items() if dist.get_rank() in (a, b)}
    codec = _codec(job)

    def serve(owned: list[torch.nn.Parameter], _: torch.optim.Optimizer) -> ShardServer:
        master = [torch.nn.Parameter(p.detach().clone()) for p in owned]
        optimizer = torch.optim.SGD(master, lr=0.0)
        server = ShardServer(
            master=master,
            optimizer=optimizer,
            peers=peers,
            contributors=world_size,
            synchronous=True,
            timeout=job["timeout"],
            codec=codec,
        )
        server.start()
        return server

    exchange = PSExchange(
        rank=dist.get_rank(),
        plan=lambda parameters: assign_greedy(tensor_bytes(parameters), ranks),
        groups=peers,
        serve=serve,
        codec=codec,
    )
    exchange.start(model, optimizer)
    samples = _time_steps(
        job,
        model,
        lambda: exchange.step(model, optimizer, None),
        lambda times: times.communication + times.wait,
        _in_exchange,
    )
    exchange.finish(model)
    if exchange.local_server is not None:
        exchange.local_server.join(deadline_seconds=job["timeout"])
    return samples


def time_central(job: dict[str, Any], world_size: int, synchronous: bool = True) -> dict[str, Any]:
    """Rank 0 serves ``world_size − 1`` workers (``synchronous`` or not); each worker's communication + wait
    seconds of ``job['repeats']`` exchange steps after ``job['warmup']`` untimed ones (the server: empty lists)."""
    model, optimizer = _exchange_model(job)
    rank, workers = dist.get_rank(), list(range(1, world_size))
    groups = pair_groups(world_size, [(0, worker) for worker in workers], timeout=job["timeout"])
    peers = {b if a == rank else a: group for (a, b), group in groups.items() if rank in (a, b)}
    codec = _codec(job)
    if rank == 0:
        server = ShardServer(
            master=list(model.parameters()),
            optimizer=optimizer,
            peers=peers,
            contributors=len(workers),
            synchronous=synchronous,
            timeout=job["timeout"],
            codec=codec,
        )
        server.start()
        server.join(deadline_seconds=job["timeout"])
        return {"exchange": [], "compute": [], "wait": []}
    exchange = PSExchange(rank=rank, plan=lambda parameters: [0] * len(parameters), groups=peers, codec=codec)
    exchange.start(model, optimizer)
    samples = _time_steps(
        job,
        model,
        lambda: exchange.step(model, optimizer, None),
        lambda times: times.communication + times.wait,
        _in_exchange,
    )
    exchange.finish(model)
    return samples


def main(argv: list[str] | None = None) -> int:
    job_path, result_path = (argv if argv is not None else sys.argv[1:])[:2]
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    load_plugins()  # a workload of one's own is timed as in training
    rendezvous = Rendezvous.from_env()
    connect(rendezvous, timeout=job["timeout"])
    if job["kind"] == "grad":
        result = time_gradient(job, barrier=dist.barrier if rendezvous.world_size > 1 else None)
    elif job["kind"] == "allreduce":
        result = time_allreduce(job, rendezvous.world_size)
    elif job["kind"] in ("central", "central-async"):
        result = time_central(job, rendezvous.world_size, synchronous=job["kind"] == "central")
    elif job["kind"] == "sharded":
        result = time_sharded(job, rendezvous.world_size)
    elif job["kind"] == "codec":
        result = time_codec(job)
    else:
        result = time_transfers(job, rendezvous.rank)
    dist.barrier()
    Path(result_path).write_text(json.dumps({"rank": rendezvous.rank, **result}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    from scaletrain.parallel.teardown import exit_now

    code = main()
    sys.stdout.flush()
    exit_now(code)  # skip c10d's teardown, which can abort at interpreter exit
