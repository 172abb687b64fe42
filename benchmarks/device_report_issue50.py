"""The device suite's report, the sections of issue 50's parts: mixed precision on the GPU and slow links.

Each function takes the suite's ``figures.json`` and returns Markdown lines (none when its part did not run);
:func:`loss_curves_picture` draws the precision part's loss curves. :mod:`device_report` puts them in the report.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

GIB = 2**30


def _result(figures: dict[str, Any], part: str) -> dict[str, Any] | None:
    return figures["parts"].get(part, {}).get("result")


def _cell(value: float | None, form: str) -> str:
    return "—" if value is None else format(value, form)


def mixed_precision(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "mixed-precision")
    if result is None:
        return []
    timing = result["timing"]
    lines = [
        f"## Mixed precision on {result['device']}: where bf16 and fp16 pay (issue 50, part 1)",
        "",
        f"A training step: forward under autocast, backward (fp16: loss scaling, unscaling and the overflow check), "
        f"the optimizer's step (SGD with momentum for the image networks, AdamW for the GPT). fp32 with TF32 "
        f"{'on' if result['tf32'] else 'off'}; the image networks channels-last on learnable random images made on "
        f"the device; the GPT on the Penn Treebank's words. Step: the median of {timing['blocks']} blocks of "
        f"{timing['steps_per_block']} steps after {timing['warmup']} warm-up steps (under compile the warm-up holds "
        f"the compilation). Peak memory over warm-up and timed steps. Ratio: fp32's step ÷ this step, same model, "
        f"batch and mode. torch {result['torch']}.",
        "",
    ]
    verdict = result.get("verdict") or {}
    best = verdict.get("best")
    if best:
        mode = "compiled" if best["compiled"] else "eager"
        state = "met" if verdict["met"] else "not met"
        lines += [
            f"**Goal (×{verdict['goal']} over fp32 at the full batch): {state}**; the best ratio: "
            f"{best['workload']} {best['precision']} {mode} ×{best['speedup_over_fp32']:.2f}.",
            "",
        ]
    lines += [
        "| model | mode | batch | precision | ms/step | images or tokens/s | peak GiB | ratio to fp32 | compile s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in sorted(result["rows"], key=lambda r: (r["workload"], r["compiled"], -r["batch_size"])):
        rate = row["tokens_per_second"] or row["samples_per_second"]
        unit = "tokens" if row["tokens_per_second"] else "images"
        peak = row["peak_memory_bytes"] / GIB if row["peak_memory_bytes"] else None
        ratio = row.get("speedup_over_fp32")
        lines.append(
            f"| {row['workload']} | {'compiled' if row['compiled'] else 'eager'} | {row['batch_size']} | "
            f"{row['precision']} | {1000 * row['step_seconds']:.2f} | {rate:,.0f} {unit} | {_cell(peak, '.2f')} | "
            f"{'—' if ratio is None else f'×{ratio:.2f}'} | {_cell(row['compile_seconds'], '.0f')} |"
        )
    lines += ["", *_quality(result), *_profiles(result)]
    for item in result.get("errors", []):
        lines.append(f"- failed: {item['kind']} {item['job']}: {item['error'][-300:]}")
    if result.get("not_run"):
        missing = "; ".join(f"{item['kind']} {item['job']}" for item in result["not_run"])
        lines += ["", f"Not run (the part's deadline): {missing}."]
    return [*lines, ""]


def _quality(result: dict[str, Any]) -> list[str]:
    curves = result.get("curves") or {}
    if not curves:
        return []
    lines = [
        "Quality: a short run per precision from the same weights on the same inputs (eager); the mean loss of "
        "the curve's last quarter, and its ratio to fp32's (near 1: the narrow type trains as fp32 does).",
        "",
        "| model | steps | " + " | ".join(f"{p} first → end loss" for p in next(iter(curves.values()))) + " | ratios |",
        "|---|---|" + "---|" * (len(next(iter(curves.values()))) + 1),
    ]
    for workload, by_precision in curves.items():
        summary = result.get("quality", {}).get(workload, {})
        cells = [
            f"{losses[0]:.3f} → {summary.get(f'{p}_end_loss', float('nan')):.3f}" for p, losses in by_precision.items()
        ]
        ratios = ", ".join(f"{key.split('_')[0]} ×{value:.3f}" for key, value in summary.items() if "against" in key)
        steps = len(next(iter(by_precision.values())))
        lines.append(f"| {workload} | {steps} | " + " | ".join(cells) + f" | {ratios or '—'} |")
    return [*lines, ""]


def _profiles(result: dict[str, Any]) -> list[str]:
    lines = []
    for profile in result.get("profiles", []):
        share = profile["matrix_share"]
        lines += [
            f"Profile: {profile['workload']} {profile['precision']} eager, batch {profile['batch_size']} "
            f"({profile['what']}): {1000 * profile['seconds_per_step']:.2f} ms a step, of which "
            f"{_cell(None if share is None else 100 * share, '.0f')} % in convolution and matrix kernels (by name).",
            "",
            "| kernel | ms per step | calls per step | share |",
            "|---|---|---|---|",
        ]
        for row in profile["top"]:
            name = row["name"].replace("|", "/")
            name = name if len(name) <= 90 else name[:87] + "..."
            lines.append(
                f"| `{name}` | {1000 * row['seconds_per_step']:.3f} | {row['calls_per_step']:.0f} | "
                f"{100 * row['share']:.1f} % |"
            )
        lines.append("")
    return lines


def slow_link(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "slow-link")
    if result is None:
        return []
    plan = result["plan"]
    lines = [
        f"## Slow links with cores to spare (issue 50, part 3): {result['workload']}, link {result['link']}",
        "",
        f"Link: {result['link_note']}.",
        "",
        f"2 workers of {plan['threads']} threads each (`--sync split`) against one process of {plan['threads']} "
        f"threads, on {result['cores']} cores; the first {plan['train_samples']:,} training images, "
        f"{plan['epochs']} epoch(s) at batch {plan['batch_size']}, lr {plan['lr']}, seed 0. Speedup: one "
        "process's median seconds per step ÷ the run's; accuracy on the test set after the same steps.",
        "",
        "| run | s/step | speedup | test accuracy | bytes a worker sent per step | outer steps | weights agree |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, run in result["runs"].items():
        if run.get("status") == "failed":
            lines.append(f"| {name} | failed: {run['error'][-200:].replace('|', '/').replace(chr(10), ' ')} |||||||")
            continue
        lines.append(
            f"| {name} | {run['seconds_per_step']:.3f} | {_cell(run.get('speedup'), '.2f')} | "
            f"{run['test_accuracy']:.4f} | {run['bytes_per_step']:,.0f} | {run['outer_steps'] or '—'} | "
            f"{'yes' if run['weights_agree'] else 'NO'} |"
        )
    if result.get("not_run"):
        lines += ["", f"Not run (the part's deadline): {', '.join(item['run'] for item in result['not_run'])}."]
    return [*lines, ""]


def loss_curves_picture(figures: dict[str, Any], out: Path) -> str | None:
    """``loss-curves.png``: each model's loss per step in each precision; its name, or None."""
    result = _result(figures, "mixed-precision")
    curves = (result or {}).get("curves") or {}
    if not curves:
        return None
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(1, len(curves), figsize=(4.2 * len(curves), 3.6), squeeze=False)
    for axis, (workload, by_precision) in zip(axes[0], curves.items(), strict=True):
        for precision, losses in by_precision.items():
            axis.plot(range(1, len(losses) + 1), losses, label=precision)
        axis.set(title=workload, xlabel="step", ylabel="training loss")
        axis.legend(fontsize=7)
    figure.suptitle(f"Loss per step by precision on {result['device']}", fontsize=9)
    path = out / "loss-curves.png"
    figure.savefig(path, dpi=110, bbox_inches="tight")
    pyplot.close(figure)
    return path.name
