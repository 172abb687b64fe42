"""The pods' contract, for real: the rendered pods run as containers of the image that
``scripts/build-image.sh`` builds, each with exactly its pod spec's command, args, environment and
mounts plus what Kubernetes or the operator injects (``JOB_COMPLETION_INDEX``; the PyTorchJob
operator's ``MASTER_ADDR``, ``RANK`` …; the Kubeflow Trainer ``torch-distributed`` runtime's ``PET_*``;
host names and DNS names on a podman network; restarts for ``restartPolicy: OnFailure``).

The volume claim is a host folder (the tests put the tiny dataset on it, as a user would on theirs)
and the ConfigMap's files a read-only folder. Needs root, podman, runc and mmdebstrap; CI installs them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from tests.helpers import REPO, assert_identical_weights, make_fashion_mnist, run_cli

from scaletrain import deploy_kubernetes

pytestmark = [
    pytest.mark.multiprocess,
    pytest.mark.alone,
]  # containers with CPU limits and a --timeout of 20 s; the image tag is machine-wide

PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager=cgroupfs"]
LIMITS = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=4096:4096"]
#: The same small training in every run here: tiny data on the volume, one thread per pod.
TRAINING = dict(epochs=50, batch_size=8, lr=0.05, checkpoint_every=10, log_every=10, timeout=20, data_dir="/runs/data")


def podman(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run([*PODMAN, *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="session")
def image() -> Iterator[str]:
    """The image, built once per test session (or ``SCALETRAIN_TEST_IMAGE``, already built)."""
    given = os.environ.get("SCALETRAIN_TEST_IMAGE")
    if given:
        yield given
        return
    missing = [tool for tool in ("podman", "runc", "mmdebstrap") if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(
            f"container tests need root and {', '.join(missing) or 'podman'} (apt-get install podman runc mmdebstrap)"
        )
    tag = "localhost/scaletrain:test"
    build = subprocess.run(
        ["bash", str(REPO / "scripts" / "build-image.sh"), tag], capture_output=True, text=True, timeout=1200
    )
    assert build.returncode == 0, build.stdout + build.stderr
    print(build.stdout.strip().splitlines()[-1])  # size and build time, shown with pytest -s
    yield tag
    podman("rmi", "--force", tag, check=False)  # only the package's layers: the base and deps images are kept


@pytest.fixture
def network():
    name = f"scaletrain-test-{uuid.uuid4().hex[:8]}"
    podman("network", "create", name)
    yield name
    podman("network", "rm", "--force", name, check=False)


class Cluster:
    """Runs pod specs as containers: the part of the kubelet (and JobSet controller) these pods rely on."""

    def __init__(self, image: str, network: str, volume: Path, objects: list[dict[str, Any]], tmp: Path) -> None:
        self.image, self.network, self.volume, self.tmp = image, network, volume, tmp
        self.objects = objects
        self.containers: list[str] = []
        self.config = tmp / "configmap"
        self.config.mkdir(parents=True)
        (config_map,) = [obj for obj in objects if obj["kind"] == "ConfigMap"]
        for name, text in config_map["data"].items():
            (self.config / name).write_text(text)

    def run_pod(self, spec: dict[str, Any], *, hostname: str, dns_name: str, injected: dict[str, str]) -> str:
        """``docker run`` of the pod's one container, as the kubelet would start it.

        ``dns_name`` is the name other pods reach it by; ``injected`` the variables Kubernetes or the
        operator adds to the pod spec's own.
        """
        (box,) = spec["containers"]
        name = f"{self.network}-{hostname}"
        mounts = {"runs": str(self.volume), "config": str(self.config)}
        volumes = []
        for mount in box["volumeMounts"]:
            suffix = ":ro" if mount.get("readOnly") else ""
            volumes += ["--volume", f"{mounts[mount['name']]}:{mount['mountPath']}{suffix}"]
        env = [f"{item['name']}={item['value']}" for item in box.get("env", [])]
        env += [f"{key}={value}" for key, value in injected.items()]  # appended: they win, as in Kubernetes
        restart = {"OnFailure": "on-failure", "Never": "no"}[spec["restartPolicy"]]
        cpus = box.get("resources", {}).get("limits", {}).get("cpu")
        command = [
            "run", "--detach", "--name", name, "--hostname", hostname, "--network", self.network,
            "--network-alias", dns_name, "--restart", restart, *LIMITS, *volumes,
            *[arg for pair in env for arg in ("--env", pair)],
            *(["--cpus", str(int(cpus[:-1]) / 1000 if cpus.endswith("m") else cpus)] if cpus else []),
            "--entrypoint", json.dumps(box["command"]), self.image, *box["args"],
        ]  # fmt: skip
        podman(*command)
        self.containers.append(name)
        return name

    def state(self, name: str) -> dict[str, Any]:
        return json.loads(podman("inspect", "--format", "{{json .State}}", name).stdout)

    def restarts(self, name: str) -> int:
        return int(podman("inspect", "--format", "{{.RestartCount}}", name).stdout.strip())

    def wait(self, names: list[str], deadline: float) -> None:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            states = [self.state(name) for name in names]
            if all(s["Status"] == "exited" and s["ExitCode"] == 0 for s in states):
                return
            time.sleep(1)
        raise AssertionError(f"pods did not finish within {deadline} s:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}\n" + podman("logs", name, check=False).stdout + podman("logs", name, check=False).stderr
            for name in self.containers
        )

    def remove(self) -> None:
        for name in self.containers:
            podman("rm", "--force", "--time", "0", name, check=False)


def indexed_pod(hostname: str, subdomain: str, index: int) -> dict[str, Any]:
    """A pod of an Indexed Job (alone or in a JobSet): host name, DNS name under the subdomain, index."""
    return {
        "hostname": hostname,
        "dns_name": f"{hostname}.{subdomain}",
        "injected": {"JOB_COMPLETION_INDEX": str(index)},
    }


def kubeflow_pods(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The PyTorchJob's pods as the training operator makes them: ``<job>-master-0``, ``<job>-worker-i``,
    each with a Service of its own name, and the variables it appends (v1 operator, ``setPodEnv``)."""
    (job,) = [obj for obj in objects if obj["kind"] == "PyTorchJob"]
    name, replicas = job["metadata"]["name"], job["spec"]["pytorchReplicaSpecs"]
    world = sum(spec["replicas"] for spec in replicas.values())
    master = f"{name}-master-0"
    port = str(replicas["Master"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"])
    pods = []
    for rtype, first_rank in (("Master", 0), ("Worker", 1)):
        for index in range(replicas.get(rtype, {}).get("replicas", 0)):
            host = f"{name}-{rtype.lower()}-{index}"
            injected = {
                "PYTHONUNBUFFERED": "0",
                "MASTER_PORT": port,
                "MASTER_ADDR": master,
                "PET_MASTER_PORT": port,
                "PET_MASTER_ADDR": master,
                "WORLD_SIZE": str(world),
                "RANK": str(first_rank + index),
            }
            spec = replicas[rtype]["template"]["spec"]
            pods.append((spec, {"hostname": host, "dns_name": host, "injected": injected}))
    return pods


def trainjob_pods(objects: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The TrainJob's pods as Kubeflow Trainer v2.3.0 builds them from the ``torch-distributed`` runtime: a
    JobSet named after the TrainJob with the replicated job ``node`` (pods ``<job>-node-0-<i>`` under the
    subdomain ``<job>``, restartPolicy defaulted to OnFailure by JobSet), the trainer's command, args, env
    and resourcesPerNode in container ``node``, the runtime patch's volumes and mounts, and the variables
    the torch plugin injects (``pkg/runtime/framework/plugins/torch/torch.go``): ``PET_NNODES`` = numNodes,
    ``PET_NPROC_PER_NODE`` = numProcPerNode, ``PET_NODE_RANK`` = the completion index, ``PET_MASTER_ADDR`` =
    ``<job>-node-0-0.<job>``, ``PET_MASTER_PORT`` = 29500 (``constants.ContainerTrainerPort``)."""
    (job,) = [obj for obj in objects if obj["kind"] == "TrainJob"]
    name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
    (patch,) = job["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    patched = node["template"]["spec"]["template"]["spec"]
    (mounts,) = patched["containers"]
    box = {
        "name": "node",
        "command": trainer["command"],
        "args": trainer["args"],
        "env": trainer.get("env", []),
        "resources": trainer.get("resourcesPerNode", {}),
        "volumeMounts": mounts["volumeMounts"],
    }
    spec = {"restartPolicy": "OnFailure", "containers": [box], "volumes": patched["volumes"]}
    pods = []
    for index in range(trainer["numNodes"]):
        host = f"{name}-node-0-{index}"
        injected = {
            "JOB_COMPLETION_INDEX": str(index),
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(index),
            "PET_MASTER_ADDR": f"{name}-node-0-0.{name}",
            "PET_MASTER_PORT": "29500",
        }
        pods.append((spec, {"hostname": host, "dns_name": f"{host}.{name}", "injected": injected}))
    return pods


def job_pods(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], int, str]:
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    return job["spec"]["template"]["spec"], job["spec"]["completions"], job["metadata"]["name"]


def state_dict(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_weights(a: Path, b: Path) -> None:
    assert_identical_weights(state_dict(a), state_dict(b))


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    volume = tmp_path / "volume"
    make_fashion_mnist(volume / "data", train=320, test=64)
    return volume


def run_job(image: str, network: str, volume: Path, tmp: Path, name: str, **settings: Any) -> tuple[Cluster, list]:
    objects = deploy_kubernetes("lenet", image=image, name=name, cpus=1, **TRAINING, **settings)
    cluster = Cluster(image, network, volume, objects, tmp)
    spec, completions, job = job_pods(objects)
    names = [cluster.run_pod(spec, **indexed_pod(f"{job}-{i}", spec["subdomain"], i)) for i in range(completions)]
    return cluster, names


def test_indexed_job_allreduce_equals_a_local_run_and_survives_a_killed_pod(
    image: str, network: str, volume: Path, tmp_path: Path
) -> None:
    steps = 80
    cluster, names = run_job(image, network, volume, tmp_path / "a", "fm", workers=2, steps=steps)
    try:
        cluster.wait(names, deadline=240)
    finally:
        cluster.remove()
    run = volume / "fm"
    assert json.loads((run / "summary.json").read_text())["steps"] == steps

    # The same configuration, run here with the local launcher: the same weights, bit for bit.
    local_toml = tmp_path / "local.toml"
    rendered = (cluster.config / "run.toml").read_text()
    local_toml.write_text(rendered.replace('"/runs/', f'"{volume}/').replace(f'"{volume}/fm"', f'"{tmp_path}/local"'))
    result = run_cli("train", "lenet", "--config", str(local_toml), timeout=300)
    assert result.returncode == 0, result.stderr
    assert_same_weights(run / "model.pt", tmp_path / "local" / "model.pt")

    # The same run as a Kubeflow PyTorchJob, with what the operator injects: the same weights again.
    objects = deploy_kubernetes(
        "lenet", image=image, name="fm-kf", operator="kubeflow", cpus=1, workers=2, steps=steps, **TRAINING
    )
    cluster = Cluster(image, network, volume, objects, tmp_path / "kf")
    try:
        names = [cluster.run_pod(spec, **pod) for spec, pod in kubeflow_pods(objects)]
        cluster.wait(names, deadline=240)
    finally:
        cluster.remove()
    assert_same_weights(volume / "fm-kf" / "model.pt", run / "model.pt")

    # And as a Kubeflow Trainer v2 TrainJob, with what the torch-distributed runtime injects (numNodes=2,
    # numProcPerNode=1): the same weights again.
    objects = deploy_kubernetes(
        "lenet", image=image, name="fm-tj", operator="trainer", cpus=1, workers=2, steps=steps, **TRAINING
    )
    cluster = Cluster(image, network, volume, objects, tmp_path / "tj")
    try:
        pods = trainjob_pods(objects)
        assert [pod["injected"]["PET_NNODES"] for _, pod in pods] == ["2", "2"]
        names = [cluster.run_pod(spec, **pod) for spec, pod in pods]
        cluster.wait(names, deadline=240)
    finally:
        cluster.remove()
    assert_same_weights(volume / "fm-tj" / "model.pt", run / "model.pt")

    # Kill one pod after a checkpoint: the restarted pods resume from the volume and end with the same weights.
    cluster, names = run_job(image, network, volume, tmp_path / "b", "fm-kill", workers=2, steps=steps)
    try:
        checkpoint = volume / "fm-kill" / "checkpoint.pt"
        end = time.monotonic() + 120
        while not checkpoint.exists() and time.monotonic() < end:
            time.sleep(0.2)
        assert checkpoint.exists(), cluster.logs()
        # The process dies (as by the OOM killer), not a stop by hand, which a restart policy respects.
        os.kill(cluster.state(names[1])["Pid"], signal.SIGKILL)
        cluster.wait(names, deadline=180)
        restarts = [cluster.restarts(name) for name in names]
        logs = cluster.logs()
    finally:
        cluster.remove()
    assert restarts[1] >= 1, logs
    summary = json.loads((volume / "fm-kill" / "summary.json").read_text())
    assert summary["steps"] == steps
    # The last attempt trained only the steps after the checkpoint it resumed from.
    resumed_at = steps - summary["per_worker"][0]["steps"]
    assert resumed_at >= 10 and resumed_at % TRAINING["checkpoint_every"] == 0, summary["per_worker"]
    assert_same_weights(volume / "fm-kill" / "model.pt", run / "model.pt")


def test_jobset_async_parameter_server_with_workers_started_before_the_server(
    image: str, network: str, volume: Path, tmp_path: Path
) -> None:
    objects = deploy_kubernetes(
        "lenet", image=image, name="ps", operator="jobset", cpus=0.5, workers=2, strategy="ps", sync="async",
        steps=60, **TRAINING,
    )  # fmt: skip
    cluster = Cluster(image, network, volume, objects, tmp_path)
    (jobset,) = [obj for obj in objects if obj["kind"] == "JobSet"]
    subdomain = jobset["spec"]["network"]["subdomain"]
    jobs = {job["name"]: job["template"]["spec"] for job in jobset["spec"]["replicatedJobs"]}
    try:
        workers = [
            cluster.run_pod(jobs["worker"]["template"]["spec"], **indexed_pod(f"ps-worker-0-{i}", subdomain, i))
            for i in range(jobs["worker"]["completions"])
        ]
        time.sleep(8)  # the master's name does not exist yet: the workers must be waiting, not failed
        for name in workers:
            assert cluster.state(name)["Status"] == "running", cluster.logs()
        server = cluster.run_pod(jobs["server"]["template"]["spec"], **indexed_pod("ps-server-0-0", subdomain, 0))
        cluster.wait([server, *workers], deadline=240)
        assert all(cluster.restarts(name) == 0 for name in [server, *workers])
    finally:
        cluster.remove()
    summary = json.loads((volume / "ps" / "summary.json").read_text())
    assert summary["steps"] == 60
    assert 0 <= summary["test_accuracy"] <= 1
