"""Advice: the worker count and configuration with the highest predicted speedup, under each model.

The thesis model chooses among its own six configurations (central/distributed server × async,
sync-join, sync-split); the refined model among every configuration the strategy registry marks
predicted (:func:`~scaletrain.estimate.models.predicted_configurations`: all-reduce join/split
besides those six). A ``join`` run trains
with an N-times larger effective batch, so its speedup in batches per second may cost accuracy
per batch; the advice says so.

>>> from scaletrain.estimate.profile import Profile
>>> best = recommend(Profile("toy", 32, t_grad=0.8, t_comm=5.0), max_workers=4)
>>> best["thesis"]["workers"]  # transfers dwarf the gradient: one worker alone
1
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.estimate.intervals import Spread, measured_spread, overlap, speedup_range
from scaletrain.estimate.models import (
    MODELS,
    Configuration,
    best_per_workers,
    predicted_configurations,
    predicted_speedup,
    thesis_configurations,
)
from scaletrain.estimate.profile import Profile
from scaletrain.parallel.strategies import get_strategy, parse_spec

__all__ = ["recommend"]

JOIN_NOTE = "join trains N batches per step (an N-times larger effective batch); check accuracy per epoch"
#: What advice adds for a strategy that is weighed only when asked (Strategy.recommended_unasked: diloco)
ASKED_NOTE = "its speed at these options is predicted, what they cost in quality is not: measure it"


def recommend(
    profile: Profile,
    *,
    max_workers: int,
    batches: float = 128,
    cores: int | None = None,
    case: str = "mean",
    models: tuple[str, ...] = MODELS,
    async_batches: str = "split",
    strategy_options: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """Per model: the best ``workers``, ``configuration`` label and ``speedup``; ``by_workers``: the best per count.

    The refined model's advice from a profile with measured samples also holds the best choice's ``range`` (low,
    point, high; :mod:`scaletrain.estimate.intervals`), the ``runner_up`` (the best other configuration at that
    worker count, or where one worker alone is best, the best choice on more: its ``workers``, ``configuration``
    and ``range``) and ``indistinguishable``: whether the two ranges overlap. Without samples these are None and
    False.

    One worker alone (speedup 1 by definition) is the fallback when no configuration beats it. Asynchronous
    configurations are predicted as ``async_batches`` divides the batch (training's default: split).
    ``strategy_options`` (``-S``): each strategy predicted with those of them that are its own; a strategy
    that is not weighed unasked (``Strategy.recommended_unasked``: diloco) is weighed when one of its own is
    given, and its label in the advice says them (``diloco-join, sync_every=16``).
    """
    if max_workers < 1:
        raise ConfigError(f"--max-workers must be ≥ 1, got {max_workers}")
    advice = {}
    for model in models:
        candidates = thesis_configurations() if model == "thesis" else predicted_configurations(profile.framework)
        if profile.framework != "scaletrain":  # an engine's profile: only the runs that engine has
            runs = {c.label for c in predicted_configurations(profile.framework)}
            candidates = [c for c in candidates if c.label in runs]
        candidates = with_options([replace(c, async_batches=async_batches) for c in candidates], strategy_options)
        best = {"workers": 1, "configuration": "local", "speedup": 1.0}
        per_workers = {}
        ranking = best_per_workers(model, profile, candidates, max_workers, batches=batches, cores=cores, case=case)
        for workers, (speedup, label) in enumerate(ranking, 1):
            per_workers[workers] = {"configuration": label, "speedup": speedup}
            if speedup > best["speedup"]:
                best = {"workers": workers, "configuration": label, "speedup": speedup}
        label = best["configuration"].split(", ")[0]  # the spec, without the options given
        notes = [JOIN_NOTE if label.endswith("-join") else ""]
        if not get_strategy(parse_spec(label)[0]).recommended_unasked:  # one process ("local") is weighed unasked
            notes.append(ASKED_NOTE)
        note = "; ".join(note for note in notes if note)
        advice[model] = {**best, "note": note, "by_workers": per_workers, "range": None, "runner_up": None}
        advice[model]["indistinguishable"] = False
        spread = measured_spread(profile) if model == "refined" else None
        if spread is not None:
            contest = _contest(profile, spread, best, candidates, per_workers, batches=batches, cores=cores)
            advice[model].update(contest)
    return advice


def _contest(
    profile: Profile,
    spread: Spread,
    best: dict[str, Any],
    candidates: list[Configuration],
    per_workers: dict[int, dict[str, Any]],
    *,
    batches: float,
    cores: int | None,
) -> dict[str, Any]:
    """The best choice's range beside the runner-up's, and whether they overlap."""
    by_label = {c.described: c for c in candidates}

    def ranged(label: str, workers: int) -> tuple[float, float, float]:
        if label not in by_label:  # one process alone: the reference itself, 1 by definition
            return (1.0, 1.0, 1.0)
        return speedup_range(profile, by_label[label], workers, batches=batches, cores=cores, spread=spread)

    workers = best["workers"]
    if best["configuration"] in by_label:
        others = {
            c.described: predicted_speedup("refined", profile, c, workers, batches=batches, cores=cores)
            for c in candidates
            if c.described != best["configuration"]
        }
        rivals = [(speedup, workers, label) for label, speedup in others.items()]
    else:  # one worker alone is best: the best choice on more workers
        rivals = [(entry["speedup"], n, entry["configuration"]) for n, entry in per_workers.items() if n > 1]
    if not rivals:
        return {"range": ranged(best["configuration"], workers)}
    _, rival_workers, rival = max(rivals)
    first, second = ranged(best["configuration"], workers), ranged(rival, rival_workers)
    runner_up = {"workers": rival_workers, "configuration": rival, "range": second}
    return {"range": first, "runner_up": runner_up, "indistinguishable": overlap(first, second)}


def with_options(candidates: list[Configuration], options: Mapping[str, Any] | None) -> list[Configuration]:
    """The candidates with each strategy's own ``options``, less the strategies not weighed unasked and given none.

    >>> [c.label for c in with_options([Configuration.parse("diloco-join")], None)]
    []
    >>> [c.option_values["sync_every"] for c in with_options([Configuration.parse("diloco-join")], {"sync_every": 4})]
    [4]
    """
    chosen = []
    for candidate in candidates:
        strategy = get_strategy(candidate.strategy)
        names = {option.name for option in strategy.options}
        own = {key: value for key, value in (options or {}).items() if key in names}
        if own or strategy.recommended_unasked:
            chosen.append(candidate.with_options(own) if own else candidate)
    return chosen
