"""How well a model's predictions agree with measured speedups: mean errors and the order of the strategies."""

from __future__ import annotations

import statistics
from typing import Any

from scaletrain.estimate.models import MODELS
from scaletrain.measure.results import framework_of

__all__ = ["RANK_NOISE", "coverage", "mean_errors", "rank_agreement"]


#: two configurations whose measured speedups differ by less than this fraction are within the noise of
#: single runs here (±5–10 %), so their order says nothing and is not counted
RANK_NOISE = 0.05


def rank_agreement(rows: list[dict[str, Any]], *, noise: float = RANK_NOISE) -> dict[str, dict[str, Any]]:
    """At each worker count > 1 with two strategies or more: the strategies fastest first as measured
    and as each model predicts them, and each model's Kendall τ against the measured order over the
    pairs whose measured gap exceeds ``noise`` (1: every such pair in the measured order; −1: every one
    reversed; None: no pair apart). ``X_same_order``: τ is 1 (or no pair is apart).

    >>> rows = [{"workers": 2, "strategy": s, "measured_speedup": m, "thesis_speedup": t, "refined_speedup": r}
    ...         for s, m, t, r in (("a", 1.8, 1.9, 1.7), ("b", 1.2, 1.95, 1.1), ("c", 1.19, 1.0, 1.2))]
    >>> result = rank_agreement(rows)["2"]
    >>> result["measured"], result["thesis_kendall_tau"], result["refined_kendall_tau"], result["pairs_apart"]
    (['a', 'b', 'c'], 0.0, 1.0, 2)
    """
    result: dict[str, dict[str, Any]] = {}
    counts = sorted({(framework_of(row) != "scaletrain", framework_of(row), int(row["workers"])) for row in rows})
    for _, framework, workers in counts:  # scaletrain's first; each framework's strategies among themselves
        group = [row for row in rows if int(row["workers"]) == workers and framework_of(row) == framework]
        if workers < 2 or len(group) < 2:
            continue
        measured = [row["strategy"] for row in sorted(group, key=lambda row: -row["measured_speedup"])]
        pairs = [
            (first, second)
            for index, first in enumerate(group)
            for second in group[index + 1 :]
            if abs(first["measured_speedup"] - second["measured_speedup"])
            > noise * max(first["measured_speedup"], second["measured_speedup"])
        ]
        entry: dict[str, Any] = {
            "measured": measured,
            "pairs": len(group) * (len(group) - 1) // 2,
            "pairs_apart": len(pairs),
        }
        for model in MODELS:
            entry[model] = [row["strategy"] for row in sorted(group, key=lambda row: -row[f"{model}_speedup"])]
            signs = [
                (a["measured_speedup"] - b["measured_speedup"]) * (a[f"{model}_speedup"] - b[f"{model}_speedup"])
                for a, b in pairs
            ]
            tau = (sum(s > 0 for s in signs) - sum(s < 0 for s in signs)) / len(signs) if signs else None
            entry[f"{model}_kendall_tau"] = tau
            entry[f"{model}_same_order"] = tau is None or tau == 1.0
        result[str(workers) if framework == "scaletrain" else f"{framework} {workers}"] = entry
    return result


def mean_errors(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Mean absolute percentage error of each model over the rows."""
    return {model: statistics.mean(row[f"{model}_error_percent"] for row in rows) if rows else None for model in MODELS}


def coverage(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How well the refined model's ranges hold the measured speedups: ``ranged`` (rows with a range), ``inside``
    (of them, the measured speedup within it), ``coverage`` (inside / ranged; None without a range) and
    ``mean_width_percent`` (the ranges' mean width over the point prediction).

    >>> rows = [{"refined_speedup": 1.0, "refined_speedup_low": 0.9, "refined_speedup_high": 1.1,
    ...          "refined_inside": inside} for inside in (True, True, False)] + [{"refined_speedup": 1.0}]
    >>> result = coverage(rows)
    >>> result["inside"], result["ranged"], round(result["coverage"], 3), round(result["mean_width_percent"], 1)
    (2, 3, 0.667, 20.0)
    """
    ranged = [row for row in rows if row.get("refined_inside") not in (None, "")]
    inside = sum(row["refined_inside"] in (True, "True") for row in ranged)
    widths = [
        (float(row["refined_speedup_high"]) - float(row["refined_speedup_low"])) / float(row["refined_speedup"]) * 100
        for row in ranged
    ]
    return {
        "ranged": len(ranged),
        "inside": inside,
        "coverage": inside / len(ranged) if ranged else None,
        "mean_width_percent": statistics.mean(widths) if widths else None,
    }
