"""``scaletrain profile WORKLOAD``: measure t_grad, t_comm and the refined model's inputs; print and write JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from scaletrain.api import profile
from scaletrain.cli.arguments import name_list, number_list, workload_argument, workloads_offered
from scaletrain.cli.registry_flags import parse_options
from scaletrain.cli.train import add_model_flags, workload_options
from scaletrain.efficient.channels_last import MEMORY_FORMATS
from scaletrain.efficient.precision import DTYPES
from scaletrain.engines.registry import FRAMEWORKS
from scaletrain.errors import ConfigError
from scaletrain.estimate.profile import Profile
from scaletrain.measure.machine import machine_label
from scaletrain.measure.profile import EXCHANGES
from scaletrain.tensors.codec import CODECS

__all__ = ["add_parser", "add_profile_flags", "describe", "profile_settings", "run", "single_framework"]


def add_profile_flags(parser: argparse.ArgumentParser) -> None:
    """The flags that say what to profile (shared with ``scaletrain estimate WORKLOAD``)."""
    group = parser.add_argument_group("profiling")
    group.add_argument(
        "--framework",
        type=name_list,
        default=("scaletrain",),
        metavar="NAME",
        help=f"whose runs to profile: {', '.join(FRAMEWORKS)} (a foreign engine times them with its "
        "own program; with estimate --validate a comma-separated list)",
    )
    group.add_argument("--batch-size", type=int, metavar="N", help="batch size (default: the workload's)")
    group.add_argument(
        "--network", metavar="RATE", help="measure t_comm across an emulated link of this rate, e.g. 100mbit (root)"
    )
    group.add_argument(
        "--split-workers", type=number_list, metavar="N,N", help="also t_grad at batch/N for these N, e.g. 2,4"
    )
    group.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="measure contention up to this many processes (default: this machine's cores)",
    )
    group.add_argument(
        "--contention-at",
        type=number_list,
        metavar="N,N",
        help="measure contention only at these process counts (default: each from 2)",
    )
    group.add_argument(
        "--exchange-at",
        type=number_list,
        metavar="N,N",
        help="also time the all-reduce, central and sharded exchanges among N workers, each "
        "after a real gradient, e.g. 2,4 (corrects the refined model's)",
    )
    group.add_argument(
        "--exchanges",
        type=lambda text: tuple(text.split(",")),
        default=EXCHANGES,
        metavar="LIST",
        help=f"which exchanges --exchange-at times (default: {','.join(EXCHANGES)})",
    )
    group.add_argument("--threads", type=int, default=1, metavar="N", help="torch threads per process, as in bench")
    group.add_argument("--repeats", type=int, default=10, metavar="N", help="timed gradients per batch size")
    group.add_argument("--round-trips", type=int, default=10, metavar="N", help="timed push+pull round trips")
    group.add_argument("--launches", type=int, default=3, metavar="N", help="fresh processes each timing pools")
    group.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS", help="time each measurement may take")
    group.add_argument("--data-dir", type=Path, metavar="FOLDER", help="folder with the dataset files")
    group.add_argument("--no-download", dest="download", action="store_false", help="never download datasets")
    group.add_argument("-o", "--option", action="append", default=[], metavar="KEY=VALUE", help="workload option")
    group.add_argument(
        "--precision",
        choices=sorted(DTYPES),
        default="fp32",
        help="time t_grad under this autocast type, as train --precision runs it",
    )
    group.add_argument(
        "--wire",
        choices=sorted(CODECS),
        default="fp32",
        help="time t_comm for the weights in this type, as train --wire sends them",
    )
    group.add_argument(
        "-W",
        "--wire-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the wire codec's option, as train takes it, e.g. -W rank=1 for powersgd: the "
        "profile's gradient_bytes are that codec's compressed message",
    )
    group.add_argument(
        "--overlap",
        action="store_true",
        help="the runs to predict all-reduce gradients during backward, as train --overlap",
    )
    group.add_argument(
        "--bucket-mb",
        type=float,
        default=0.25,
        metavar="MIB",
        help="with --overlap: their buckets' size, as train --bucket-mb (default 0.25)",
    )
    group.add_argument(
        "--device", default="cpu", metavar="cpu|cuda|cuda:K|auto", help="where t_grad is timed (default: cpu)"
    )
    group.add_argument(
        "--optimizer",
        metavar="NAME",
        help="whose step t_update times, as train takes it (default: sgd); with estimate --validate also the runs'",
    )
    group.add_argument(
        "-O", "--optimizer-option", action="append", default=[], metavar="KEY=VALUE", help="an option of --optimizer"
    )
    group.add_argument(
        "--memory-format",
        choices=MEMORY_FORMATS,
        default="auto",
        help="the convolutions' activations while t_grad is timed, as in train",
    )
    add_model_flags(parser)


def profile_settings(args: argparse.Namespace) -> dict:
    """:class:`~scaletrain.measure.profile.ProfileConfig` fields from the flags of :func:`add_profile_flags`."""
    return {
        "framework": single_framework(args),
        "batch_size": args.batch_size,
        "network": args.network,
        "split_workers": args.split_workers or (),
        "concurrency": args.concurrency,
        "contention_counts": tuple(args.contention_at or ()),
        "exchange_counts": tuple(args.exchange_at or ()),
        "exchanges": args.exchanges,
        "threads": args.threads,
        "repeats": args.repeats,
        "round_trips": args.round_trips,
        "launches": args.launches,
        "timeout": args.timeout,
        "data_dir": args.data_dir,
        "download": args.download,
        "options": workload_options(args),
        "precision": args.precision,
        "wire": args.wire,
        "wire_options": parse_options(args.wire_option, what="wire option", example="-W rank=2"),
        "device": args.device,
        "memory_format": args.memory_format,
        "overlap_bucket_mb": args.bucket_mb if args.overlap else None,
        "optimizer": args.optimizer,
        "optimizer_options": parse_options(args.optimizer_option, what="optimizer option", example="-O eps=1e-8"),
    }


def single_framework(args: argparse.Namespace) -> str:
    """The one framework ``--framework`` names where a list is not taken."""
    if len(args.framework) != 1 and not getattr(args, "validate", False):
        raise ConfigError("--framework takes one name here (a list only with estimate --validate)")
    return args.framework[0] if args.framework else "scaletrain"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "profile",
        help="measure t_grad and t_comm (and the refined model's inputs) for a workload",
        description=(
            "Measure forward+backward time of one batch (t_grad, median after warm-up), the optimizer step, "
            "one process's seconds a batch in short real runs (t_step, the reference of every speedup), "
            "t_grad with several processes at once (contention), and the transfer of all weights between two "
            "real processes over the parameter server's transport (t_comm, latency, bandwidth). With --framework "
            "tensorflow or mxnet, the engine's own program times them, t_comm in its own exchange."
        ),
    )
    parser.add_argument(
        "workload", type=workload_argument, metavar="WORKLOAD", help=f"what to profile: {workloads_offered()}"
    )
    parser.add_argument(
        "--out", type=Path, metavar="FILE", help="JSON file (default: profiles/WORKLOAD-bBATCH[-FRAMEWORK][-RATE].json)"
    )
    parser.add_argument(
        "--architecture-of",
        type=Path,
        metavar="RUN",
        help="profile the network a finished run left (e.g. pruned by --technique prunetrain): "
        "its summary.json's architecture and workload options",
    )
    add_profile_flags(parser)
    parser.set_defaults(handler=run)


def describe(result: Profile) -> str:
    """The profile in a few lines a person reads."""
    parts = ", ".join(f"batch/{n}: {t * 1000:.2f} ms" for n, t in sorted(result.t_grad_parts.items()))
    contention = ", ".join(f"{k} processes ×{v:.3f}" for k, v in sorted(result.contention.items()) if k > 1)
    allreduce = ", ".join(f"{k} workers {v * 1000:.2f} ms" for k, v in sorted(result.allreduce.items()))
    central = ", ".join(f"{k} workers {v * 1000:.2f} ms" for k, v in sorted(result.central.items()))
    kvstore = ", ".join(f"{k} workers {v * 1000:.2f} ms" for k, v in sorted(result.kvstore.items()))
    engine = f"{result.framework} engine: " if result.framework != "scaletrain" else ""
    codec = ", ".join(f"{part} {seconds * 1000:.2f} ms" for part, seconds in sorted(result.codec_seconds.items()))
    step = [f"t_step   {result.t_step * 1000:10.2f} ms   one process, a batch in real runs"] if result.t_step else []
    message = ""
    if result.gradient_bytes is not None:
        gathered = "all-gathered" if result.collective == "all_gather" else "all-reduced"
        message = (
            f"gradient message {result.gradient_bytes:,} bytes as {result.wire} ({gathered} in "
            f"{result.collective_calls} call{'s' if result.collective_calls > 1 else ''})"
        )
    return "\n".join(
        [
            f"{engine}{result.workload}, batch {result.batch_size}, {result.parameters:,} parameters "
            f"({result.weight_bytes:,} weight bytes on the wire), {result.precision} compute"
            f"{' (channels-last)' if result.memory_format == 'channels_last' else ''}, "
            f"{result.threads} thread(s), {result.network or 'loopback'}",
            f"t_grad   {result.t_grad * 1000:10.2f} ms" + (f"   ({parts})" if parts else ""),
            f"t_update {result.t_update * 1000:10.2f} ms",
            *step,
            f"t_comm   {result.t_comm * 1000:10.2f} ms   latency {result.latency * 1e6:.0f} µs, "
            f"bandwidth {result.bytes_per_second * 8 / 1e6:,.0f} Mbit/s",
        ]
        + ([f"contention: {contention}"] if contention else [])
        + ([f"all-reduce: {allreduce}"] if allreduce else [])
        + ([f"central server exchange: {central}"] if central else [])
        + ([f"kvstore dist_sync push + pull: {kvstore}"] if kvstore else [])
        + ([message] if message else [])
        + ([f"codec compute a step: {codec}"] if codec else [])
        + [f"measured on {machine_label(result.machine)}"]
    )


def run(args: argparse.Namespace) -> int:
    # checks --out before measuring
    result = profile(args.workload, out=args.out, architecture_of=args.architecture_of, **profile_settings(args))
    print(describe(result))
    print(f"written to {args.out if args.out is not None else result.save(result.default_path())}")
    return 0
