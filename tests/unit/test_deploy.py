"""The production deployment files without a cluster, a Docker daemon or Helm: the Dockerfile
read as text, the Helm values against the chart's own values schema, the step pods that
dagster-k8s would build from the assets' tags, and the training pods' account. Helm's templates
are not rendered here (no helm binary), nor is the image built. The RBAC Role is checked against
the API calls the launchers make in tests/integration/test_deploy.py. Last, the tags a registered
model version records (`ml.deploy.plan_registration`), of a one-node ONNX file."""

import copy
import dataclasses
import hashlib
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import dagster as dg
import jsonschema
import kubernetes_validate
import numpy as np
import onnx
import pytest
import yaml
from kubernetes import client as k8s
from onnx import TensorProto, helper
from referencing import Registry, Resource

from declare import Label
from ml.deploy import CONFIG_TAG, OnnxModel, plan_registration
from ml.results import TrainedRun
from tests.unit.test_k8s_launchers import K8S_VERSIONS, OLDEST_K8S, one_pod
from tests.unit.test_promotion_guard import WEIGHTS, evaluation

pytestmark = pytest.mark.unit

ROOT = Path(__file__).parents[2]
DEPLOY = ROOT / "deploy"
SCHEMAS = ROOT / "tests" / "schemas"
HELM_SCHEMA = "dagster-helm.values.schema.json"
K8S_DEFINITIONS = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"


# --- Dockerfile ----------------------------------------------------------------------------


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of deploy/Dockerfile, continuation lines joined; heredoc bodies
    stay inside their RUN."""
    text = (DEPLOY / "Dockerfile").read_text()
    text = re.sub(r"\\\n", " ", text)
    out: list[tuple[str, str]] = []
    for line in text.splitlines():
        match = re.match(r"^([A-Z]+)\s+(.*)$", line)
        if match:
            out.append((match[1], match[2]))
        elif out and line.strip() and not line.lstrip().startswith("#"):
            out[-1] = (out[-1][0], out[-1][1] + "\n" + line)
    return out


def test_the_image_runs_as_the_launchers_non_root_uid():
    users = [args for kind, args in dockerfile() if kind == "USER"]
    assert users == ["1000:1000"]  # numeric: runAsNonRoot can check it without /etc/passwd
    assert "useradd --uid 1000 --gid 1000" in (DEPLOY / "Dockerfile").read_text()


def test_the_image_installs_the_lock_and_pins_its_bases():
    steps = dockerfile()
    args = {a.split("=", 1)[0]: a.split("=", 1)[1] for k, a in steps if k == "ARG" and "=" in a}
    bases = [
        a.split()[0].replace("${PYTHON_IMAGE}", args["PYTHON_IMAGE"])
        for k, a in steps
        if k == "FROM"
    ]
    assert len(bases) == 2
    for base in bases:
        _, _, tag = base.partition(":")
        assert tag and tag != "latest" and re.match(r"3\.11\.\d+-", tag), base
    runs = "\n".join(a for k, a in steps if k == "RUN")
    assert "uv pip sync" in runs and "requirements.lock" in runs
    assert "--no-deps" in runs  # the project itself adds nothing the lock did not pin
    # The CUDA variant's torch is the lock's version, pinned by hash.
    locked = re.search(r"^torch==([0-9.]+)\+cpu", (ROOT / "requirements.lock").read_text(), re.M)
    assert locked and f"torch=={locked[1]} --hash=sha256:" in runs
    assert re.fullmatch(r"[0-9a-f]{64}", args["TORCH_CUDA_SHA256"])
    env = " ".join(a for k, a in steps if k == "ENV")
    assert "IMAGE_TAG=${IMAGE_TAG}" in env and "ML_LIFECYCLE_ENV=prod" in env


def test_the_image_holds_every_package_compiled_to_bytecode():
    """A pod cannot write __pycache__ (the app folder is read-only to it): bytecode is compiled
    when the image is built, site-packages by uv and the project's own packages by compileall."""
    steps = dockerfile()
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {
        p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    }
    copied = {a.split()[0] for k, a in steps if k == "COPY" and not a.startswith("--")}
    assert packages <= copied
    assert "UV_COMPILE_BYTECODE=1" in " ".join(a for k, a in steps if k == "ENV")
    (compiled,) = [a for k, a in steps if k == "RUN" and "compileall" in a]
    assert packages | {"feature_repo"} <= set(compiled.split())


def test_the_build_context_leaves_out_local_state():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", ".local", ".env"} <= ignored
    copied = [a.split()[0] for k, a in dockerfile() if k == "COPY" and not a.startswith("--")]
    assert not any(c.rstrip("/") in ignored for c in copied)


# --- Helm values against the chart's schema --------------------------------------------------


def k8s_definitions() -> Resource:
    """The chart's schema points its Kubernetes types at a remote copy of the 1.19 OpenAPI
    definitions; resolve them to the oldest cluster version we support instead, offline."""
    path = K8S_DEFINITIONS / f"v{OLDEST_K8S}.0-local" / "_definitions.json"
    contents = json.loads(path.read_text())
    # kubernetes-validate keeps them under `$defs`; the chart points into `definitions`.
    contents["definitions"] = contents["$defs"]
    return Resource.from_contents(contents)


def helm_validator(required: bool) -> jsonschema.Draft202012Validator:
    """The chart's values schema. Helm checks it on the chart's defaults merged with ours; the
    defaults file is not vendored, so `required=False` drops the keys the defaults supply and
    keeps every type, enum and unknown-key rule."""
    schema = json.loads((SCHEMAS / HELM_SCHEMA).read_text())

    def retrieve(uri: str) -> Resource:
        assert uri.endswith("/_definitions.json"), uri
        return k8s_definitions()

    if not required:

        def drop(node: Any) -> None:
            if isinstance(node, dict):
                node.pop("required", None)
                for value in node.values():
                    drop(value)
            elif isinstance(node, list):
                for value in node:
                    drop(value)

        drop(schema)
    return jsonschema.Draft202012Validator(schema, registry=Registry(retrieve=retrieve))


def values() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "helm" / "values.yaml").read_text())


def test_the_vendored_chart_schema_is_the_file_its_readme_names():
    digest = hashlib.sha256((SCHEMAS / HELM_SCHEMA).read_bytes()).hexdigest()
    readme = (SCHEMAS / "README.md").read_text()
    assert re.search(rf"`{re.escape(HELM_SCHEMA)}`.*`{digest}`", readme)


def test_the_helm_values_validate_against_the_charts_schema():
    helm_validator(required=False).validate(values())


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("runLauncher", "type"), "K8sRunLaunchr"),  # not one of the launchers
        (("concurrency", "runs", "maxConcurrentRuns"), "three"),
        (
            ("dagsterDaemon", "runCoordinator", "config", "queuedRunCoordinator", "maxRuns"),
            3,
        ),  # a typo
        (("dagsterWebserver", "service", "nodePort"), 30000),
        (("dagster-user-deployments", "deployments", 0, "port"), "3030"),
        # Inside a Kubernetes type, checked through the resolved OpenAPI definitions.
        (("dagster-user-deployments", "deployments", 0, "resources", "limits"), "2 cpus"),
    ],
)
def test_the_charts_schema_rejects_broken_values(path, bad):
    broken = copy.deepcopy(values())
    node = broken
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        helm_validator(required=False).validate(broken)


def test_the_full_schema_needs_the_charts_defaults():
    # What `required=False` leaves to Helm: our file alone is not a complete values document.
    errors = list(helm_validator(required=True).iter_errors(values()))
    assert errors and all(e.validator == "required" for e in errors)


def test_the_instance_in_the_values_mirrors_deploy_dagster_yaml():
    instance = yaml.safe_load((DEPLOY / "dagster.yaml").read_text())
    helm = values()
    runs = instance["concurrency"]["runs"]
    assert helm["concurrency"]["enabled"] is True
    assert helm["concurrency"]["runs"]["maxConcurrentRuns"] == runs["max_concurrent_runs"]
    assert helm["concurrency"]["runs"]["tagConcurrencyLimits"] == runs["tag_concurrency_limits"]
    pools = instance["concurrency"]["pools"]["default_limit"]
    assert helm["concurrency"]["pools"]["defaultLimit"] == pools
    daemon = helm["dagsterDaemon"]
    monitoring = instance["run_monitoring"]
    assert daemon["runMonitoring"] == {
        "enabled": True,
        "startTimeoutSeconds": monitoring["start_timeout_seconds"],
        "pollIntervalSeconds": monitoring["poll_interval_seconds"],
    }
    retries = instance["run_retries"]
    assert daemon["runRetries"] == {
        "enabled": True,
        "maxRetries": retries["max_retries"],
        "retryOnAssetOrOpFailure": retries["retry_on_asset_or_op_failure"],
    }
    assert daemon["runCoordinator"]["type"] == "QueuedRunCoordinator"
    catchup = instance["scheduler"]["config"]["max_catchup_runs"]
    assert helm["scheduler"]["config"]["daemonScheduler"]["maxCatchupRuns"] == catchup
    assert helm["telemetry"]["enabled"] is instance["telemetry"]["enabled"] is False


def test_the_user_code_runs_prod_with_secrets_and_the_image_tag_and_the_ui_is_private():
    helm = values()
    (deployment,) = helm["dagster-user-deployments"]["deployments"]
    env = {e["name"]: e["value"] for e in deployment["env"]}
    assert env["ML_LIFECYCLE_ENV"] == "prod"
    image = deployment["image"]
    assert env["IMAGE_TAG"] == f"{image['repository']}:{image['tag']}"
    assert deployment["dagsterApiGrpcArgs"] == ["-m", "pipelines.definitions"]
    assert deployment["envSecrets"] == [{"name": "ml-lifecycle-env"}]
    assert deployment["podSecurityContext"]["runAsUser"] == 1000
    # No connection string in the values: they are in the Secret.
    assert not re.search(r"(postgres(ql)?|redis)://", (DEPLOY / "helm" / "values.yaml").read_text())
    assert helm["dagsterWebserver"]["service"]["type"] == "ClusterIP"
    assert helm["ingress"]["enabled"] is False
    assert helm["postgresql"]["enabled"] is False
    assert helm["runLauncher"]["type"] == "K8sRunLauncher"


# --- Step pods from the assets' tags ---------------------------------------------------------


def asset_ops() -> dict[str, dict[str, str]]:
    """op name -> op tags, for every asset op of the code location."""
    from pipelines.definitions import USE_CASES, use_case_definitions

    ops: dict[str, dict[str, str]] = {}
    for case in USE_CASES:
        for definition in use_case_definitions(case).assets or []:
            if isinstance(definition, dg.AssetsDefinition) and definition.is_executable:
                ops[definition.op.name] = dict(definition.op.tags)
    return ops


def step_job(tags: dict[str, str], op_name: str) -> dict[str, Any]:
    """The Job dagster-k8s' step handler would create for a step with these tags."""
    from dagster_k8s.job import (
        DagsterK8sJobConfig,
        UserDefinedDagsterK8sConfig,
        construct_dagster_k8s_job,
        get_user_defined_k8s_config,
    )

    config = DagsterK8sJobConfig(
        job_image="registry.example.com/ml-lifecycle:0.1.0",
        dagster_home="/opt/dagster/home",
        image_pull_policy="IfNotPresent",
        service_account_name="dagster",
        instance_config_map="dagster-instance",
        env_secrets=["ml-lifecycle-env"],
    )
    user_defined = get_user_defined_k8s_config(tags)
    assert isinstance(user_defined, UserDefinedDagsterK8sConfig)
    job = construct_dagster_k8s_job(
        config,
        ["dagster", "api", "execute_step"],
        f"dagster-step-{op_name.replace('_', '-')}"[:63],
        user_defined_k8s_config=user_defined,
        component="step_worker",
    )
    sent = k8s.ApiClient().sanitize_for_serialization(job)
    assert isinstance(sent, dict)
    return sent


def test_every_asset_op_asks_for_its_pod():
    ops = asset_ops()
    assert "flights__trained_model" in ops and "ridership__trained_model" in ops and len(ops) > 10
    assert all("dagster-k8s/config" in tags for tags in ops.values()), [
        name for name, tags in ops.items() if "dagster-k8s/config" not in tags
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_step_jobs_validate_and_only_training_asks_for_a_gpu(version):
    """Training and a study's trials (torchrun in the step's pod) ask for a GPU; nothing else."""
    for name, tags in asset_ops().items():
        job = step_job(tags, name)
        kubernetes_validate.validate(job, desired_version=version, strict=True)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        resources = container["resources"]
        assert resources["requests"] == resources["limits"], name
        gpus = resources["limits"].get("nvidia.com/gpu")
        # a study's trials train, and a backtest's folds
        trains = name.endswith(("__trained_model", "__study", "__backtest"))
        assert (gpus is not None) == trains, name
    name = "flights__trained_model"
    training = step_job(asset_ops()[name], name)["spec"]["template"]["spec"]
    assert training["tolerations"][0]["key"] == "nvidia.com/gpu"


# --- RBAC: the Role grants what the launchers call, nothing else -------------------------------


def test_training_pods_have_an_account_without_a_token_or_a_role():
    documents = list(yaml.safe_load_all((DEPLOY / "k8s" / "rbac.yaml").read_text()))
    (account,) = [d for d in documents if d["kind"] == "ServiceAccount"]
    assert account["automountServiceAccountToken"] is False
    bindings = [d for d in documents if d["kind"] == "RoleBinding"]
    assert all(s["name"] != account["metadata"]["name"] for b in bindings for s in b["subjects"])
    launcher = yaml.safe_load(
        yaml.safe_load((DEPLOY / "k8s" / "launcher-config.yaml").read_text())["data"][
            "launcher.yaml"
        ]
    )
    assert launcher["service_account"] == account["metadata"]["name"]
    one_pod(**{k: v for k, v in launcher.items() if k != "tolerations"})  # the fields are valid


# --- Every manifest against the Kubernetes schema ---------------------------------------------


def manifests() -> list[dict[str, Any]]:
    return [
        document
        for path in sorted((DEPLOY / "k8s").glob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_manifests_validate_against_the_kubernetes_schema(version):
    kinds = set()
    for manifest in manifests():
        kubernetes_validate.validate(manifest, desired_version=version, strict=True)
        assert manifest["metadata"]["namespace"] == "ml-lifecycle"
        kinds.add(manifest["kind"])
    wanted = {"ServiceAccount", "Role", "RoleBinding", "NetworkPolicy", "PersistentVolumeClaim"}
    assert wanted | {"ConfigMap"} == kinds


def test_kubernetes_validation_rejects_a_broken_manifest():
    (policy,) = [m for m in manifests() if m["kind"] == "NetworkPolicy"]
    broken = copy.deepcopy(policy)
    broken["spec"]["egress"][1]["ports"][0]["protocol"] = ["UDP"]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, desired_version=OLDEST_K8S, strict=True)


# --- A registered version's tags ------------------------------------------------------------


@pytest.mark.parametrize(
    ("catalog", "tag"),
    [({"name": "tuned", "sha256": "ab" * 32}, "tuned@" + "ab" * 32), ({"name": ""}, None)],
)
def test_a_version_is_tagged_with_the_catalog_entry_its_run_manifest_records(
    tmp_path: Path, catalog: dict[str, str], tag: str | None
):
    value = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [value], [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    ])  # fmt: skip
    onnx.save_model(helper.make_model(graph), tmp_path / "model.onnx")
    (tmp_path / "manifest.json").write_text(json.dumps({"config": {"catalog": catalog}}))
    run = TrainedRun(str(tmp_path), "f" * 64, "trips_v1", "mlflow-run-1")
    judged = dataclasses.replace(evaluation(np.linspace(0.01, 0.99, 2_000)), trained=run)
    exported = OnnxModel(str(tmp_path / "model.onnx"), "0" * 64, WEIGHTS, {"passed": True}, False)
    label = Label(view="trip_outcome", column="late", task="binary", table="trips")
    plan = plan_registration("trips", judged, exported, "3", label, "r", 0o640)
    assert plan.tags.get(CONFIG_TAG) == tag and CONFIG_TAG == "config"
    assert plan.tags["weights_sha256"] == WEIGHTS
    assert plan.documents["manifest.json"] == {"config": {"catalog": catalog}}
