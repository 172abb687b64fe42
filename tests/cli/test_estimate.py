"""``scaletrain estimate`` and ``scaletrain profile`` as a user runs them (real subprocesses)."""

from __future__ import annotations

import pytest
from tests.helpers import run_cli

from scaletrain.api import estimate_range, recommend
from scaletrain.cli import main
from scaletrain.cli.estimate import strategy_choices
from scaletrain.estimate.models import THESIS_TYPES
from scaletrain.estimate.profile import Profile
from scaletrain.estimate.thesis import speedups
from scaletrain.measure.machine import machine_info
from scaletrain.parallel.strategies import STRATEGIES, all_specs, parse_spec
from scaletrain.tensors.codec import TensorLayout, WireCodec
from scaletrain.workloads import create_workload

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_csv_prints_the_thesis_speedups_for_one_to_n_workers():
    result = run_cli(
        "estimate", "--t-grad", "0.763", "--t-comm", "0.210", "--type", "async", "--server", "central",
        "--workers", "8", "--batches", "128", "--output", "csv", "--case", "worst",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    values = [float(v) for v in result.stdout.strip().split(";")]
    expected = speedups(
        t_grad=0.763, t_comm=0.210, kind="async", server="central", workers=8, batches=128, case="worst"
    )
    assert values == pytest.approx(expected, abs=1e-4)
    # worst case by hand at N = 8: D·t_grad / ((D/N)(2N·t_comm + t_grad))
    assert values[-1] == pytest.approx(128 * 0.763 / (16 * (16 * 0.210 + 0.763)), abs=1e-4)


def test_csv_keeps_small_speedups_to_a_millionth():
    """Transfers that dwarf the gradient give speedups far below 1; the csv must not round them away."""
    settings = {"t_grad": 0.01, "t_comm": 0.6, "kind": "sync-join", "server": "central", "workers": 12, "batches": 128}
    result = run_cli(
        "estimate", "--t-grad", "0.01", "--t-comm", "0.6", "--workers", "12", "--output", "csv",
        "--case", "worst",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected = speedups(**settings, case="worst")
    assert min(expected) < 0.01  # four fixed decimals would keep two significant digits at most
    assert [float(v) for v in result.stdout.strip().split(";")] == pytest.approx(expected, rel=1e-6, abs=0)


def test_single_and_plot_outputs(tmp_path):
    single = run_cli("estimate", "--t-grad", "0.758", "--t-comm", "0.033", "--server", "distributed", "--workers", "8")
    assert single.returncode == 0, single.stderr
    assert float(single.stdout) == pytest.approx(7.4337, abs=1e-4)  # sync-join, D = 128 (thesis defaults)
    picture = tmp_path / "curve.png"
    plot = run_cli("estimate", "--t-grad", "0.758", "--t-comm", "0.033", "--workers", "4", "--output", "plot",
                   "--plot-file", str(picture))  # fmt: skip
    assert plot.returncode == 0, plot.stderr
    assert picture.read_bytes()[:8] == PNG_MAGIC and picture.stat().st_size > 10_000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--t-grad", "0.7"], "both --t-grad and --t-comm"),
        ([], "exactly one of"),
        (["--t-grad", "1", "--t-comm", "0.1", "--workers", "1,2"], "one number"),
        (["--t-grad", "1", "--t-comm", "0.1", "--recommend"], "--max-workers"),
        (["--t-grad", "1", "--t-comm", "0.1", "--strategy", "allreduce", "--type", "async"], "synchronous"),
        (["--t-grad", "1", "--t-comm", "0.1", "--validate"], "--validate runs a workload"),
    ],
)
def test_impossible_requests_exit_2_with_the_fix(args, fragment):
    result = run_cli("estimate", *args)
    assert result.returncode == 2
    assert fragment in result.stderr


NUMBERS = ["--t-grad", "0.5", "--t-comm", "0.1"]


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--workers", "0"], "--workers must be a whole number ≥ 1, got 0"),
        (["--workers", "-3"], "--workers must be a whole number ≥ 1, got -3"),
        (["--t-grad", "nan"], "--t-grad must be > 0"),
        (["--t-grad", "inf"], "--t-grad must be > 0"),
        (["--t-grad", "-1"], "--t-grad must be > 0"),
        (["--t-comm", "nan"], "--t-comm ≥ 0"),
        (["--t-comm", "-0.1"], "--t-comm ≥ 0"),
        (["--batches", "nan"], "--batches must be a number > 0"),
        (["--batches", "0"], "--batches must be a number > 0"),
        (["--batches", "inf"], "--batches must be a number > 0"),
        (["--cores", "0", "--model", "refined"], "--cores must be a whole number ≥ 1"),
        (["--recommend", "--max-workers", "0"], "--max-workers must be ≥ 1"),
        (["--recommend", "--max-workers", "-2"], "--max-workers must be ≥ 1"),
        (["--model", "refined", "--t-grad", "nan"], "--t-grad must be > 0"),
    ],
)
def test_numbers_that_make_no_sense_exit_2_with_one_line(args, fragment, capsys):
    """In-process through the real entry point (the subprocess case below shows there is no traceback)."""
    assert main(["estimate", *NUMBERS, *args]) == 2  # a later --t-grad replaces the one in NUMBERS
    captured = capsys.readouterr()
    assert captured.out == "" or "note:" in captured.out
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--timeout", "nan"], "--timeout must be a number of seconds > 0"),
        (["--timeout", "0"], "--timeout must be a number of seconds > 0"),
        (["--batch-size", "0"], "--batch-size must be ≥ 1"),
        (["--repeats", "0"], "--repeats"),
        (["--concurrency", "0"], "--concurrency must be ≥ 1"),
        (["--split-workers", "0"], "split worker counts must be ≥ 1"),
        (["--wire", "powersgd", "-W", "rank=0"], "-W rank=0: powersgd's rank must be a whole number >= 1"),
        (["--wire", "topk", "-W", "ratio=2"], "-W ratio=2: topk's ratio must be in (0, 1]"),
        (["-W", "rank=2"], "wire codec 'fp32' takes no options (-W), got rank"),
        (["--wire", "powersgd", "-W", "rank"], "wire option 'rank' must look like KEY=VALUE, e.g. -W rank=2"),
    ],
)
def test_profile_numbers_are_refused_before_anything_is_measured(args, fragment, capsys):
    assert main(["profile", "lenet", *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--runs", "0"], "--runs and --launches must be ≥ 1"),
        (["--steps", "0"], "steps must be a whole number ≥ 1"),
        (["--lr", "nan"], "lr must be a finite number"),
        (["--momentum", "1.5"], "momentum must be in [0, 1)"),
        (["--workers", "0,2"], "--workers must be a whole number ≥ 1, got 0"),
        # profile flags the validation does not carry out are refused, not silently dropped
        (["--exchange-at", "2", "--repeats", "3"], "--validate does not take --exchange-at, --repeats:"),
        (["--wire", "powersgd", "--strategies", "ps-central-join"], "--wire powersgd needs all-reduce"),
        (["--wire", "topk", "-W", "ratio=0"], "topk's ratio must be in (0, 1]"),
    ],
)
def test_validation_numbers_are_refused_before_profiling(args, fragment, capsys, tmp_path):
    assert main(["estimate", "lenet", "--validate", "--out", str(tmp_path / "v"), *args]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and fragment in captured.err, captured.err
    assert not (tmp_path / "v").exists()


def test_strategy_choices_come_from_the_registry(capsys):
    predicted = [name for name, strategy in STRATEGIES.items() if strategy.predicted]
    assert strategy_choices() == [*predicted, *all_specs(predicted_only=True)]
    with pytest.raises(SystemExit) as refused:  # argparse's own one line
        main(["estimate", *NUMBERS, "--strategy", "local"])  # one process: nothing to predict
    assert refused.value.code == 2 and "invalid choice: 'local'" in capsys.readouterr().err


@pytest.mark.parametrize("model", ["thesis", "refined"])
@pytest.mark.parametrize("spec", all_specs(predicted_only=True))
def test_a_spec_sets_strategy_type_and_server(spec, model, capsys):
    """``--strategy SPEC`` = ``--strategy NAME --type T --server S``, and the spec with flags that agree."""
    strategy, server, sync = parse_spec(spec)
    thesis = ["--type", THESIS_TYPES[sync], *(["--server", server] if server else [])]
    printed = []
    modelled = model == "refined" or STRATEGIES[strategy].estimator_terms(server).thesis_server is not None
    for flags in (["--strategy", spec], ["--strategy", strategy, *thesis], ["--strategy", spec, *thesis]):
        code = main(["estimate", *NUMBERS, "--workers", "4", "--output", "csv", "--model", model, *flags])
        if not modelled:  # diloco: the thesis has no formula for a step that talks once in H
            assert code == 2 and "the thesis model has no formula for it" in capsys.readouterr().err
            continue
        assert code == 0
        printed.append(capsys.readouterr().out)
    if not modelled:
        return
    assert printed[0] == printed[1] == printed[2]
    assert len(printed[0].split(";")) == 4


def test_specs_that_differ_predict_differently(capsys):
    for spec in ("ps-central-join", "ps-central-async"):
        assert main(["estimate", *NUMBERS, "--workers", "4", "--strategy", spec]) == 0
    join, asynchronous = (float(line) for line in capsys.readouterr().out.split())
    assert join != asynchronous


@pytest.mark.parametrize(
    ("flags", "fix"),
    [
        (["--strategy", "ps-central-join", "--type", "async"], "drop --type, or use --strategy ps-central-async"),
        (
            ["--strategy", "ps-sharded-split", "--server", "central"],
            "drop --server, or use --strategy ps-central-split",
        ),
        (["--strategy", "allreduce-join", "--server", "central"], "drop --server"),
        (["--strategy", "allreduce-split", "--type", "async"], "drop --type"),
    ],
)
def test_a_spec_and_a_flag_that_disagree_exit_2_with_one_line(flags, fix, capsys):
    assert main(["estimate", *NUMBERS, *flags]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert f"--strategy {flags[1]} conflicts with {flags[2]} {flags[3]}: {fix}" in captured.err
    # Before anything is profiled: with a workload (and no data) it is the same one line.
    assert main(["estimate", "lenet", "--data-dir", "/nonexistent", "--no-download", *flags]) == 2
    assert fix in capsys.readouterr().err


def test_a_conflict_is_one_line_and_no_traceback():
    result = run_cli("estimate", *NUMBERS, "--strategy", "ps-sharded-join", "--type", "async", "--server", "central")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.splitlines() == [
        "scaletrain: error: --strategy ps-sharded-join conflicts with --type async and --server central: "
        "drop --type and --server, or use --strategy ps-central-async"
    ]


def test_an_unwritable_profile_file_is_refused_before_measuring(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    assert main(["profile", "lenet", "--data-dir", "/nonexistent", "--out", str(tmp_path / "a-file" / "p.json")]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "the profile's folder" in captured.err, captured.err


def test_zero_workers_is_one_line_and_no_traceback():
    result = run_cli("estimate", *NUMBERS, "--workers", "0")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if "NumPy" not in line and "_conversion" not in line]
    assert lines == ["scaletrain: error: --workers must be a whole number ≥ 1, got 0"]
    assert result.stdout == ""


def test_recommend_from_the_thesis_table_times():
    result = run_cli("estimate", "--t-grad", "0.821", "--t-comm", "0.811", "--recommend", "--max-workers", "8")
    assert result.returncode == 0, result.stderr
    # 003 §7.1: ResNet34 is best on 8 workers with the distributed server.
    assert "thesis model: 8 worker(s), ps-sharded" in result.stdout


@pytest.mark.multiprocess
def test_profile_then_refined_estimate_from_the_file(tiny_fmnist, tmp_path):
    """The profile is of a PowerSGD rank-1 wire: ``-W`` reaches the codec whose compressed message the
    estimator carries (rank 1: half the factors of the default rank 2; LeNet's biases dense either way)."""
    saved = tmp_path / "lenet.json"
    profiled = run_cli(
        "profile", "lenet", "--batch-size", "32", "--data-dir", str(tiny_fmnist), "--repeats", "2",
        "--round-trips", "2", "--launches", "1", "--concurrency", "2", "--split-workers", "2", "--out", str(saved),
        "--wire", "powersgd", "-W", "rank=1",
    )  # fmt: skip
    assert profiled.returncode == 0, profiled.stderr
    assert "t_grad" in profiled.stdout and "t_comm" in profiled.stdout and str(saved) in profiled.stdout
    measured = Profile.load(saved)
    assert measured.wire == "powersgd" and measured.wire_options == {"rank": "1"}
    layout = TensorLayout.of(list(create_workload("lenet", {}).build_model().parameters()))
    rank_one = WireCodec.of("powersgd", options={"rank": "1"}).steady_payload_bytes(layout)
    assert measured.gradient_bytes == rank_one < WireCodec.of("powersgd").steady_payload_bytes(layout)
    assert measured.default_path().name == "lenet-b32-wpowersgd-rank1.json"
    estimated = run_cli("estimate", "--profile", str(saved), "--model", "refined", "--type", "sync-split",
                        "--workers", "2", "--cores", "2", "--output", "csv")  # fmt: skip
    assert estimated.returncode == 0, estimated.stderr
    values = [float(v) for v in estimated.stdout.split(";")]
    assert len(values) == 2 and all(v > 0 for v in values)
    advice = run_cli("estimate", "--profile", str(saved), "--recommend", "--max-workers", "3")
    assert advice.returncode == 0, advice.stderr
    assert "thesis model:" in advice.stdout and "refined model:" in advice.stdout


def test_a_powersgd_rank_no_matrix_holds_is_refused_before_anything_is_measured(tiny_fmnist, capsys):
    assert main(["profile", "lenet", "--data-dir", str(tiny_fmnist), "--wire", "powersgd", "-W", "rank=501"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1, captured.err
    assert "-W rank=501: the network's widest gradient matrix allows rank 500 at most" in captured.err


def test_a_strategys_own_option_reaches_its_prediction_by_flag_and_by_s(capsys):
    """``--sync-every 16`` and ``-S sync_every=16`` predict the same diloco run, which talks less than the default H;
    an option the strategy does not have is one line, exit 2."""
    base = [
        "estimate",
        *NUMBERS,
        "--workers",
        "4",
        "--output",
        "csv",
        "--model",
        "refined",
        "--strategy",
        "diloco-split",
    ]
    printed = []
    for extra in (["--sync-every", "16"], ["-S", "sync_every=16"], []):
        assert main([*base, *extra]) == 0
        printed.append(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed[0] == printed[1] != printed[2]
    assert float(printed[0].split(";")[-1]) > float(printed[2].split(";")[-1])  # H = 16 talks less than H = 10
    assert main([*base[:-1], "allreduce-split", "-S", "sync_every=16"]) == 2
    assert "--strategy allreduce has no option sync_every" in capsys.readouterr().err


def sampled(machine: dict, spread: float = 0.005) -> Profile:
    """A profile with two launches of t_grad samples 0.1 ± ``spread`` and five round trips, measured on ``machine``."""
    return Profile(
        "planted", 32, t_grad=0.1, t_comm=0.01, weight_bytes=10**6, tensor_bytes=(10**6,), machine=machine,
        samples={"t_grad": [0.1 - spread] * 5 + [0.1 + spread] * 5, "launches": 2,
                 "round_trip": [0.018, 0.019, 0.02, 0.021, 0.022]},
    )  # fmt: skip


def test_the_refined_prediction_prints_its_range_and_csv_keeps_its_format(tmp_path, capsys):
    saved = sampled(machine_info()).save(tmp_path / "p.json")
    flags = ["estimate", "--profile", str(saved), "--model", "refined", "--strategy", "allreduce-join"]
    flags += ["--workers", "2"]
    assert main(flags) == 0
    captured = capsys.readouterr()
    low, point, high = estimate_range(Profile.load(saved), strategy="allreduce-join", workers=2)
    assert captured.out == f"{point:.9g} ({low:#.3g}–{high:#.3g})\n"  # e.g. 1.77777778 (1.52–2.07)
    assert captured.err == ""  # measured on this machine: no note
    assert main([*flags, "--output", "csv"]) == 0
    assert [float(v) for v in capsys.readouterr().out.strip().split(";")] == pytest.approx([1.0, point], rel=1e-8)
    assert main([*flags[:4], "thesis", *flags[5:]]) == 0  # the thesis model: its number alone
    assert "(" not in capsys.readouterr().out


def test_a_profile_measured_on_another_cpu_is_said_to_be_so_in_one_line(tmp_path, capsys):
    other = {"cpu_model": "Made-up CPU 9000", "isa": "AVX512", "cores": 64, "torch_version": "2.13.0+cpu"}
    saved = sampled(other).save(tmp_path / "p.json")
    assert main(["estimate", "--profile", str(saved), "--workers", "2", "--output", "csv"]) == 0
    captured = capsys.readouterr()
    here = machine_info()
    assert captured.err == (
        f"note: this profile was measured on Made-up CPU 9000 (AVX512), this machine is {here['cpu_model']} "
        f"({here['isa']})\n"
    )
    assert len(captured.out.strip().split(";")) == 2  # the speedups as ever


def test_recommend_says_when_the_best_and_the_runner_up_are_indistinguishable(tmp_path, capsys):
    wide = sampled(machine_info(), spread=0.04).save(tmp_path / "wide.json")
    assert main(["estimate", "--profile", str(wide), "--recommend", "--max-workers", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    advice = recommend(Profile.load(wide), max_workers=2)["refined"]
    best, rival = advice["configuration"], advice["runner_up"]["configuration"]
    assert advice["indistinguishable"]
    assert lines[1].startswith(f"refined model: 2 worker(s), {best}, predicted speedup {advice['speedup']:.2f} (")
    assert lines[2].startswith(f"refined model: {best} and {rival} on 2 worker(s) are indistinguishable: their ")
    assert lines[2].endswith(" overlap") and len(lines) == 3
    narrow = sampled(machine_info(), spread=0.0).save(tmp_path / "narrow.json")
    assert main(["estimate", "--profile", str(narrow), "--recommend", "--max-workers", "2"]) == 0
    assert "indistinguishable" not in capsys.readouterr().out
