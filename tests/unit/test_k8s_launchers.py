"""The Kubernetes launchers without a cluster: every manifest validated against the Kubernetes and
Kubeflow schemas. Their launch-and-wait logic runs against scripted API answers inside a real
Dagster run in tests/integration/test_k8s_launchers.py."""

import copy
import hashlib
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pydantic
import pytest
import yaml
from jsonschema.protocols import Validator
from kubernetes import client as k8s

from ml.config import DataConfig, TrainConfig, to_args
from resources.k8s_manifests import (
    Toleration,
    headless_service,
    indexed_job,
    launch_env,
    launch_name,
    pod_spec,
    pytorch_job,
    standalone_command,
)
from resources.kubernetes import K8sMultiNode, K8sPod

pytestmark = pytest.mark.unit

SCHEMAS = Path(__file__).parents[1] / "schemas"
OLDEST_K8S = "1.31"
"""podFailurePolicy and pods' DisruptionTarget condition are GA from Kubernetes 1.31."""
K8S_VERSIONS = (OLDEST_K8S, kubernetes_validate.utils.latest_version())
RUN_ID = "3f2a9c1e-4b5d-4e6f-8a9b-0c1d2e3f4a5b"
CONFIG = TrainConfig(
    data=DataConfig(training_set="/checkpoints/lake/training_set/data.parquet"),
    output_dir=f"/checkpoints/{RUN_ID}",
)
GPU_NODES = {
    "output_root": "/checkpoints",
    "image": "registry.example.com/ml-lifecycle:3f2a9c1",
    "namespace": "ml-training",
    "service_account": "ml-trainer",
    "checkpoint_claim": "training-checkpoints",
    "gpus_per_pod": 4,
    "node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
    "tolerations": [Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule")],
}
PIPES_ENV = {"DAGSTER_PIPES_CONTEXT": "eJyrVgrNK8nMS1WyUlAqSS0u0VFQSi0uTi0pLUoFAFqHB4Y="}


def multi_node(**overrides: Any) -> K8sMultiNode:
    return K8sMultiNode(**{**GPU_NODES, "nodes": 3, **overrides})


def one_pod(**overrides: Any) -> K8sPod:
    return K8sPod(**{**GPU_NODES, "gpus_per_pod": 8, "poll_interval_s": 0, **overrides})


# --- Manifests against the schemas ----------------------------------------------------------


def core_manifests(launcher: K8sMultiNode) -> dict[str, dict[str, Any]]:
    """The Pod (K8sPod's spec, wrapped), the Job and the Service, as they would be sent."""
    name = launch_name(RUN_ID, 0)
    command = standalone_command(launcher, CONFIG)
    spec = pod_spec(launcher, command, launch_env(launcher, RUN_ID), CONFIG)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
    return {
        "Pod": pod,
        "Job": indexed_job(launcher, name, RUN_ID, CONFIG, PIPES_ENV),
        "Service": headless_service(launcher, name, RUN_ID),
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("gpus", [4, 0])
def test_the_pod_job_and_service_validate_against_the_kubernetes_schema(version, gpus):
    for kind, manifest in core_manifests(multi_node(gpus_per_pod=gpus)).items():
        assert manifest["kind"] == kind
        kubernetes_validate.validate(manifest, desired_version=version, strict=True)


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("spec", "backoffLimit"), "six"),  # a wrong type
        (("spec", "template", "spec", "containers", 0, "securityContext", "runAsRoot"), True),
        (("spec", "podFailurePolicy", "rules", 1, "action"), ["FailJob"]),
    ],
)
def test_kubernetes_validation_rejects_a_broken_job(path, bad):
    job = core_manifests(multi_node())["Job"]
    broken = copy.deepcopy(job)
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    kubernetes_validate.validate(job, desired_version=OLDEST_K8S, strict=True)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, desired_version=OLDEST_K8S, strict=True)


def crd_schema(file: str, version: str) -> dict[str, Any]:
    """A CRD version's schema, made strict the way `kubectl --validate=strict` is: an object
    with declared properties admits no others (unless the schema preserves unknown fields)."""
    # libyaml's loader when there is one: the CRD is 640 kB of YAML.
    crd = yaml.load(
        (SCHEMAS / file).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    )
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = served["schema"]["openAPIV3Schema"]

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


@pytest.fixture(scope="module")
def pytorchjob_validator() -> Validator:
    schema = crd_schema("kubeflow.org_pytorchjobs.v1.9.4.yaml", "v1")
    return jsonschema.Draft7Validator(schema)


def test_the_pytorchjob_validates_against_the_kubeflow_crd(pytorchjob_validator):
    job = pytorch_job(multi_node(), launch_name(RUN_ID, 0), RUN_ID, CONFIG, PIPES_ENV)
    pytorchjob_validator.validate(job)
    replicas = job["spec"]["pytorchReplicaSpecs"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    (container,) = replicas["Master"]["template"]["spec"]["containers"]
    assert container["name"] == "pytorch"  # the operator's convention
    assert container["ports"] == [{"name": "pytorchjob-port", "containerPort": 29500}]
    assert job["spec"]["nprocPerNode"] == "4"


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("spec", "pytorchReplicaSpecs", "Worker", "replicas"), "2"),
        (("spec", "runPolicy", "backofLimit"), 6),  # a typo
        (("spec", "pytorchReplicaSpecs", "Master", "template", "spec", "volumes", 0), "shm"),
    ],
)
def test_crd_validation_rejects_a_broken_pytorchjob(pytorchjob_validator, path, bad):
    job = pytorch_job(multi_node(), launch_name(RUN_ID, 0), RUN_ID, CONFIG, PIPES_ENV)
    node = job
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        pytorchjob_validator.validate(job)


def test_the_vendored_crds_are_the_files_their_readme_names():
    readme = (SCHEMAS / "README.md").read_text()
    for file in ("kubeflow.org_pytorchjobs.v1.9.4.yaml", "trainer.kubeflow.org_trainjobs.yaml"):
        digest = hashlib.sha256((SCHEMAS / file).read_bytes()).hexdigest()
        assert re.search(rf"`{re.escape(file)}`.*`{digest}`", readme), file


# --- What the manifests say ------------------------------------------------------------------


def test_every_node_runs_torchrun_with_c10d_rendezvous_on_the_pod_of_index_0():
    launcher = multi_node()
    name = launch_name(RUN_ID, 0)
    job = indexed_job(launcher, name, RUN_ID, CONFIG, PIPES_ENV)
    service = headless_service(launcher, name, RUN_ID)
    spec = job["spec"]
    pod = spec["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 3, 3)
    assert pod["containers"][0]["command"] == [
        *("python", "-m", "ml.node", "--nnodes", "3", "--nproc-per-node", "4"),
        *("--rdzv-backend", "c10d", "--rdzv-endpoint", f"{name}-0.{name}:29500"),
        *("--rdzv-id", RUN_ID, "--max-restarts", "2", "-m", "ml.train", *to_args(CONFIG)),
    ]
    assert pod["subdomain"] == service["metadata"]["name"] == name
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": name}
    assert pod["restartPolicy"] == "Never"
    assert indexed_job(launcher, name, RUN_ID, CONFIG, PIPES_ENV) == job  # deterministic


def test_the_job_fails_at_once_on_exit_78_and_ignores_disruptions_and_exit_75():
    launcher = multi_node(backoff_limit=5, active_deadline_s=7200, ttl_after_finished_s=600)
    spec = indexed_job(launcher, "train-x-0", RUN_ID, CONFIG, {})["spec"]
    assert spec["podFailurePolicy"]["rules"] == [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {
            "action": "Ignore",
            "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [75]},
        },
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [78]},
        },
    ]
    assert spec["template"]["spec"]["containers"][0]["name"] == "trainer"
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"]) == (5, 7200)
    assert spec["ttlSecondsAfterFinished"] == 600


def test_every_pod_is_non_root_limited_placed_and_mounts_shm_and_checkpoints():
    launcher = multi_node(cpu="12", memory="96Gi", shm_size="16Gi", threads_per_process=6)
    job = indexed_job(launcher, "train-x-0", RUN_ID, CONFIG, PIPES_ENV)
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
    }
    wanted = {"cpu": "12", "memory": "96Gi", "nvidia.com/gpu": "4"}
    assert container["resources"] == {"requests": wanted, "limits": wanted}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert (pod["serviceAccountName"], container["image"]) == ("ml-trainer", GPU_NODES["image"])
    assert container["imagePullPolicy"] == "IfNotPresent"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "training-checkpoints"}
    assert mounts == {"shm": "/dev/shm", "checkpoints": "/checkpoints"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["IMAGE_TAG"] == GPU_NODES["image"]
    assert (env["OMP_NUM_THREADS"], env["DAGSTER_RUN_ID"]) == ("6", RUN_ID)
    assert env["DAGSTER_PIPES_CONTEXT"] == PIPES_ENV["DAGSTER_PIPES_CONTEXT"]
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert (
        labels["dagster/run-id"] == RUN_ID and labels["app.kubernetes.io/managed-by"] == "dagster"
    )
    assert job["metadata"]["namespace"] == "ml-training"


def test_a_cpu_pod_asks_for_no_gpu_and_runs_the_cpu_workers():
    launcher = multi_node(gpus_per_pod=0, cpu_processes_per_pod=3)
    spec = pod_spec(launcher, standalone_command(launcher, CONFIG), {}, CONFIG)
    container = spec["containers"][0]
    assert "nvidia.com/gpu" not in container["resources"]["limits"]
    assert container["command"][:9] == [
        *("python", "-m", "ml.node", "--standalone", "--nproc-per-node", "3"),
        *("--max-restarts", "2", "-m"),
    ]


@pytest.mark.parametrize(
    "run_id", [RUN_ID, "EPHEMERAL", "../../etc; rm -rf / #", "Z" * 300, "", "--"]
)
def test_names_and_labels_are_valid_whatever_the_run_id(run_id):
    name = launch_name(run_id, 7)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 40
    assert name == launch_name(run_id, 7) != launch_name(run_id, 8)
    labels = headless_service(multi_node(), name, run_id)["metadata"]["labels"]
    for value in labels.values():
        assert re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", value)


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("namespace", "ml; kubectl delete ns prod"),
        ("namespace", "ML"),
        ("service_account", "trainer account"),
        ("checkpoint_claim", "../claim"),
        ("memory", "lots"),
        ("shm_size", "1Gi; echo"),
        ("image", "registry/image:tag --privileged"),
        ("node_selector", {"bad key!": "x"}),
        ("node_selector", {"pool": "not a value"}),
        ("image_pull_policy", "Sometimes"),
        ("run_as_user", 0),
        ("nodes", 1),
        ("output_root", "relative/models"),
        ("output_root", "/models/../etc"),
        ("output_root", "/models:rw"),
    ],
)
def test_settings_that_would_make_an_invalid_or_unsafe_manifest_are_refused(setting, value):
    with pytest.raises(pydantic.ValidationError, match=setting):
        multi_node(**{setting: value})


def test_a_toleration_with_an_invalid_key_is_refused():
    with pytest.raises(pydantic.ValidationError, match="key"):
        Toleration(key="nvidia.com/gpu bad", operator="Exists")


def test_connect_reads_the_configured_kubeconfig(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://gpu.example:6443"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "gpu", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "gpu",
            }
        )
    )
    apis = multi_node(kubeconfig_file=str(kubeconfig), load_incluster_config=False).connect()
    assert apis.core.api_client.configuration.host == "https://gpu.example:6443"
    assert isinstance(apis.batch, k8s.BatchV1Api) and isinstance(apis.custom, k8s.CustomObjectsApi)
