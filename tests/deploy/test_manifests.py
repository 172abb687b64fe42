"""Rendered manifests: every core object validates strictly against Kubernetes 1.32's schemas, the
PyTorchJob (elastic too), JobSet and TrainJob against their CRDs' ``openAPIV3Schema`` (``../shared/deploy/crds``;
the ``torch-distributed`` runtime a TrainJob names against the ClusterTrainingRuntime CRD), the
written folder is a Kustomize base that ``kubectl kustomize`` renders, and a bench sweep renders one
valid, uniquely named run per configuration."""

from __future__ import annotations

import functools
import itertools
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from tests.helpers import REPO

from scaletrain.api import deploy_kubernetes_bench
from scaletrain.config import load_toml
from scaletrain.deploy import DeployConfig, plan, render, to_yaml, write_folder
from scaletrain.deploy.trainer import RUNTIME_VARIABLES
from scaletrain.errors import ConfigError

KUBERNETES = "1.32.0"
CRDS = REPO.parent / "shared" / "deploy" / "crds"
RUNTIMES = REPO.parent / "shared" / "deploy" / "runtimes"
CRD_FILES = {
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}
OPERATORS = ["none", "kubeflow", "jobset", "trainer"]
#: (strategy settings, expected processes): every strategy maps onto every flavour.
STRATEGIES = [
    ({"workers": 1}, 1),
    ({"workers": 2, "strategy": "allreduce"}, 2),
    ({"workers": 3, "strategy": "ps", "server": "central", "sync": "async"}, 4),
    ({"workers": 2, "strategy": "ps", "server": "central", "sync": "join"}, 3),
    ({"workers": 2, "strategy": "ps", "server": "sharded", "sync": "split"}, 2),
]
FULL = dict(
    cpus=1.5,
    memory="3Gi",
    gpus=1,
    node_selector={"cloud.example.com/pool": "training"},
    namespace="ml",
    service_account="trainer",
    pull_policy="Always",
    storage_class="nfs",
)


def elastic(**bounds: int) -> DeployConfig:
    return DeployConfig(name="ok", image="x", operator="kubeflow", **bounds)


def strict(schema: Any) -> Any:
    """The CRD schema with unknown fields refused: Kubernetes prunes them silently, a typo would vanish."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        known_only = "properties" in schema and "additionalProperties" not in schema
        if known_only and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    if not CRDS.is_dir():
        pytest.skip(f"{CRDS} is absent: the CRDs are shared data beside the repository (../shared/deploy/crds)")
    return _crd_validator(api_version, kind)


@functools.cache
def _crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    crd = yaml.load((CRDS / CRD_FILES[api_version, kind]).read_text(), Loader=yaml.CSafeLoader)
    version = api_version.rpartition("/")[2]
    (entry,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return jsonschema.Draft7Validator(strict(entry["schema"]["openAPIV3Schema"]))


def validate(obj: dict) -> None:
    key = (obj["apiVersion"], obj["kind"])
    if key in CRD_FILES:
        crd_validator(*key).validate(obj)
    else:
        kubernetes_validate.validate(obj, KUBERNETES, strict=True)


def rendered(operator: str, settings: dict, **deploy: Any) -> list[dict]:
    config = DeployConfig(name="fmnist", image="registry.example.com/scaletrain:0.1", operator=operator, **deploy)
    return render(plan("lenet", config, {"steps": 50, "batch_size": 16, **settings}))


def trainjob_pod(obj: dict) -> dict:
    """The pod spec a TrainJob patches into its runtime's replicated job ``node``."""
    (patch,) = obj["spec"]["runtimePatches"]
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return job["template"]["spec"]["template"]["spec"]


def pod_specs(obj: dict) -> list[dict]:
    """Every pod template's spec inside a Job, PyTorchJob, JobSet or Deployment (a TrainJob's pod patch)."""
    if obj["kind"] in ("Job", "Deployment"):
        return [obj["spec"]["template"]["spec"]]
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    if obj["kind"] == "JobSet":
        return [r["template"]["spec"]["template"]["spec"] for r in obj["spec"]["replicatedJobs"]]
    if obj["kind"] == "TrainJob":
        return [trainjob_pod(obj)]
    return []


@pytest.mark.parametrize("operator", OPERATORS)
@pytest.mark.parametrize(
    ("settings", "processes"),
    STRATEGIES,
    ids=["local", "allreduce", "ps-central-async", "ps-central-join", "ps-sharded-split"],
)
def test_every_object_validates(operator: str, settings: dict, processes: int) -> None:
    objects = rendered(operator, settings)
    kinds = [obj["kind"] for obj in objects]
    assert kinds[:2] == ["PersistentVolumeClaim", "ConfigMap"] and kinds[-2:] == ["Deployment", "Service"]
    for obj in objects:
        validate(obj)
    training = objects[2:-2]
    counted = 0
    for obj in training:
        if obj["kind"] == "Job":
            counted += obj["spec"]["completions"]
        elif obj["kind"] == "PyTorchJob":
            counted += sum(r["replicas"] for r in obj["spec"]["pytorchReplicaSpecs"].values())
        elif obj["kind"] == "JobSet":
            counted += sum(r["template"]["spec"]["completions"] for r in obj["spec"]["replicatedJobs"])
        elif obj["kind"] == "TrainJob":
            counted += obj["spec"]["trainer"]["numNodes"] * obj["spec"]["trainer"]["numProcPerNode"]
    assert counted == processes


@pytest.mark.parametrize("operator", ["none", "kubeflow", "jobset"])
def test_cluster_flags_reach_every_pod(operator: str) -> None:
    objects = rendered(operator, {"workers": 2}, **FULL)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["namespace"] == "ml"
    claim = objects[0]
    assert claim["spec"]["storageClassName"] == "nfs"
    specs = [spec for obj in objects for spec in pod_specs(obj)]
    assert len(specs) >= 2
    for spec in specs:
        assert spec["nodeSelector"] == {"cloud.example.com/pool": "training"}
        assert spec["serviceAccountName"] == "trainer"
        assert spec["containers"][0]["imagePullPolicy"] == "Always"
    training = [spec["containers"][0] for obj in objects[2:-2] for spec in pod_specs(obj)]
    for box in training:
        assert box["resources"] == {
            "requests": {"cpu": "1500m", "memory": "3Gi"},
            "limits": {"cpu": "1500m", "memory": "3Gi", "nvidia.com/gpu": 1},
        }
    if operator == "kubeflow":
        assert {box["name"] for box in training} == {"pytorch"}


def test_configmap_is_the_run_configuration(tmp_path: Path) -> None:
    """The ConfigMap's TOML loads with ``--config`` into the same settings: file < flags, out on the volume."""
    config_file = tmp_path / "run.toml"
    config_file.write_text('lr = 0.5\nbatch-size = 8\n[options]\nfoo = "x"\n')
    config = DeployConfig(name="fmnist", image="scaletrain:cpu", cpus=2)
    run = plan("lenet", config, {"batch_size": 32, "workers": 2, "data_dir": Path("/data")}, config_file=config_file)
    (config_map,) = [obj for obj in render(run) if obj["kind"] == "ConfigMap"]
    text = config_map["data"]["run.toml"]
    (tmp_path / "rendered.toml").write_text(text)
    loaded = load_toml(tmp_path / "rendered.toml")
    assert loaded == {
        "lr": 0.5,
        "batch_size": 32,
        "options": {"foo": "x"},
        "workers": 2,
        "data_dir": "/data",
        "progress": "plain",
        "threads": 2,
        "out": "/runs/fmnist",
    }
    assert tomllib.loads(text)["out"] == "/runs/fmnist"


def test_sync_restarts_everyone_async_tolerates_a_lost_worker() -> None:
    sync = {obj["kind"]: obj for obj in rendered("none", {"workers": 2})}["Job"]["spec"]
    assert sync["template"]["spec"]["restartPolicy"] == "OnFailure" and sync["backoffLimit"] == 3 * 2
    async_ps = {"workers": 3, "strategy": "ps", "sync": "async"}
    lenient = {obj["kind"]: obj for obj in rendered("none", async_ps)}["Job"]["spec"]
    assert lenient["backoffLimitPerIndex"] == 0 and lenient["maxFailedIndexes"] == 2
    assert lenient["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    jobset = {obj["kind"]: obj for obj in rendered("jobset", async_ps)}["JobSet"]["spec"]
    assert jobset["failurePolicy"] == {"maxRestarts": 3}
    assert [job["name"] for job in jobset["replicatedJobs"]] == ["server", "worker"]
    assert all(job["template"]["spec"]["backoffLimit"] == 0 for job in jobset["replicatedJobs"])


def test_rendezvous_names() -> None:
    """MASTER_ADDR is rank 0's DNS name in each flavour; the operator sets it for PyTorchJob."""

    def env(spec: dict) -> dict:
        return {item["name"]: item.get("value") for item in spec["containers"][0].get("env", [])}

    job = rendered("none", {"workers": 2})[3]
    assert env(job["spec"]["template"]["spec"])["MASTER_ADDR"] == "fmnist-0.fmnist"
    assert job["spec"]["template"]["spec"]["subdomain"] == "fmnist"
    jobset = rendered("jobset", {"workers": 2, "strategy": "ps"})[2]
    for spec in pod_specs(jobset):
        assert env(spec)["MASTER_ADDR"] == "fmnist-server-0-0.fmnist"
        assert env(spec)["WORLD_SIZE"] == "3"
    pytorchjob = rendered("kubeflow", {"workers": 2})[2]
    for spec in pod_specs(pytorchjob):
        assert not {"MASTER_ADDR", "RANK", "WORLD_SIZE"} & set(env(spec))
        assert spec["containers"][0]["ports"][0]["name"] == "pytorchjob-port"


def test_trainjob_names_the_runtime_and_leaves_its_variables_to_it() -> None:
    """A TrainJob of the torch-distributed runtime: one node per process, the runtime's job and container
    patched with the volume and placement, none of the variables the runtime reserves set here."""
    placement = {key: value for key, value in FULL.items() if key != "pull_policy"}  # no TrainJob field for it
    objects = rendered("trainer", {"workers": 2, "strategy": "ps", "server": "central", "sync": "join"}, **placement)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["namespace"] == "ml"
    (job,) = [obj for obj in objects if obj["kind"] == "TrainJob"]
    spec = job["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torch-distributed",
    }
    trainer = spec["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 1)  # 2 workers and the central server
    assert trainer["image"] == "registry.example.com/scaletrain:0.1"
    assert trainer["resourcesPerNode"] == {
        "requests": {"cpu": "1500m", "memory": "3Gi"},
        "limits": {"cpu": "1500m", "memory": "3Gi", "nvidia.com/gpu": 1},
    }
    assert trainer["args"] == ["lenet", "--config", "/etc/scaletrain/run.toml"]
    # Trainer's torch plugin refuses a TrainJob that sets these (constants.TorchRunReservedEnvNames)
    assert not {item["name"] for item in trainer["env"]} & set(RUNTIME_VARIABLES)
    pod = trainjob_pod(job)
    assert pod["nodeSelector"] == {"cloud.example.com/pool": "training"} and pod["serviceAccountName"] == "trainer"
    assert {v["name"]: v for v in pod["volumes"]}["runs"]["persistentVolumeClaim"]["claimName"] == "fmnist-runs"
    assert [box["name"] for box in pod["containers"]] == ["node"]

    # The runtime it names validates against its own CRD and has the job and container the patch targets.
    runtime = yaml.safe_load((RUNTIMES / "torch_distributed.yaml").read_text())
    crd_validator(runtime["apiVersion"], runtime["kind"]).validate(runtime)
    assert runtime["metadata"]["name"] == spec["runtimeRef"]["name"] and "torch" in runtime["spec"]["mlPolicy"]
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    assert node["name"] == "node" and node["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"  # the container the runtime gives PET_*
    }
    assert [box["name"] for box in node["template"]["spec"]["template"]["spec"]["containers"]] == ["node"]


def test_trainjob_script_reads_the_runtime_variables(tmp_path: Path) -> None:
    """The TrainJob's command under ``sh`` with what the runtime injects for numNodes=2, numProcPerNode=1: it
    starts ``scaletrain train`` (a stand-in here, printing what it got) with the torchrun variables; without
    the variables, or with more than one process per node, it stops with one line. The real run is in
    ``tests/deploy/test_pods.py``."""
    (job,) = [obj for obj in rendered("trainer", {"workers": 2}) if obj["kind"] == "TrainJob"]
    trainer = job["spec"]["trainer"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stand_in = bin_dir / "scaletrain"
    stand_in.write_text('#!/bin/sh\necho "$RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $*"\n')
    stand_in.chmod(0o755)
    runtime = {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "fmnist-node-0-0.fmnist",
        "PET_MASTER_PORT": "29500",
    }

    def start(env: dict[str, str]) -> subprocess.CompletedProcess:
        command = [*trainer["command"], *trainer["args"]]
        environment = {"PATH": f"{bin_dir}:/usr/bin:/bin", **env}
        return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=10)

    started = start(runtime)
    assert started.returncode == 0, started.stderr
    assert started.stdout == "1 2 fmnist-node-0-0.fmnist 29500 train lenet --config /etc/scaletrain/run.toml\n"
    for env, says in [
        ({key: value for key, value in runtime.items() if key != "PET_NODE_RANK"}, "PET_NODE_RANK: not set"),
        ({**runtime, "PET_NPROC_PER_NODE": "4"}, "numProcPerNode: 1"),
    ]:
        refused = start(env)
        assert refused.returncode != 0 and refused.stdout == ""
        assert len(refused.stderr.strip().splitlines()) == 1 and says in refused.stderr, refused.stderr


@pytest.mark.parametrize(
    "break_it",
    [
        lambda spec: spec["runtimeRef"].pop("name"),
        lambda spec: spec["runtimeRef"].update(name=""),
        lambda spec: spec["trainer"].update(numNodes="2"),
        lambda spec: spec["trainer"].update(numProcPerNode="auto"),
        lambda spec: spec.pop("runtimeRef"),
    ],
    ids=["no-runtime-name", "empty-runtime-name", "numNodes-string", "numProcPerNode-auto", "no-runtimeRef"],
)
def test_validation_rejects_a_broken_trainjob(break_it) -> None:
    (job,) = [obj for obj in rendered("trainer", {"workers": 2}) if obj["kind"] == "TrainJob"]
    validate(job)
    break_it(job["spec"])
    with pytest.raises(jsonschema.ValidationError):
        validate(job)


def test_elastic_pytorchjob() -> None:
    """``--min-workers``: Worker replicas only, started by torchrun, and the elasticPolicy the operator reads
    (its bounds count the central server's pod too)."""
    settings = {"workers": 3, "strategy": "ps", "server": "central", "sync": "async"}
    objects = rendered("kubeflow", settings, min_workers=2, max_workers=4)
    for obj in objects:
        validate(obj)
    (job,) = [obj for obj in objects if obj["kind"] == "PyTorchJob"]
    spec = job["spec"]
    assert spec["elasticPolicy"] == {"rdzvBackend": "c10d", "minReplicas": 3, "maxReplicas": 5, "maxRestarts": 3}
    assert spec["nprocPerNode"] == "1"
    assert list(spec["pytorchReplicaSpecs"]) == ["Worker"] and spec["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    (box,) = spec["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    assert box["command"][:4] == ["torchrun", "--no-python", "sh", "-c"]
    assert box["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500, "protocol": "TCP"}]
    assert not {"RANK", "WORLD_SIZE", "MASTER_ADDR"} & {item["name"] for item in box["env"]}
    (default,) = [obj for obj in rendered("kubeflow", {"workers": 2}, min_workers=1) if obj["kind"] == "PyTorchJob"]
    assert default["spec"]["elasticPolicy"]["maxReplicas"] == 2  # --max-workers defaults to --workers
    spec["elasticPolicy"]["minReplica"] = 2  # the check can fail: a misspelt field is refused
    with pytest.raises(jsonschema.ValidationError):
        validate(job)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda: DeployConfig(name="Bad_Name", image="x"), "--name"),
        (lambda: DeployConfig(name="ok", image="x", memory="4 GB"), "--memory"),
        (lambda: DeployConfig(name="ok", image="x", operator="helm"), "--operator"),
        (lambda: DeployConfig(name="ok", image="x", node_selector={"a": "b c"}), "--node-selector"),
        (lambda: plan("lenet", DeployConfig(name="ok", image="x"), {"nodefile": Path("n")}), "nodefile"),
        (lambda: plan("lenet", DeployConfig(name="ok", image="x"), {"workers": 2, "sync": "async"}), "is synchronous"),
        (lambda: plan("nope", DeployConfig(name="ok", image="x"), {}), "unknown workload"),
        (lambda: DeployConfig(name="ok", image="x", min_workers=2), "add --operator kubeflow"),
        (lambda: DeployConfig(name="ok", image="x", operator="kubeflow", min_workers=0), "--min-workers must be ≥ 1"),
        (lambda: DeployConfig(name="ok", image="x", operator="kubeflow", max_workers=2), "needs --min-workers"),
        (
            lambda: DeployConfig(name="ok", image="x", operator="kubeflow", min_workers=3, max_workers=2),
            "--max-workers 2 is below --min-workers 3",
        ),
        (lambda: plan("lenet", elastic(min_workers=3), {"workers": 2}), "--min-workers 3 is above --workers 2"),
        (
            lambda: plan("lenet", elastic(min_workers=1, max_workers=1), {"workers": 2}),
            "--max-workers 1 is below --workers 2",
        ),
        (lambda: DeployConfig(name="ok", image="x", operator="trainer", port=1234), "--port cannot be set"),
        (lambda: DeployConfig(name="ok", image="x", operator="trainer", pull_policy="Always"), "--pull-policy"),
        (lambda: DeployConfig(name="ok", image="x", operator="trainer", max_restarts=5), "--max-restarts"),
        (  # train's --min-workers (going on with the survivors) from a configuration: local runs only
            lambda: plan("lenet", DeployConfig(name="ok", image="x"), {"workers": 3, "min_workers": 2}),
            "min_workers in the configuration is train's --min-workers",
        ),
    ],
)
def test_bad_input_names_the_fix(change, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        change()


def test_folder_is_a_kustomize_base(tmp_path: Path) -> None:
    objects = rendered("none", {"workers": 2})
    written = write_folder(objects, tmp_path / "k8s")
    assert written[-1].name == "kustomization.yaml"
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed; the folder was written but not rendered with kubectl kustomize")
    result = subprocess.run(
        ["kubectl", "kustomize", str(tmp_path / "k8s")], capture_output=True, text=True, timeout=60, check=True
    )
    by_kind = sorted((obj["kind"], obj["metadata"]["name"]) for obj in yaml.safe_load_all(result.stdout))
    assert by_kind == sorted((obj["kind"], obj["metadata"]["name"]) for obj in objects)
    assert list(yaml.safe_load_all(to_yaml(objects))) == objects


@pytest.mark.parametrize("operator", OPERATORS)
def test_validation_catches_a_misspelt_field(operator: str) -> None:
    """The checks above can fail: a field the schema does not know is refused, in core objects and in CRDs."""
    objects = rendered(operator, {"workers": 2})
    training = objects[2] if operator != "none" else objects[3]
    pod_specs(training)[0]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises((jsonschema.ValidationError, kubernetes_validate.ValidationError)):
        validate(training)


#: A sweep's grid, and the configurations it must come out as, worked out here independently of the
#: code: (strategy, server, sync) × workers × batch size × repeat. ``ps-distributed-join`` is
#: ``ps-sharded-join`` again and ``local`` runs at one worker only, as in a local bench.
GRID = dict(
    workers=(1, 3),
    strategies=("local", "allreduce-join", "ps-central-async", "ps-sharded-join", "ps-distributed-join"),
    batch_sizes=(16, 32),
    repeats=2,
    steps=30,
)
# a strategy without servers has none in its configuration (the strategy registry's specs)
CONFIGURATIONS = {("local", "", "join", 1, batch, repeat) for batch in (16, 32) for repeat in (0, 1)} | {
    (*strategy, workers, batch, repeat)
    for strategy, workers, batch, repeat in itertools.product(
        [("allreduce", "", "join"), ("ps", "central", "async"), ("ps", "sharded", "join")],
        (1, 3),
        (16, 32),
        (0, 1),
    )
}
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def processes(obj: dict) -> int:
    """How many pods (processes) a training object starts."""
    if obj["kind"] == "Job":
        return obj["spec"]["completions"]
    if obj["kind"] == "PyTorchJob":
        return sum(r["replicas"] for r in obj["spec"]["pytorchReplicaSpecs"].values())
    if obj["kind"] == "TrainJob":
        return obj["spec"]["trainer"]["numNodes"] * obj["spec"]["trainer"]["numProcPerNode"]
    return sum(r["template"]["spec"]["completions"] for r in obj["spec"]["replicatedJobs"])


@pytest.mark.parametrize("operator", OPERATORS)
def test_sweep_is_one_valid_run_per_configuration(operator: str) -> None:
    objects = deploy_kubernetes_bench("lenet", image="scaletrain:cpu", name="fm", operator=operator, **GRID)
    for obj in objects:
        validate(obj)
    names = [(obj["kind"], obj["metadata"]["name"]) for obj in objects]
    assert len(set(names)) == len(names)
    assert all(DNS_LABEL.match(name) and len(name) <= 63 for _, name in names)
    (claim,) = [obj for obj in objects if obj["kind"] == "PersistentVolumeClaim"]
    assert claim["metadata"]["name"] == "fm-runs"
    config_maps = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ConfigMap"}
    training = [obj for obj in objects if obj["kind"] in ("Job", "PyTorchJob", "JobSet", "TrainJob")]
    assert len(training) == len(config_maps) == len(CONFIGURATIONS)
    if operator == "none":
        services = {obj["metadata"]["name"] for obj in objects if obj["kind"] == "Service"}
        assert services == {obj["metadata"]["name"] for obj in training}  # each Job its own headless Service
    found, folders = set(), set()
    for obj in training:
        specs = pod_specs(obj)
        volumes = {v["name"]: v for spec in specs for v in spec["volumes"]}
        assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == "fm-runs"
        toml = tomllib.loads(config_maps[volumes["config"]["configMap"]["name"]]["data"]["run.toml"])
        repeat = int(re.fullmatch(r".*-r([0-9]+)", obj["metadata"]["name"]).group(1))
        server = toml.get("server", "")  # written only for strategies with servers
        configuration = (toml["strategy"], server, toml["sync"], toml["workers"], toml["batch-size"], repeat)
        found.add(configuration)
        strategy, server, sync, workers, batch, repeat = configuration
        world = workers + (strategy == "ps" and server == "central")  # the central server is one process more
        assert processes(obj) == world, obj["metadata"]["name"]
        label = (
            "local"
            if strategy == "local"
            else f"{strategy}-{sync}"
            if strategy == "allreduce"
            else f"ps-{server}-{sync}"
        )
        folder = f"{label}-b{batch}-w{workers}-r{repeat}"
        assert obj["metadata"]["name"] == f"fm-{folder}"
        assert toml["out"] == f"/runs/fm/runs/{folder}"  # the layout of a local bench's folder
        # an asynchronous run's updates are shared among its workers: each trains the 30 steps of a synchronous one
        assert toml["steps"] == 30 * (workers if sync == "async" else 1) and toml["tensorboard"] is False
        folders.add(folder)
        for spec in specs:
            env = {item["name"]: item["value"] for item in spec["containers"][0].get("env", [])}
            if operator not in ("kubeflow", "trainer"):  # the operator or runtime sets it itself
                assert env["WORLD_SIZE"] == str(world)
            # Pod host names (<job>-<index>, <set>-<job>-0-<index>) must stay DNS labels.
            assert len(f"{obj['metadata']['name']}-worker-0-{world - 1}") <= 63
    assert found == CONFIGURATIONS and len(folders) == len(CONFIGURATIONS)


def test_sweep_with_cpus_gives_each_process_its_cores() -> None:
    objects = deploy_kubernetes_bench(
        "lenet", image="x", workers=(2,), strategies=("allreduce-join",), cpus=2, memory="2Gi", namespace="ml"
    )
    (job,) = [obj for obj in objects if obj["kind"] == "Job"]
    assert job["metadata"]["name"] == "lenet-bench-allreduce-join-bdefault-w2-r0"
    assert job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}
    (config_map,) = [obj for obj in objects if obj["kind"] == "ConfigMap"]
    assert tomllib.loads(config_map["data"]["run.toml"])["threads"] == 2
    assert all(obj["metadata"]["namespace"] == "ml" for obj in objects)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"strategies": ("allreduce-async",)}, "strategy spec 'allreduce-async'"),
        ({"strategies": ("ring",)}, "strategy spec 'ring'"),
        ({"strategies": ()}, "--strategies"),
        ({"workers": (0, 2)}, "--workers"),
        ({"network": "1gbit"}, "--network"),
        ({"max_workers": 4}, "--max-workers"),
        ({"quick": True}, "--preset"),
        ({"preset": "thesis-rnn"}, "trains ptb-lstm, not lenet"),
        ({"name": "a-name-that-is-far-too-long-for-the-runs"}, "--name of at most"),
    ],
)
def test_bad_sweep_names_the_fix(settings: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        deploy_kubernetes_bench("lenet", image="x", **settings)
