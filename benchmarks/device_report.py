"""The device suite's report: Markdown tables and PNGs drawn from its ``figures.json`` alone.

:func:`markdown` renders whatever parts have finished (the suite rewrites the report after each one), starting
with what was run and what each figure is; :func:`pictures` draws the loss curves per precision, the speedup
curves per workload and the precision ratios (at most four PNGs). Issue 50's sections are in
:mod:`device_report_issue50`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import device_report_issue50
from device_report_tables import ms as _ms
from device_report_tables import number as _number
from device_report_tables import percent as _percent
from device_report_tables import sweep_section as _sweep
from device_report_tables import tau as _tau

PRECISION_GOAL = 1.8
MAX_PICTURES = 4
#: what each part measures, for the report's first section
PART_NOTES = {
    "machine": "the GPU, driver, torch, CUDA, the CPU and its cores",
    "gpu-tests": "`pytest -m gpu`: scaletrain's correctness on CUDA (pass/fail per test)",
    "mixed-precision": "fp32 (TF32), bf16 and fp16 steps of ResNet-34, VGG16E (224×224) and a GPT, eager and "
    "compiled: ms per step, images or tokens per second, peak memory, the ratio to fp32; loss curves; a kernel "
    "profile of fp32 against bf16",
    "slow-link": "ResNet-20 on 2 workers of 4 threads over an emulated 50 Mbit/s link: dense, PowerSGD, top-k, "
    "DiLoCo; speedup over one process and test accuracy",
    "holdout": "scaling cases chosen on 2026-11-28 before any run: measured speedups against both models' "
    "predictions from a profile taken first; error per strategy and worker count, Kendall τ per count",
    "scaling": "Jäger's sweeps: LeNet and the PTB LSTM at 1–14 workers, measured and predicted",
    "precision": "fp32/bf16/fp16 steps of ResNet-20/32 on 32×32 inputs (issue 12)",
    "gpu-vs-cpu": "fp32 steps of LeNet and ResNet-20 on the GPU and one CPU thread",
    "prunetrain": "PruneTrain's epoch times on the GPU against dense",
    "adaptive-batch": "the batch search after pruning, against device memory",
}
#: fp32 ms per step at batch 64, 1 thread, measured on the 2-core CPU machine where scaletrain is developed
#: (docs/precision-and-devices.md): channels-first, channels-last
DEVELOPMENT_CPU_MS = {"lenet": (26.6, 20.7), "resnet20": (172.6, 142.6)}
LAYOUT_NAMES = {"contiguous": "channels-first", "channels_last": "channels-last"}


def _result(figures: dict[str, Any], part: str) -> dict[str, Any] | None:
    return figures["parts"].get(part, {}).get("result")


def markdown(figures: dict[str, Any], pictures: list[str]) -> str:
    suite, parts = figures["suite"], figures["parts"]
    machine = _result(figures, "machine") or {}
    dry = suite.get("dry_run")
    lines = ["# scaletrain on the GPU machine: tests, figures and CPU scaling", ""]
    if dry:
        lines += ["**Dry run**: every part on a CPU at tiny sizes with synthetic data. The figures below check",
                  "that the suite works; they measure nothing worth reading.", ""]  # fmt: skip
    gpu = machine.get("gpu", "no GPU (torch sees no CUDA device)")
    lines += [
        f"Device: {gpu}; driver {machine.get('driver', '—')}; torch {machine.get('torch_version', '—')}, CUDA "
        f"{machine.get('cuda_version', '—')}; Python {machine.get('python', '—')}; "
        f"CPU {machine.get('cpu_model', '—')} ({machine.get('isa', 'ISA not recorded')}), "
        f"{machine.get('cores', '—')} cores "
        f"(GPU parts on {_core_range(machine.get('gpu_cores'))}; {_lanes(machine)}). "
        f"Started {suite.get('started_at', '—')}, "
        f"{suite.get('seconds', 0):.0f} s so far"
        + (f", finished {suite['finished_at']}." if "finished_at" in suite else "."),
        "",
        "| part | status | seconds | budget |",
        "|---|---|---|---|",
    ]  # fmt: skip
    for name, entry in parts.items():
        budget = entry.get("budget_seconds")
        lines.append(f"| {name} | {entry['status']} | {entry.get('seconds', 0):.0f} | {budget and f'{budget:.0f}'} |")
    lines += ["", *_what_was_run(figures)]
    sections = (
        _tests, device_report_issue50.mixed_precision, _holdout, device_report_issue50.slow_link, _precision,
        _gpu_vs_cpu, _prunetrain, _adaptive_batch, _scaling, _failures,
    )  # fmt: skip
    for section in sections:
        lines += section(figures)
    if pictures:
        lines += ["## Pictures", ""] + [f"![{name}]({name})" for name in pictures] + [""]
    return "\n".join(lines)


def _core_range(cores: list[int] | None) -> str:
    return f"cores {cores[0]}–{cores[-1]}" if cores else "all cores"


def _lanes(machine: dict[str, Any]) -> str:
    lanes = machine.get("lanes") or {}
    return "; ".join(f"{parts} on {_core_range(cores)}" for parts, cores in lanes.items()) or "no CPU parts"


def _what_was_run(figures: dict[str, Any]) -> list[str]:
    suite = figures["suite"]
    lines = [
        "## What was run",
        "",
        f"`{suite.get('command', 'device_suite.py')}` (visit `{suite.get('visit', '—')}`, commit "
        f"`{suite.get('commit', 'unknown')}`), through `scripts/device-suite.sh`. Every part is a process of its "
        "own under a time limit; the GPU parts ran one after another, the CPU parts beside them on their own "
        "cores. What each part's figures are:",
        "",
    ]
    lines += [f"- `{name}`: {PART_NOTES[name]}" for name in figures["parts"] if name in PART_NOTES]
    return [*lines, ""]


def _tests(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "gpu-tests")
    if result is None:
        return []
    lines = ["## GPU tests (`pytest -m gpu`)", ""]
    counts = ", ".join(f"{len(result[kind])} {kind}" for kind in ("passed", "failed", "skipped"))
    lines += [f"{counts} (full output: `gpu-tests.txt`).", ""]
    for kind in ("failed", "passed", "skipped"):
        lines += [f"- {kind.upper()}: `{name}`" for name in result[kind]]
    return [*lines, ""]


def _precision(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "precision")
    if result is None:
        return []
    lines = [
        f"## Precision on {result['device']}: step time and the ratio to fp32 in the same layout",
        "",
        f"{result['inputs']}; forward + backward under autocast + the fused SGD step, median of the timed steps "
        f"(loss scaling not included). Goal (issue 12): bf16 or fp16 ×{PRECISION_GOAL} over fp32 on the ResNets.",
        "",
        "| workload | batch | layout | fp32 ms | bf16 ms | bf16 ratio | fp16 ms | fp16 ratio | goal met |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch, workloads in result["batches"].items():
        for workload, figures_of in workloads.items():
            steps, ratios = figures_of["step_seconds"], figures_of["speedups"]
            for layout in LAYOUT_NAMES:
                if f"fp32/{layout}" not in steps:
                    continue
                best = max((ratios.get(kind, {}).get(layout, 0) for kind in ("bf16", "fp16")), default=0)
                cells = [workload, batch, LAYOUT_NAMES[layout], _ms(steps[f"fp32/{layout}"])]
                for kind in ("bf16", "fp16"):
                    cells += [_ms(steps.get(f"{kind}/{layout}")), _ratio(ratios.get(kind, {}).get(layout))]
                cells.append("yes" if best >= PRECISION_GOAL else "no")
                lines.append("| " + " | ".join(map(str, cells)) + " |")
    return [*lines, ""]


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"×{value:.2f}"


def _gpu_vs_cpu(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "gpu-vs-cpu")
    if result is None:
        return []
    lines = [
        f"## GPU against CPU: fp32 step time at batch {result['batch_size']}",
        "",
        f"The GPU column ran on {next(iter(result['gpu'].values()))['device']}. "
        "CPU: one thread of this machine's CPU, measured right after the GPU. Last column: the development "
        "machine's figure (2-core CPU, 1 thread, docs/precision-and-devices.md).",
        "",
        "| workload | layout | GPU ms | CPU ms (1 thread) | CPU ÷ GPU | development CPU ms |",
        "|---|---|---|---|---|---|",
    ]
    for workload, gpu in result["gpu"].items():
        cpu = result["cpu"].get(workload, {})
        for index, layout in enumerate(LAYOUT_NAMES):
            on_gpu = gpu["step_seconds"].get(f"fp32/{layout}")
            on_cpu = cpu.get("step_seconds", {}).get(f"fp32/{layout}")
            ratio = _ratio(on_cpu / on_gpu) if on_gpu and on_cpu else "—"
            known = DEVELOPMENT_CPU_MS.get(workload)
            reference = f"{known[index]:.1f}" if known and result["batch_size"] == 64 else "—"
            cells = (workload, LAYOUT_NAMES[layout], _ms(on_gpu), _ms(on_cpu), ratio, reference)
            lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def _prunetrain(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "prunetrain")
    if result is None:
        return []
    runs = result["runs"]
    dense = runs["dense"]
    lines = [
        "## PruneTrain on the GPU: does pruning save time on one GPU?",
        "",
        f"`benchmarks/prunetrain.py {' '.join(result['flags'])}`. The Dortmund thesis found pruning alone saved "
        "no time on one GPU; per-epoch training seconds (evaluation excluded) side by side:",
        "",
        "| run | device | parameters | MFLOPs/sample | test accuracy | training s | ratio to dense | s per epoch |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        ratio = run["train_seconds"] / dense["train_seconds"] if dense["train_seconds"] else None
        lines.append(
            f"| {name} | {run.get('device', '—')} | {run['parameters']:,} | {run['flops_per_sample'] / 1e6:.2f} | "
            f"{run['test_accuracy']:.4f} | {run['train_seconds']:.1f} | {_ratio(ratio)} | "
            f"{', '.join(map(str, run['seconds_per_epoch']))} |"
        )
    for name, run in runs.items():
        if name == "dense":
            continue
        shrunk = [i for i, count in enumerate(run["parameters_per_epoch"]) if count < run["parameters_initial"]]
        if shrunk:
            after = statistics.median(run["seconds_per_epoch"][i] for i in shrunk)
            same = statistics.median(dense["seconds_per_epoch"][i] for i in shrunk)
            lines += ["", f"{name}: epochs on the pruned network (epochs {', '.join(str(i + 1) for i in shrunk)}) "
                      f"took {after:.2f} s (median) against {same:.2f} s for the same epochs dense: "
                      f"{100 * (1 - after / same):+.1f} % saved."]  # fmt: skip
        else:
            lines += ["", f"{name}: nothing was pruned within the run, so no epoch on a smaller network was timed."]
    return [*lines, ""]


def _adaptive_batch(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "adaptive-batch")
    if result is None:
        return []
    runs = result["runs"]
    lines = [
        "## Batch adaptation after pruning, against device memory",
        "",
        f"`benchmarks/adaptive_batch.py {' '.join(result['flags'])}`; its goal (every search's batch peaks within "
        f"10 % under the budget): {'met' if result.get('met') else 'not met'}.",
        "",
        "| epoch | " + " | ".join(f"{name}: s, batch, parameters" for name in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    epochs = min(len(run["seconds_per_epoch"]) for run in runs.values())
    for epoch in range(epochs):
        cells = [
            f"{seconds[epoch]}, {run['batch_per_epoch'][epoch]}, {run['parameters_per_epoch'][epoch]:,}"
            for run in runs.values()
            for seconds in [run["seconds_per_epoch"]]
        ]
        lines.append(f"| {epoch + 1} | " + " | ".join(cells) + " |")
    lines += ["", "| search after epoch | parameters | batch | peak ÷ budget | trial steps |", "|---|---|---|---|---|"]
    for search in runs.get("--batch-budget", {}).get("searches", []):
        share = search["peak_bytes"] / search["budget_bytes"] if search["peak_bytes"] else None
        lines.append(
            f"| {search['epoch'] + 1} | {search['parameters']:,} | {search['batch_size']} | {_number(share)} | "
            f"{len(search['probes'])} |"
        )
    return [*lines, ""]


def _scaling(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "scaling")
    if result is None:
        return []
    lines = [
        f"## CPU scaling on {result['cores']} cores (one process per core, 1 torch thread each)",
        "",
        "Speedup = batches/s ÷ the one-process `local` run's; efficiency = speedup ÷ workers. Predictions from a "
        "profile measured on these cores before the runs; error = |predicted − measured| ÷ measured.",
        "",
    ]
    for name, sweep in result["sweeps"].items():
        lines += _sweep(name, sweep) if "workload" in sweep else [f"### {name}: {sweep['status']}", ""]
    return lines


def _holdout(figures: dict[str, Any]) -> list[str]:
    result = _result(figures, "holdout")
    if result is None:
        return []
    held = "held out: chosen" if result.get("held_out") else "dry run: a tiny case, not the held-out ones, chosen"
    lines = [
        f"## Prediction at scale, held out (issue 50, part 2): {result['cores']} cores, one process per core",
        "",
        f"Cases {held} on {result.get('chosen_on', '—')} before any run of them (`benchmarks/device_holdout.py`), "
        "predicted by both models from a profile measured on these cores before the runs, with the models as "
        "they are. Error = |predicted − measured| ÷ measured speedup; Kendall τ over the pairs of strategies "
        "whose measured speedups are more than 5 % apart.",
        "",
        "| case | workers | configurations | thesis error | refined error | τ thesis | τ refined |",
        "|---|---|---|---|---|---|---|",
    ]
    every: list[dict[str, Any]] = []
    for name, sweep in result["sweeps"].items():
        rows = [row for row in sweep.get("predictions", []) if row["workers"] > 1]
        every += rows
        for workers in sorted({row["workers"] for row in rows}, reverse=True):
            mine = [row for row in rows if row["workers"] == workers]
            order = sweep.get("ranking", {}).get(str(workers), {})
            lines.append(
                f"| {name} | {workers} | {len(mine)} | "
                f"{_percent(statistics.mean(row['thesis_error_percent'] for row in mine))} | "
                f"{_percent(statistics.mean(row['refined_error_percent'] for row in mine))} | "
                f"{_tau(order.get('thesis_kendall_tau'))} | {_tau(order.get('refined_kendall_tau'))} |"
            )
    if every:
        lines.append(
            f"| **all** | | {len(every)} | {_percent(statistics.mean(row['thesis_error_percent'] for row in every))} | "
            f"{_percent(statistics.mean(row['refined_error_percent'] for row in every))} | | |"
        )
    lines.append("")
    for name, sweep in result["sweeps"].items():
        lines += _sweep(name, sweep) if "workload" in sweep else [f"### {name}: {sweep['status']}", ""]
    return lines


def _failures(figures: dict[str, Any]) -> list[str]:
    lines = []
    for name, entry in figures["parts"].items():
        if entry.get("error_tail"):
            lines += [f"### {name}: {entry['status']}", "", "```", entry["error_tail"][-1500:], "```", ""]
    return ["## Failed parts: the end of their output", "", *lines] if lines else []


def pictures(figures: dict[str, Any], out: Path) -> list[str]:
    """``loss-curves.png`` (issue 50's precision part), ``speedup-SWEEP.png`` for the held-out cases and the scaling
    sweeps, and ``precision.png`` (issue 12's ratios): at most :data:`MAX_PICTURES`; their names."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    names = []
    curves = device_report_issue50.loss_curves_picture(figures, out)
    names += [curves] if curves else []
    sweeps = [
        (name, sweep)
        for part in ("holdout", "scaling")
        for name, sweep in (_result(figures, part) or {"sweeps": {}})["sweeps"].items()
    ]
    room = MAX_PICTURES - len(names) - (1 if _result(figures, "precision") else 0)
    for name, sweep in sweeps[: max(room, 0)]:
        rows = [row for row in sweep["rows"] if row.get("speedup_common") is not None and row["strategy"] != "local"]
        if not rows:
            continue
        figure, axes = pyplot.subplots(figsize=(6.4, 4.4))
        most = max(row["workers"] for row in rows)
        axes.plot([1, most], [1, most], color="grey", linestyle=":", label="ideal")
        for index, strategy in enumerate(sorted({row["strategy"] for row in rows})):
            colour = f"C{index}"
            mine = sorted((row["workers"], row["speedup_common"]) for row in rows if row["strategy"] == strategy)
            axes.plot(*zip(*mine, strict=True), marker="o", color=colour, label=f"{strategy} measured")
            guess = sorted((row["workers"], row["refined_speedup"]) for row in sweep.get("predictions", [])
                           if row["strategy"] == strategy)  # fmt: skip
            if guess:
                axes.plot(*zip(*guess, strict=True), linestyle="--", color=colour, label=f"{strategy} refined model")
        axes.set(xlabel="workers", ylabel="speedup against one local process", title=f"{name}: speedup")
        axes.legend(fontsize=7)
        path = out / f"speedup-{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        pyplot.close(figure)
        names.append(path.name)
    result = _result(figures, "precision")
    if result:
        labels, values = [], {"bf16": [], "fp16": []}
        for batch, workloads in result["batches"].items():
            for workload, figures_of in workloads.items():
                for layout, short in (("contiguous", "NCHW"), ("channels_last", "NHWC")):
                    labels.append(f"{workload}\n×{batch} {short}")
                    for kind in values:
                        values[kind].append(figures_of["speedups"].get(kind, {}).get(layout, 0.0))
        figure, axes = pyplot.subplots(figsize=(max(6.4, 0.8 * len(labels)), 4.4))
        width = 0.4
        for offset, (kind, heights) in enumerate(values.items()):
            axes.bar([i + (offset - 0.5) * width for i in range(len(labels))], heights, width, label=kind)
        axes.axhline(PRECISION_GOAL, color="grey", linestyle=":", label=f"goal ×{PRECISION_GOAL}")
        axes.set_xticks(range(len(labels)), labels, fontsize=7)
        axes.set(ylabel="fp32 step ÷ step", title=f"Step time against fp32 on {result['device']}")
        axes.legend(fontsize=7)
        path = out / "precision.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        pyplot.close(figure)
        names.append(path.name)
    return names
