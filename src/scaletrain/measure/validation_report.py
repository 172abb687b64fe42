"""The validation's report (``validation.md``, :mod:`scaletrain.measure.validate`): the profile, predicted
against measured speedup per configuration, the order of the strategies, and a step's parts."""

from __future__ import annotations

from typing import Any

from scaletrain.estimate.intervals import LEVEL
from scaletrain.estimate.models import MODELS
from scaletrain.estimate.profile import Profile
from scaletrain.measure.machine import machine_label
from scaletrain.measure.ranking import coverage
from scaletrain.measure.results import shown_strategy

#: between the flagged runs of a validation row: a bench flag itself may hold "; " between its reasons
FLAGS_APART = " · "

__all__ = [
    "FLAGS_APART",
    "coverage_line",
    "engine_line",
    "markdown",
    "range_cells",
    "step_parts_table",
    "wire_label",
    "wire_suffix",
]


def markdown(
    profile: Profile,
    rows: list[dict[str, Any]],
    errors: dict[str, float | None],
    ranking: dict[str, dict[str, Any]],
    noise: float,
    *,
    others: list[Profile] | None = None,
) -> str:
    """``validation.md``: the profile and the machine it was measured on (and ``others``: the foreign engines'
    whose rows the table has), the table with the refined model's range per row and whether the measured speedup is
    inside it, both models' mean errors beside the range's coverage, the order of the strategies (pairs more than
    ``noise`` apart) and a synchronous step's parts. A foreign engine's rows name it before the strategy."""
    codec = ""
    if profile.gradient_bytes is not None or profile.codec_seconds:
        codec = (
            f" Gradient message {profile.gradient_bytes or profile.weight_bytes} bytes; the codec's compute "
            + (
                ", ".join(f"{part} {value * 1000:.2f} ms" for part, value in sorted(profile.codec_seconds.items()))
                or "not measured"
            )
            + " a step."
        )
    lines = [
        f"# Predicted vs measured speedup: {profile.workload}, batch {profile.batch_size}, "
        f"{profile.network or 'loopback'}{wire_suffix(profile)}",
        "",
        f"Profile: t_grad {profile.t_grad * 1000:.1f} ms, t_update {profile.t_update * 1000:.2f} ms, "
        + (f"one process {profile.t_step * 1000:.1f} ms a batch in real runs, " if profile.t_step else "")
        + f"t_comm {profile.t_comm * 1000:.2f} ms for {profile.weight_bytes} bytes, latency "
        f"{profile.latency * 1e6:.0f} µs, contention "
        + ", ".join(f"{k}: ×{v:.3f}" for k, v in sorted(profile.contention.items()))
        + "."
        + codec,
        *(engine_line(other) for other in others or []),
        f"Machine: {machine_label(profile.machine)}.",
        "",
        "| strategy | workers | runs | measured | thesis | error | refined | range | inside | error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {shown_strategy(row)} | {row['workers']} | {row['runs']} | {row['measured_speedup']:.3f} | "
            f"{row['thesis_speedup']:.3f} | {row['thesis_error_percent']:.1f} % | {row['refined_speedup']:.3f} | "
            f"{range_cells(row)} | {row['refined_error_percent']:.1f} % |"
        )
    lines += [
        "",
        "Mean absolute percentage error: "
        + ", ".join(f"{model} {value:.1f} %" for model, value in errors.items() if value is not None)
        + f". {coverage_line(rows)}",
        "",
        "Measured speedup = median batches/s of the configuration / median batches/s of `local` (one worker).",
        "",
    ]
    # each run once, in the table's order (a reference's flag stands in every row measured against it)
    flagged = dict.fromkeys(flag for row in rows for flag in (row.get("flagged_runs") or "").split(FLAGS_APART) if flag)
    if flagged:  # a measured speedup resting on them is as uncertain as they are apart
        lines += [f"Runs the bench flagged (the measured speedups rest on them): {FLAGS_APART.join(flagged)}.", ""]
    for workers, entry in ranking.items():
        taus = ", ".join(
            f"{model} τ = {entry[f'{model}_kendall_tau']:+.2f}"
            if entry[f"{model}_kendall_tau"] is not None
            else f"{model}: no pair apart"
            for model in MODELS
        )
        lines.append(
            f"{workers} workers, fastest first: measured {' > '.join(entry['measured'])}; "
            f"refined {' > '.join(entry['refined'])}; {taus} "
            f"(over the {entry['pairs_apart']} of {entry['pairs']} pairs more than {noise:.0%} apart)"
        )
    lines += [""] if ranking else []
    split = step_parts_table(rows)
    lines += [*split, ""] if split else []
    return "\n".join(lines)


def coverage_line(rows: list[dict[str, Any]]) -> str:
    """The refined model's coverage over ``rows`` in one sentence.

    >>> coverage_line([{"refined_speedup": 1.0, "refined_speedup_low": 0.9, "refined_speedup_high": 1.2,
    ...                 "refined_inside": True}])
    "Refined model's range (nominal 90 %): 1 of 1 measured speedups inside (coverage 100 %), mean width 30.0 %."
    >>> coverage_line([{"refined_speedup": 1.0}])
    "Refined model's range: none (the profile measured no spread)."
    """
    held = coverage(rows)
    if held["coverage"] is None:
        return "Refined model's range: none (the profile measured no spread)."
    return (
        f"Refined model's range (nominal {LEVEL * 100:.0f} %): {held['inside']} of {held['ranged']} measured "
        f"speedups inside (coverage {held['coverage'] * 100:.0f} %), mean width {held['mean_width_percent']:.1f} %."
    )


def range_cells(row: dict[str, Any]) -> str:
    """``1.550–1.700 | yes``: the row's range and whether the measured speedup is inside; ``— | —`` without one."""
    if row.get("refined_inside") in (None, ""):
        return "— | —"
    inside = "yes" if row["refined_inside"] in (True, "True") else "no"
    return f"{float(row['refined_speedup_low']):.3f}–{float(row['refined_speedup_high']):.3f} | {inside}"


def engine_line(profile: Profile) -> str:
    """One line of a foreign engine's profile, which its rows are predicted from."""
    exchanges = {**profile.allreduce, **profile.kvstore}
    return (
        f"Profile of the {profile.framework} engine (its own program): t_grad {profile.t_grad * 1000:.1f} ms, t_update "
        f"{profile.t_update * 1000:.2f} ms, t_comm {profile.t_comm * 1000:.2f} ms, latency {profile.latency * 1e6:.0f} "
        "µs, its exchange "
        + ", ".join(f"{k} workers {v * 1000:.2f} ms" for k, v in sorted(exchanges.items()))
        + ", contention "
        + ", ".join(f"{k}: ×{v:.3f}" for k, v in sorted(profile.contention.items()))
        + "."
    )


def wire_label(wire: str, options: dict[str, Any]) -> str:
    """The wire as the rows name it: ``fp32``, ``topk ratio=0.01``."""
    return " ".join([wire, *(f"{key}={value}" for key, value in sorted(options.items()))])


def wire_suffix(profile: Profile) -> str:
    """``, wire topk ratio=0.01`` for a profile of a wire other than float32; nothing for float32."""
    return f", wire {wire_label(profile.wire, profile.wire_options)}" if profile.wire != "fp32" else ""


def step_parts_table(rows: list[dict[str, Any]]) -> list[str]:
    """The per-step parts of the rows the refined model splits (:func:`step_parts`), measured against it, as
    Markdown lines (milliseconds); none when it splits no row."""
    split = [row for row in rows if row.get("refined_compute_seconds") is not None]
    if not split:
        return []

    def ms(value: float | None) -> str:
        return "—" if value is None else f"{value * 1000:.1f}"

    lines = [
        "A step's parts, measured / refined model, ms per step (the measured exchange is the communication;",
        "the predicted one holds the optimizer step too; a parameter-server worker's wait for the server's reply",
        "is in its measured wait; an asynchronous worker's predicted wait is its queueing behind the other",
        "workers' messages and its predicted exchange the push, update and reply as if alone: compare the sums):",
        "",
        "| strategy | workers | compute | wait | exchange |",
        "|---|---|---|---|---|",
    ]
    for row in split:
        cells = [
            f"{ms(row[f'measured_{part}_seconds'])} / {ms(row[f'refined_{part}_seconds'])}"
            for part in ("compute", "wait", "exchange")
        ]
        lines.append(f"| {shown_strategy(row)} | {row['workers']} | " + " | ".join(cells) + " |")
    return lines
