"""The held-out protocol: the named validation cases, their commands, and rescoring saved validations."""

from __future__ import annotations

import csv
import shlex
import shutil
from pathlib import Path

import pytest
from tests.helpers import REPO

import scaletrain.cli.estimate as estimate_cli
from scaletrain.cli import main
from scaletrain.errors import ConfigError
from scaletrain.measure.cases import CASES, rescore, select_cases, summarize, write_summary
from scaletrain.measure.sweep import SweepConfig, plan_runs
from scaletrain.measure.validate import ValidationConfig

SAVED = REPO / "results" / "validation"


def test_the_selections_split_the_cases_and_every_held_out_case_is_not_adjusted():
    held_out, adjusted = select_cases("holdout"), select_cases("adjusted")
    assert held_out and adjusted
    assert {case.name for case in held_out} | {case.name for case in adjusted} == set(CASES)
    assert not {case.name for case in held_out} & {case.name for case in adjusted}
    assert all(not case.adjusted for case in held_out) and all(case.adjusted for case in adjusted)
    # issue 30's hold-out: workloads, batch sizes and links none of the adjusted-on cases has together
    seen = {(case.workload, case.network, case.batch_size) for case in adjusted}
    assert not {(case.workload, case.network, case.batch_size) for case in held_out} & seen
    assert {"resnet20", "ptb-lstm"} <= {case.workload for case in held_out}
    assert sum(len(case.strategies) * sum(n > 1 for n in case.workers) for case in held_out) >= 16
    assert [case.name for case in select_cases("lenet-loopback,resnet20-50mbit")] == [
        "lenet-loopback",
        "resnet20-50mbit",
    ]
    with pytest.raises(ConfigError, match="--cases takes holdout, adjusted, all or case names"):
        select_cases("lenet-nowhere")


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_case_s_printed_command_measures_that_very_case(name, monkeypatch, tmp_path):
    """The command each report prints is parsed by the real CLI into the validation the case runs."""
    case = CASES[name]
    given = {}

    def stand_in(workload, **settings):  # records what the CLI asks for and writes the report it prints
        given.update(settings, workload=workload)
        (settings["out"] / "validation.md").write_text("report")

    monkeypatch.setattr(estimate_cli, "validate", stand_in)
    command = shlex.split(case.command())
    assert command[:2] == ["scaletrain", "estimate"]
    assert main([*command[1:], "--out", str(tmp_path)]) == 0
    settings = {key: value for key, value in given.items() if value is not None and key not in ("workload", "out")}
    assert ValidationConfig(given["workload"], tmp_path, **settings) == case.validation(tmp_path)


def test_the_saved_adjusted_validations_are_predicted_again_from_their_own_files():
    case = CASES["lenet-100mbit"]
    rows = rescore(case, SAVED / case.name)
    with (SAVED / case.name / "validation.csv").open(newline="") as file:
        saved = {(row["strategy"], int(row["workers"])): float(row["measured_speedup"]) for row in csv.DictReader(file)}
    assert {(row["strategy"], row["workers"]): row["measured_speedup"] for row in rows} == saved
    for row in rows:
        for model in ("thesis", "refined"):
            error = abs(row[f"{model}_speedup"] - row["measured_speedup"]) / row["measured_speedup"] * 100
            assert row[f"{model}_error_percent"] == pytest.approx(error)


def test_the_summary_keeps_the_adjusted_on_and_the_held_out_errors_apart(tmp_path):
    def row(strategy, workers, measured, refined):
        return {"strategy": strategy, "workers": workers, "measured_speedup": measured, "thesis_speedup": measured,
                "refined_speedup": refined, "thesis_error_percent": 0.0,
                "refined_error_percent": abs(refined - measured) / measured * 100}  # fmt: skip

    held = select_cases("holdout")[-1]  # whichever case is held out now
    results = {
        "lenet-loopback": [row("allreduce-join", 1, 1.0, 1.5), row("allreduce-join", 2, 2.0, 2.2)],
        held.name: [row("allreduce-join", 2, 1.0, 1.3), row("ps-sharded-join", 2, 1.2, 1.2)],
    }
    summary = summarize(results)
    # one worker is the reference's own setting: not judged
    assert summary["groups"]["adjusted"]["configurations"] == 1
    assert summary["groups"]["adjusted"]["errors"] == {"thesis": 0.0, "refined": pytest.approx(10.0)}
    assert summary["groups"]["holdout"]["configurations"] == 2
    assert summary["groups"]["holdout"]["errors"]["refined"] == pytest.approx(15.0)
    # measured: sharded first; the refined model puts all-reduce first: the one pair apart is reversed
    ranking = summary["cases"][held.name]["ranking"]["2"]
    assert ranking["measured"] == ["ps-sharded-join", "allreduce-join"] and ranking["refined_kendall_tau"] == -1.0
    report = write_summary(summary, tmp_path).read_text()
    assert "| machine not recorded | held out | 2 | 0.0 % | 15.0 % | — |" in report  # rows without a machine or range
    assert f"| {held.name} | held out | 2 | 0.0 % | 15.0 % | — | 2: -1.00 (+1.00) |" in report
    assert f"- {held.name} ({held.why}; measured on machine not recorded): `{held.command()}`" in report


def test_the_summary_keeps_machines_apart_and_gives_the_ranges_coverage(tmp_path):
    def row(strategy, measured, refined, low, high, machine):
        return {"strategy": strategy, "workers": 2, "measured_speedup": measured, "thesis_speedup": measured,
                "refined_speedup": refined, "thesis_error_percent": 0.0, "machine": machine,
                "refined_error_percent": abs(refined - measured) / measured * 100, "refined_speedup_low": low,
                "refined_speedup_high": high, "refined_inside": low <= measured <= high}  # fmt: skip

    epyc, xeon = "AMD EPYC (AVX2), 2 cores, torch 2.13.0+cpu", "Made-up Xeon (AVX512), 16 cores, torch 2.13.0+cpu"
    held = [case.name for case in select_cases("holdout")][:2]
    results = {
        held[0]: [row("allreduce-join", 1.0, 1.1, 0.9, 1.2, epyc), row("ps-sharded-join", 1.0, 1.3, 1.2, 1.4, epyc)],
        held[1]: [row("allreduce-join", 2.0, 2.0, 1.8, 2.2, xeon)],
    }
    summary = summarize(results)
    # one machine's cases are never pooled with another's
    assert set(summary["machines"]) == {epyc, xeon}
    assert summary["machines"][epyc]["holdout"]["configurations"] == 2
    assert summary["machines"][epyc]["holdout"]["coverage"]["coverage"] == 0.5
    assert summary["machines"][xeon]["holdout"]["coverage"]["coverage"] == 1.0
    assert summary["groups"]["holdout"]["coverage"]["inside"] == 2 and summary["cases"][held[1]]["machine"] == xeon
    report = write_summary(summary, tmp_path).read_text()
    assert f"| {epyc} | held out | 2 | 0.0 % | 20.0 % | 1 of 2 (50 %) |" in report
    assert f"| {xeon} | held out | 1 | 0.0 % | 0.0 % | 1 of 1 (100 %) |" in report
    assert f"| {held[0]} | ps-sharded-join | 2 | 1.000 | 1.000 | 1.300 | 1.200–1.400 | no | 30.0 % |" in report
    assert f"measured on {xeon}): `" in report


def test_a_case_without_a_saved_validation_is_one_line_and_nothing_is_written(capsys, tmp_path):
    out = tmp_path / "out"
    saved = tmp_path / "saved"
    shutil.copytree(SAVED / "lenet-loopback", saved / "lenet-loopback")  # the first case is there, not the second
    assert main(["estimate", "--validate", "--cases", "all", "--rescore", str(saved), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no saved validation of lenet-100mbit" in err, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["lenet", "--cases", "holdout"], "--cases runs each case with its own flags: drop WORKLOAD"),
        (["--cases", "holdout", "--workers", "2", "--network", "50mbit"], "drop --network, --workers"),
        (["--cases", "holdout", "--wire", "bf16"], "drop --wire"),
        (["--rescore", "results/validation"], "--rescore FOLDER goes with --cases WHICH"),
        (["--cases", "nothing"], "--cases takes holdout, adjusted, all or case names"),
    ],
)
def test_cases_refuse_flags_they_fix_themselves(args, fragment, capsys, tmp_path):
    assert main(["estimate", "--validate", *args, "--out", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "v").exists()


@pytest.mark.parametrize("flag", [["--cases", "holdout"], ["--rescore", "results/validation"]])
def test_cases_without_validate_are_refused_not_ignored(flag, capsys):
    assert main(["estimate", "--t-grad", "0.1", "--t-comm", "0.01", *flag]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--cases and --rescore compare the models with runs: add --validate" in err, err


def test_the_reference_runs_alone_at_one_worker_when_no_strategy_does(tmp_path):
    config = SweepConfig("lenet", Path(tmp_path), workers=(1, 2), strategies=("local", "allreduce-join"),
                         local_only_at=(1,))  # fmt: skip
    runs, _ = plan_runs(config)
    assert sorted((run.label, run.workers) for run in runs) == [("allreduce-join", 2), ("local", 1)]
