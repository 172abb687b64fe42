"""A whole benchmark: sweep, results files, pictures and report; and comparing result sets."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scaletrain.errors import ConfigError
from scaletrain.measure.presets import PRESETS
from scaletrain.measure.report import reading, text_table, write_report
from scaletrain.measure.results import add_speedups, flag_outliers, group_rows, read_results, write_results
from scaletrain.measure.sweep import SweepConfig, plan_runs, run_sweep
from scaletrain.workloads import create_workload

__all__ = ["compare_results", "preset_config", "run_bench"]

QUICK_STEPS, QUICK_WARMUP = 16, 2


def preset_config(name: str, out: Path, *, quick: bool = False, **overrides: Any) -> SweepConfig:
    """The sweep of a preset, with worker counts capped to this machine's cores.

    ``quick`` shortens every run to 16 optimizer steps with 2 warm-up steps (for CI and a first look).
    """
    try:
        preset = PRESETS[name]
    except KeyError:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}") from None
    settings = dict(preset.settings)
    epochs = settings.pop("epochs", None)
    config = SweepConfig(
        workload=preset.workload,
        out=out,
        workers=preset.workers,
        strategies=preset.strategies,
        batch_sizes=preset.batch_sizes,
        epochs=None if quick else epochs,
        steps=QUICK_STEPS if quick else None,
        warmup_steps=QUICK_WARMUP if quick else 5,
        options=dict(preset.options),
        settings=settings,
        max_workers=os.cpu_count() or 1,
    )
    given = {key: value for key, value in overrides.items() if value is not None}
    return dataclasses.replace(config, **given)


def run_bench(
    config: SweepConfig, *, title: str | None = None, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Run the sweep and write results.csv/.jsonl, the PNGs and report.md into ``config.out``.

    ``progress`` receives a line as each run starts and one with its figures as it ends. Returns the
    rows, notes, paths written, the reading (Markdown list items) and the table of medians as text.
    """
    # made once here, as each run's processes will: a workload that cannot be made fails now, not in every run
    create_workload(config.workload, config.options)
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    total = len(plan_runs(config)[0])
    started = time.monotonic()

    def keep(row: dict[str, Any]) -> None:
        rows.append(row)
        flag_outliers(add_speedups(rows))
        write_results(rows, out)  # after every run: an interrupted sweep keeps its rows
        if progress is not None:
            progress(f"[{len(rows)}/{total}] {_outcome(row)}")

    _, notes = run_sweep(config, on_row=keep, progress=progress)
    flag_outliers(add_speedups(rows))
    write_results(rows, out)
    from scaletrain.measure.plots import plot_all  # matplotlib only when drawing

    pictures = plot_all({"results": group_rows(rows)}, out) if group_rows(rows) else []
    report = write_report(rows, notes, out, title=title or f"Scaling of {config.workload}", pictures=pictures)
    return {
        "rows": rows,
        "notes": notes,
        "report": report,
        "pictures": pictures,
        "out": out,
        "reading": reading(rows),
        "table": text_table(rows),
        "seconds": time.monotonic() - started,
    }


def _outcome(row: dict[str, Any]) -> str:
    """``23.1 batches/s, speedup 1.00 (own one-worker run), 0.98 (common reference)`` or the failure."""
    if row.get("status") != "ok":
        return f"failed: {row.get('error')}"
    text = f"{row['batches_per_second']:.1f} batches/s"
    if row["workers"] > 1:
        speedups = [
            f"{row[field]:.2f} {against}"
            for field, against in (("speedup", "(own one-worker run)"), ("speedup_common", "(common reference)"))
            if row.get(field) is not None
        ]
        text += f", speedup {', '.join(speedups)}" if speedups else ", no one-worker run yet for a speedup"
    elif row.get("speedup_common") is not None:
        text += f", {row['speedup_common']:.2f}× the one-worker reference so far"
    # the report decides on all runs; a run off from the few measured so far may end up unflagged
    if row.get("flag"):
        text += f" — off so far: {row['flag']} (the report re-checks it against all runs)"
    if row.get("quality_warning"):
        text += f" — warning: {row['quality_warning']}"
    return text


def compare_results(sources: list[Path], out: Path, *, names: list[str] | None = None) -> dict[str, Any]:
    """Overlay result sets (e.g. two networks or two machines) in the same pictures and one report."""
    if len(sources) < 2:
        raise ConfigError("compare needs at least two result sets")
    names = names or [Path(source).name or str(source) for source in sources]
    if len(set(names)) != len(names):
        names = [f"{index + 1}:{name}" for index, name in enumerate(names)]
    sets = {}
    all_rows = []
    for name, source in zip(names, sources, strict=True):
        rows = flag_outliers(add_speedups(read_results(Path(source))))
        sets[name] = group_rows(rows)
        all_rows += [{**row, "strategy": f"{row['strategy']} [{name}]"} for row in rows]
    out.mkdir(parents=True, exist_ok=True)
    from scaletrain.measure.plots import plot_all  # matplotlib only when drawing

    pictures = plot_all(sets, out)
    notes = [f"set {name}: {source}" for name, source in zip(names, sources, strict=True)]
    report = write_report(all_rows, notes, out, title="Comparison of scaling results", pictures=pictures)
    return {"report": report, "pictures": pictures, "out": out}
