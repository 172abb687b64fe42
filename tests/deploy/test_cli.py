"""``scaletrain deploy kubernetes``: the command line renders what the Python API renders."""

from __future__ import annotations

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
    ]:
        result = run_cli("deploy", "kubernetes", "lenet", "--workers", "2", *args, cwd=tmp_path)
        assert result.returncode == 2
        assert len(result.stderr.strip().splitlines()) == 1 and fix in result.stderr
