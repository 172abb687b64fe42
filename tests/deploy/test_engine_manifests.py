"""``deploy kubernetes --framework tensorflow|mxnet``: the foreign engines' runs as pods. Every object validates
as ``test_manifests`` validates scaletrain's own; each pod's start script, run here with its variables from
the manifest and a fake index (a stand-in for the engine's python prints what the program would get), gives
the ``TF_CONFIG`` or ``DMLC_*`` variables that the engine's own launcher gives that process, with the pods'
DNS names; the init step prepares what the program reads; bad input is one line and exit 2, nothing written;
the image's ``ENGINES`` build argument is wired from the build script to ``scaletrain engines install``."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.deploy.test_manifests import validate
from tests.helpers import REPO, run_cli

import scaletrain
from scaletrain.cli import main
from scaletrain.deploy.engines import IMAGE_ENGINES
from scaletrain.engines.base import Host
from scaletrain.engines.cluster import prepare_pod, run_json
from scaletrain.engines.install import ENV_ENGINES, MARKER
from scaletrain.engines.layouts import engine_run
from scaletrain.engines.prepare import prepare
from scaletrain.engines.registry import ENGINES

NAME, PORT, POD_IP = "fm", 29500, "10.1.2.3"
#: (strategy, workers, servers, processes of TensorFlow, of MXNet)
LAYOUTS = [
    ("local", 1, None, 1, 1),
    ("allreduce-join", 2, None, 2, 5),  # MXNet's dist_sync: a scheduler and a server per worker
    ("ps-central-async", 2, None, 4, 4),  # TensorFlow: chief, 2 workers, 1 ps
    ("ps-sharded-async", 3, 2, 6, 6),
]
#: what the stand-in for the engine's python prints: its arguments and the variables the program reads
FAKE_PYTHON = """#!/bin/sh
exec python3 -c 'import json, os, sys
names = [n for n in os.environ if n == "TF_CONFIG" or n.startswith("DMLC_")]
print(json.dumps({"args": sys.argv[1:], "env": {n: os.environ[n] for n in names}}))' "$@"
"""


def rendered(framework: str, strategy: str, workers: int, servers: int | None, operator: str) -> list[dict]:
    return scaletrain.deploy_kubernetes(
        "lenet", image="scaletrain:engines", name=NAME, operator=operator, framework=framework,
        strategy=strategy, workers=workers, servers=servers, steps=20, cpus=2, memory="2Gi",
    )  # fmt: skip


def pods(objects: list[dict]) -> list[tuple[str | None, int, dict]]:
    """(replicated job or None, pods of the template, pod template) of the JobSet or the Indexed Job."""
    (training,) = [obj for obj in objects if obj["kind"] in ("Job", "JobSet")]
    if training["kind"] == "Job":
        return [(None, training["spec"]["completions"], training["spec"]["template"])]
    return [
        (job["name"], job["template"]["spec"]["completions"], job["template"]["spec"]["template"])
        for job in training["spec"]["replicatedJobs"]
    ]


def dns_name(operator: str, job: str | None, index: int, position: int) -> str:
    """The name Kubernetes gives a pod: JobSet ``<set>-<job>-<job index>-<pod index>``, Indexed Job ``<job>-<index>``
    under the subdomain of the headless Service."""
    return f"{NAME}-{job}-0-{index}.{NAME}" if operator == "jobset" else f"{NAME}-{position}.{NAME}"


def start(template: dict, index: int, engines: Path) -> dict[str, Any]:
    """Run the engine container's start script as pod ``index`` of its Job; what the program would get."""
    (box,) = template["spec"]["containers"]
    env = {"PATH": os.environ["PATH"], "JOB_COMPLETION_INDEX": str(index), ENV_ENGINES: str(engines)}
    for variable in box.get("env", []):
        if "valueFrom" in variable:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
            env[variable["name"]] = POD_IP
        else:
            env[variable["name"]] = variable["value"]
    result = subprocess.run(box["command"], env=env, capture_output=True, text=True, timeout=30, check=True)
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("engines")
    for name in ENGINES:
        python = folder / name / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(FAKE_PYTHON)
        python.chmod(0o755)
    return folder


@pytest.mark.parametrize("operator", ["none", "jobset"])
@pytest.mark.parametrize("framework", ["tensorflow", "mxnet"])
@pytest.mark.parametrize(
    ("strategy", "workers", "servers", "tensorflow", "mxnet"), LAYOUTS, ids=[x[0] for x in LAYOUTS]
)
def test_every_pod_gets_what_the_engines_launcher_gives_its_process(
    operator: str, framework: str, strategy: str, workers: int, servers: int | None, tensorflow: int, mxnet: int,
    engines: Path,
) -> None:  # fmt: skip
    objects = rendered(framework, strategy, workers, servers, operator)
    for obj in objects:
        validate(obj)
    assert [obj["kind"] for obj in objects][:2] == ["PersistentVolumeClaim", "ConfigMap"]
    run = engine_run(framework, "lenet", strategy, workers, {"steps": 20, "threads": 2})
    if servers is not None:
        run = dataclasses.replace(run, servers=servers)
    assert json.loads(objects[1]["data"]["engine.json"]) == json.loads(run_json(run))
    engine = ENGINES[framework]
    roles = engine.roles(run.mode, run.workers, run.servers)
    assert len(roles) == {"tensorflow": tensorflow, "mxnet": mxnet}[framework]
    started, position = [], 0
    for job, count, template in pods(objects):
        assert template["spec"]["restartPolicy"] == "Never"
        (prepare_box,) = template["spec"]["initContainers"]
        assert prepare_box["command"][:4] == ["scaletrain", "engines", "prepare", "/etc/scaletrain/engine.json"]
        for index in range(count):
            said = start(template, index, engines)
            role, number = said["args"][said["args"].index("--role") + 1], int(said["args"][-1])
            assert job in (None, role)  # a JobSet's replicated job is named after its role
            started.append((role, number, dns_name(operator, job, index, position), said["env"]))
            position += 1
    assert [(role, number) for role, number, _, _ in started] == [(role.name, role.index) for role in roles]
    hosts = [Host(address, PORT, "eth0") for _, _, address, _ in started]
    for role, (_, _, address, env) in zip(roles, started, strict=True):
        expected = engine.environment(role, roles, hosts)
        if framework == "tensorflow":
            assert ("TF_CONFIG" in env) == ("TF_CONFIG" in expected)
            if "TF_CONFIG" in env:
                assert json.loads(env["TF_CONFIG"]) == json.loads(expected["TF_CONFIG"])
        else:  # the pod's own address from the downward API; ps-lite picks its interface in a pod
            expected = {**expected, "DMLC_NODE_HOST": POD_IP, "DMLC_USE_KUBERNETES": "1"} if expected else {}
            expected.pop("DMLC_INTERFACE", None)
            assert env == expected, address


def test_tf_config_lists_every_task_by_its_dns_name(engines: Path) -> None:
    objects = rendered("tensorflow", "ps-sharded-async", 2, None, "jobset")
    chief = pods(objects)[0][2]
    config = json.loads(start(chief, 0, engines)["env"]["TF_CONFIG"])
    assert config == {
        "cluster": {
            "chief": [f"fm-chief-0-0.fm:{PORT}"],
            "worker": [f"fm-worker-0-0.fm:{PORT}", f"fm-worker-0-1.fm:{PORT}"],
            "ps": [f"fm-ps-0-0.fm:{PORT}", f"fm-ps-0-1.fm:{PORT}"],
        },
        "task": {"type": "chief", "index": 0},
    }
    (jobset,) = [obj for obj in objects if obj["kind"] == "JobSet"]
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}


def test_mxnet_indexed_job_names_the_scheduler_and_counts(engines: Path) -> None:
    objects = rendered("mxnet", "allreduce-join", 2, 1, "none")
    ((_, count, template),) = pods(objects)
    assert count == 4  # scheduler, one server, two workers
    said = [start(template, k, engines) for k in range(count)]
    assert [s["env"]["DMLC_ROLE"] for s in said] == ["scheduler", "server", "worker", "worker"]
    assert {(s["env"]["DMLC_PS_ROOT_URI"], s["env"]["DMLC_NUM_SERVER"], s["env"]["DMLC_NUM_WORKER"]) for s in said} == {
        ("fm-0.fm", "1", "2")
    }
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    assert "successPolicy" not in job["spec"]  # every MXNet process ends by itself


def test_the_init_step_prepares_what_a_local_run_prepares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``scaletrain engines prepare`` in a pod: the local launcher's files, the programs beside them, and the
    spec's ``out`` on the volume; the engine must be installed in the image (a marker stands for it here)."""
    run = engine_run("mxnet", "lenet", "allreduce-join", 2, {"steps": 3, "batch_size": 4})
    settings = tmp_path / "engine.json"
    settings.write_text(run_json(run))
    monkeypatch.setenv(ENV_ENGINES, str(tmp_path / "engines"))
    with pytest.raises(scaletrain.ConfigError, match="the mxnet engine is not installed"):
        prepare_pod(settings, tmp_path / "pod", tmp_path / "runs" / "fm")
    root = tmp_path / "engines" / "mxnet"
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").touch()
    (root / MARKER).write_text(json.dumps({"packages": list(ENGINES["mxnet"].packages), "version": "1.9.1"}))
    spec = prepare_pod(settings, tmp_path / "pod", tmp_path / "runs" / "fm")
    local = prepare(run, tmp_path / "local")
    assert {**spec, "order": "", "init": "", "out": ""} == {**local, "order": "", "init": "", "out": ""}
    assert spec["out"] == str(tmp_path / "runs" / "fm") and (tmp_path / "runs" / "fm").is_dir()
    assert json.loads((tmp_path / "pod" / "spec.json").read_text()) == spec
    assert (tmp_path / "pod" / "order.npz").read_bytes() == (tmp_path / "local" / "order.npz").read_bytes()
    assert (tmp_path / "pod" / "programs" / "mxnet_worker.py").is_file()


def test_stdout_is_the_api_result() -> None:
    result = run_cli(
        "deploy", "kubernetes", "lenet", "--framework", "tensorflow", "--strategy", "ps-central-async",
        "--workers", "2", "--steps", "20", "--image", "scaletrain:engines", "--operator", "jobset", "--name", NAME,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    expected = scaletrain.deploy_kubernetes(
        "lenet", image="scaletrain:engines", name=NAME, operator="jobset", framework="tensorflow",
        strategy="ps-central-async", workers=2, steps=20,
    )  # fmt: skip
    assert list(yaml.safe_load_all(result.stdout)) == expected


@pytest.mark.parametrize(
    ("workload", "args", "says"),
    [
        ("lenet", ["--framework", "caffe"], "--framework 'caffe': the frameworks are scaletrain, tensorflow, mxnet"),
        ("lenet", ["--framework", "mxnet", "--strategy", "allreduce-split"], "a foreign engine runs local"),
        ("lenet", ["--framework", "tensorflow", "--strategy", "ps-central-join"], "--strategy ps-central-join"),
        ("vgg16e", ["--framework", "mxnet"], "the mxnet engine has no workload 'vgg16e'"),
        ("ptb-lstm", ["--framework", "tensorflow", "--strategy", "ps-central-async"], "in local and sync mode"),
        ("lenet", ["--framework", "tensorflow", "--operator", "kubeflow"], "--operator kubeflow runs scaletrain's"),
        ("lenet", ["--framework", "mxnet", "--precision", "bf16"], "--precision: the mxnet engine's pods do not"),
        ("lenet", ["--framework", "mxnet", "-o", "x=1"], "workload option x: the engines follow none for lenet"),
        ("lenet", ["--framework", "tensorflow", "--servers", "2"], "runs allreduce-join without servers"),
        ("lenet", ["--framework", "mxnet", "--strategy", "ps-central-async", "--servers", "2"], "has one server"),
        ("lenet", ["--servers", "2"], "--servers sets a foreign engine's parameter servers"),
        ("lenet", ["--framework", "mxnet", "--max-restarts", "2"], "--max-restarts: a foreign engine's Indexed Job"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    workload: str, args: list[str], says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "k8s"
    code = main(["deploy", "kubernetes", workload, "--workers", "2", "--image", "x", "--out", str(out), *args])
    error = capsys.readouterr().err
    assert code == 2 and len(error.strip().splitlines()) == 1 and says in error, error
    assert not out.exists()  # nothing written


def test_the_image_build_installs_the_engines_named_in_its_build_argument() -> None:
    """The build script passes ``ENGINES`` on as the build argument and collects each engine's pinned wheels
    (refusing an unknown name); the Dockerfile installs them with ``scaletrain engines install`` into the
    folder the pods' start scripts look in, also set for ``scaletrain engines prepare``."""
    dockerfile = (REPO / "Dockerfile").read_text()
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert re.search(r"^ARG ENGINES=$", dockerfile, re.M)
    install = re.search(r'if \[ -n "\$ENGINES" \]; then \\\n(.*?)\n\s*fi', dockerfile, re.S)
    assert install and f"SCALETRAIN_ENGINES={IMAGE_ENGINES}" in install.group(1)
    assert "/opt/venv/bin/scaletrain engines install $(echo \"$ENGINES\" | tr ',' ' ')" in install.group(1)
    assert "PIP_NO_INDEX=1" in install.group(1) and "PIP_FIND_LINKS=/wheels" in install.group(1)
    assert re.search(rf"^ENV .*\n\s+SCALETRAIN_ENGINES={IMAGE_ENGINES} ", dockerfile, re.M)
    assert '--build-arg ENGINES="$engines"' in script and "engines=${ENGINES:-}" in script
    (snippet,) = re.findall(
        r"engine_packages=\$\(PYTHONPATH=src \.venv/bin/python -c '(.*?)' \"\$engines\"\)", script, re.S
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    named = subprocess.run([sys.executable, "-c", snippet, "tensorflow,mxnet"], env=env, capture_output=True, text=True)
    assert named.stdout.splitlines() == [" ".join(ENGINES[name].packages) for name in ("tensorflow", "mxnet")]
    refused = subprocess.run([sys.executable, "-c", snippet, "caffe"], env=env, capture_output=True, text=True)
    assert refused.returncode != 0 and refused.stderr.strip() == (
        "build-image: ENGINES names 'caffe'; the engines are tensorflow, mxnet"
    )
