"""The device suite's report, its tables of numbers: a scaling sweep's rows against both models' predictions, and the
cells they are made of. :mod:`device_report` and :mod:`device_report_issue50` put them in the report."""

from __future__ import annotations

from typing import Any

from scaletrain.measure.validation_report import step_parts_table


def ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1000 * seconds:.2f}"


def number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def sweep_section(name: str, sweep: dict[str, Any]) -> list[str]:
    predicted = {(row["strategy"], row["workers"]): row for row in sweep.get("predictions", [])}
    lines = [
        f"### {name}: {sweep['workload']}, batch {sweep['batch_size']}, {sweep['steps_per_worker']} steps per worker "
        f"({sweep['warmup_steps']} untimed) — {sweep['status']}",
        "",
        "| strategy | workers | batches/s | speedup | efficiency | thesis | error | refined | error | status |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(sweep["rows"], key=lambda row: (row["strategy"], row["workers"])):
        guess = predicted.get((row["strategy"], row["workers"]), {})
        ok = row.get("status") == "ok"
        lines.append(
            f"| {row['strategy']} | {row['workers']} | {number(row.get('batches_per_second'), 2)} | "
            f"{number(row.get('speedup_common'))} | {number(row.get('efficiency_common'))} | "
            f"{number(guess.get('thesis_speedup'))} | {percent(guess.get('thesis_error_percent'))} | "
            f"{number(guess.get('refined_speedup'))} | {percent(guess.get('refined_error_percent'))} | "
            f"{'ok' if ok else 'failed: ' + str(row.get('error', ''))[:200].replace('|', '/')} |"
        )
    if sweep.get("errors"):
        lines += ["", "Mean absolute percentage error per strategy:", "", "| model | " +
                  " | ".join(sweep["errors"].get("refined", {})) + " |",
                  "|---|" + "---|" * len(sweep["errors"].get("refined", {}))]  # fmt: skip
        for model, errors in sweep["errors"].items():
            lines.append(f"| {model} | " + " | ".join(percent(value) for value in errors.values()) + " |")
    if sweep.get("ranking"):
        lines += ["", "Strategies fastest first, measured against predicted (Kendall τ over the pairs whose "
                  "measured speedups are more than 5 % apart):", ""]  # fmt: skip
        for workers, order in sweep["ranking"].items():
            taus = "; ".join(
                f"{model} {' > '.join(order[model])} (τ {tau(order.get(f'{model}_kendall_tau'))})"
                for model in ("refined", "thesis")
            )
            lines.append(f"- {workers} workers: measured {' > '.join(order['measured'])}; {taus}")
    parts = step_parts_table(sweep.get("predictions", []))
    lines += ["", *parts] if parts else []
    if sweep.get("not_run"):
        missing = ", ".join(f"{item['strategy']} × {item['workers']}" for item in sweep["not_run"])
        lines += ["", f"Not run ({sweep['not_run'][0]['why']}): {missing}."]
    if sweep.get("profile_error") or sweep.get("error"):
        lines += ["", "```", str(sweep.get("profile_error") or sweep.get("error"))[-1500:], "```"]
    return [*lines, ""]


def tau(value: float | None) -> str:
    return "—: no pair apart" if value is None else f"{value:+.2f}"


def percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f} %"
