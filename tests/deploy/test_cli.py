"""``scaletrain deploy kubernetes`` and ``kubernetes-bench``: the command line renders what the Python API
renders, and a sweep's run folders, copied off the volume, are what ``scaletrain bench`` assembles."""

from __future__ import annotations

import csv
import json
import tomllib
from pathlib import Path

import yaml
from tests.helpers import run_cli

import scaletrain


def test_stdout_is_the_api_result() -> None:
    result = run_cli(
        "deploy", "kubernetes", "lenet", "--workers", "2", "--strategy", "ps", "--sync", "async", "--steps", "40",
        "--batch-size", "16", "-o", "x=1", "--image", "scaletrain:cpu", "--operator", "jobset", "--cpus", "2",
        "--memory", "2Gi", "--node-selector", "pool=cpu", "--name", "fm",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    expected = scaletrain.deploy_kubernetes(
        "lenet",
        image="scaletrain:cpu",
        name="fm",
        operator="jobset",
        cpus=2,
        memory="2Gi",
        node_selector={"pool": "cpu"},
        workers=2,
        strategy="ps",
        sync="async",
        steps=40,
        batch_size=16,
        options={"x": "1"},
    )
    assert objects == expected


def test_elastic_pytorchjob_stdout_is_the_api_result() -> None:
    result = run_cli(
        "deploy", "kubernetes", "lenet", "--workers", "2", "--image", "scaletrain:cpu", "--operator", "kubeflow",
        "--min-workers", "1", "--max-workers", "3", "--name", "fm",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    expected = scaletrain.deploy_kubernetes(
        "lenet", image="scaletrain:cpu", name="fm", operator="kubeflow", workers=2, min_workers=1, max_workers=3
    )
    assert objects == expected
    (job,) = [obj for obj in objects if obj["kind"] == "PyTorchJob"]
    assert (job["spec"]["elasticPolicy"]["minReplicas"], job["spec"]["elasticPolicy"]["maxReplicas"]) == (1, 3)


def test_technique_options_and_flags_reach_the_pods() -> None:
    result = run_cli(
        "deploy", "kubernetes", "lenet", "--image", "scaletrain:cpu", "--technique", "prunetrain",
        "-T", "step=subgradient", "--lasso-ratio", "0.5", "--precision", "bf16",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (config_map,) = [obj for obj in yaml.safe_load_all(result.stdout) if obj["kind"] == "ConfigMap"]
    run = tomllib.loads(config_map["data"]["run.toml"])
    assert (run["technique"], run["precision"]) == ("prunetrain", "bf16")
    assert run["technique_options"] == {"step": "subgradient", "ratio": 0.5}


def test_folder_and_config_file(tmp_path: Path) -> None:
    config = tmp_path / "run.toml"
    config.write_text("epochs = 3\nlr = 0.02\n")
    out = tmp_path / "k8s"
    result = run_cli(
        "deploy", "kubernetes", "lenet", "--config", str(config), "--lr", "0.03", "--workers", "2",
        "--image", "scaletrain:cpu", "--out", str(out),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "kubectl apply -k" in result.stdout
    (config_map,) = [yaml.safe_load(path.read_text()) for path in out.glob("*-configmap-*.yaml")]
    assert "epochs = 3\nlr = 0.03\n" in config_map["data"]["run.toml"]
    assert (out / "kustomization.yaml").exists()


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, fix in [
        (["--image", "x", "--memory", "lots"], "--memory"),
        (["--image", "x", "--resume"], "--resume"),
        (["--image", "x", "--name", "UPPER"], "--name"),
        (["--image", "x", "--operator", "kubeflow", "--min-workers", "3", "--max-workers", "2"], "--max-workers"),
    ]:
        result = run_cli("deploy", "kubernetes", "lenet", "--workers", "2", *args, cwd=tmp_path)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1 and fix in result.stderr


SWEEP = ["--workers", "1,2", "--strategies", "allreduce-join,ps-central-async", "--batch-sizes", "16", "--steps", "20"]


def test_bench_sweep_stdout_is_the_api_result() -> None:
    result = run_cli(
        "deploy", "kubernetes-bench", "lenet", *SWEEP, "--repeats", "2", "--lr", "0.05", "-o", "x=1",
        "--image", "scaletrain:cpu", "--operator", "jobset", "--cpus", "2", "--name", "sweep",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    objects = list(yaml.safe_load_all(result.stdout))
    expected = scaletrain.deploy_kubernetes_bench(
        "lenet",
        image="scaletrain:cpu",
        name="sweep",
        operator="jobset",
        cpus=2,
        workers=(1, 2),
        strategies=("allreduce-join", "ps-central-async"),
        batch_sizes=(16,),
        steps=20,
        repeats=2,
        settings={"lr": 0.05},
        options={"x": "1"},
    )
    assert objects == expected
    assert sum(obj["kind"] == "JobSet" for obj in objects) == 2 * 2 * 2


def test_bench_assembles_the_sweep_from_the_volume(tmp_path: Path) -> None:
    """What the README says to do after a sweep: copy /runs/NAME off the volume and run ``scaletrain bench``
    with the same grid there; it finds each run's summary.json and trains nothing (an empty --data-dir
    would make any training fail)."""
    rendered = run_cli("deploy", "kubernetes-bench", "lenet", *SWEEP, "--image", "x", "--name", "fm")
    assert rendered.returncode == 0, rendered.stderr
    copy = tmp_path / "fm"  # what `kubectl cp` of /runs/fm gives
    rates = {}
    for number, obj in enumerate(yaml.safe_load_all(rendered.stdout)):
        if obj["kind"] != "ConfigMap":
            continue
        run = tomllib.loads(obj["data"]["run.toml"])
        folder = copy / Path(run["out"]).relative_to("/runs/fm")
        folder.mkdir(parents=True)
        rates[str(folder)] = 10.0 + number  # a different figure for every run
        summary = {
            "batch_size": run["batch-size"],
            "metric": "test_accuracy",
            "test_accuracy": 0.5,
            "steps": run["steps"],
            "steps_per_epoch": 100,
            "batches_per_second": rates[str(folder)],
            "samples_per_second": rates[str(folder)] * run["batch-size"],
            "wall_seconds": 3.0,
        }
        (folder / "summary.json").write_text(json.dumps(summary))
    assert len(rates) == 4
    empty = tmp_path / "no-data"
    empty.mkdir()
    result = run_cli("bench", "lenet", *SWEEP, "--out", str(copy), "--data-dir", str(empty), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("measured before, kept") == 4
    with (copy / "results.csv").open() as file:
        rows = list(csv.DictReader(file))
    assert {row["run_dir"]: float(row["batches_per_second"]) for row in rows} == rates
    assert all(row["status"] == "ok" for row in rows) and (copy / "report.md").exists()


def test_bad_bench_sweep_is_one_line_and_exit_2(tmp_path: Path) -> None:
    for args, fix in [
        (["--strategies", "allreduce-async"], "allreduce-async"),
        (["--workers", "1,two"], "--workers"),
        (["--network", "1gbit"], "--network"),
        (["--framework", "scaletrain,tensorflow"], "--framework cannot be set for a deployment"),
        (["--name", "a-name-that-is-far-too-long-for-the-runs"], "--name"),
        (["--quick"], "--preset"),
    ]:
        result = run_cli("deploy", "kubernetes-bench", "lenet", "--image", "x", *args, cwd=tmp_path)
        assert result.returncode == 2, result.stdout
        assert len(result.stderr.strip().splitlines()) == 1 and fix in result.stderr, result.stderr
