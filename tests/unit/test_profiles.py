"""The environments of pipelines/definitions.py: what the production profile reads from the
environment (and that deploy/.env.example lists all of it), its instance file, the Feast services
it swaps in, and the launcher chosen per environment. Nothing here connects to a service."""

import os
import re
from pathlib import Path
from unittest import mock

import dagster as dg
import pytest
import yaml

from pipelines.definitions import (
    INSTANCE_FILES,
    executor,
    launcher,
    local_resources,
    production_resources,
)
from pipelines.settings import Settings
from resources.documents import JsonDocuments
from resources.feature_store import FeastFeatureStore, Services, local_folder
from resources.kubernetes import K8sMultiNode, K8sPod
from resources.lake import LakeFiles, ParquetLake
from resources.launchers import LocalTorchrun, TrainingLauncher

pytestmark = pytest.mark.unit


def settings(home: Path, **variables: str) -> Settings:
    """The settings of a deployment under `home` with these variables set."""
    return Settings.from_env({"ML_LIFECYCLE_HOME": str(home), **variables})


REPO = Path(__file__).resolve().parents[2]
ENV_EXAMPLE = REPO / "deploy" / ".env.example"


def env_vars(value: object) -> set[str]:
    """Names of the EnvVars a resource (and the resources it holds) reads."""
    if isinstance(value, dg.EnvVar):
        return {value.env_var_name}
    if isinstance(value, dg.ConfigurableResource | dg.ConfigurableIOManager):
        return set().union(*(env_vars(getattr(value, f)) for f in type(value).model_fields))
    return set()


def listed() -> set[str]:
    names = re.findall(r"^#?\s*([A-Z][A-Z0-9_]+)=", ENV_EXAMPLE.read_text(), re.MULTILINE)
    return set(names)


def instance_env_vars(path: Path) -> set[str]:
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if set(node) == {"env"}:
                found.add(node["env"])
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)

    walk(yaml.safe_load(path.read_text()))
    return found


def test_every_setting_the_production_profile_reads_is_in_the_env_example(tmp_path):
    resources = production_resources(settings(tmp_path, ML_LIFECYCLE_ENV="prod"))
    read = set().union(*(env_vars(r) for r in resources.values()))
    assert {
        "ML_LIFECYCLE_LAKE_URL",
        "FEAST_REGISTRY_URL",
        "FEAST_REDIS_URL",
        "MLFLOW_TRACKING_URI",
        "MLFLOW_ARTIFACT_ROOT",
    } <= read
    read |= instance_env_vars(INSTANCE_FILES["prod"])
    assert "DAGSTER_POSTGRES_URL" in read
    read |= {"ML_LIFECYCLE_ENV", "ML_LIFECYCLE_HOME", "ML_LIFECYCLE_LAUNCHER", "DAGSTER_HOME"}
    assert read <= listed(), sorted(read - listed())


def test_the_production_instance_file_is_a_valid_instance_config(tmp_path):
    from dagster._core.instance.config import dagster_instance_config

    (tmp_path / "dagster.yaml").write_text(INSTANCE_FILES["prod"].read_text())
    with mock.patch.dict(os.environ, {"DAGSTER_POSTGRES_URL": "postgresql+psycopg2://u@h/db"}):
        config, _ = dagster_instance_config(str(tmp_path))
    assert config["storage"]["postgres"]["postgres_url"] == {"env": "DAGSTER_POSTGRES_URL"}
    assert config["run_coordinator"]["class"] == "QueuedRunCoordinator"
    limits = config["concurrency"]["runs"]
    backfill = {t["key"]: t["limit"] for t in limits["tag_concurrency_limits"]}["dagster/backfill"]
    assert 0 < backfill < limits["max_concurrent_runs"]
    assert config["run_monitoring"]["enabled"] and config["run_retries"]["enabled"]


def test_an_unknown_environment_is_refused_by_name(tmp_path):
    expected = r"ML_LIFECYCLE_ENV='staging'.*local, prod"
    with pytest.raises(ValueError, match=expected):
        settings(tmp_path, ML_LIFECYCLE_ENV="staging")


def test_the_services_replace_the_files_registry_and_online_store():
    settings = {
        "registry": "/home/feast/registry.db",
        "online_store": {"type": "sqlite", "path": "/home/feast/online.db"},
        "batch_engine": "ml.featurestore.online_sqlite.BulkSqliteComputeEngine",
        "offline_store": {"type": "some.Store", "root": "/home/lake"},
    }
    moved = Services(
        registry_url="postgresql+psycopg2://feast@db/feast",
        redis_url="redis:6379,db=2",
        offline_root="file:///srv/lake%20a",
    ).apply_to(settings)
    assert moved["registry"]["registry_type"] == "sql"
    assert moved["registry"]["path"] == "postgresql+psycopg2://feast@db/feast"
    assert moved["online_store"] == {"type": "redis", "connection_string": "redis:6379,db=2"}
    assert moved["batch_engine"] == "local"
    assert moved["offline_store"] == {"type": "some.Store", "root": "/srv/lake a"}
    assert Services().apply_to(settings) == settings


def test_the_spark_engine_reads_the_same_lake_and_fills_the_same_online_store(tmp_path):
    from resources.feature_store import SPARK_ENGINE, SPARK_STORE

    settings = {
        "online_store": {"type": "sqlite", "path": "/home/feast/online.db"},
        "batch_engine": "ml.featurestore.online_sqlite.BulkSqliteComputeEngine",
        "offline_store": {"type": "some.Store", "root": "/home/lake"},
    }
    conf = (("spark.master", "local[2]"),)
    moved = Services(offline_root="/srv/lake", spark_conf=conf).apply_to(settings)
    assert moved["offline_store"] == {
        "type": SPARK_STORE,
        "root": "/srv/lake",
        "spark_conf": {"spark.master": "local[2]"},
    }
    assert moved["batch_engine"] == {
        "type": SPARK_ENGINE,
        "spark_conf": {"spark.master": "local[2]"},
    }
    assert moved["online_store"] == settings["online_store"]

    spark = local_resources(Settings(home=tmp_path, engine="spark", spark_master="local[3]"))
    feature_store = spark["feature_store"]
    assert isinstance(feature_store, FeastFeatureStore)
    assert feature_store.spark_conf is not None
    assert feature_store.spark_conf["spark.master"] == "local[3]"
    embedded = local_resources(Settings(home=tmp_path))["feature_store"]
    assert isinstance(embedded, FeastFeatureStore) and embedded.spark_conf is None


def test_the_offline_store_refuses_a_lake_it_cannot_read_by_scheme():
    assert local_folder("/srv/lake") == "/srv/lake"
    assert local_folder("file:///srv/lake") == "/srv/lake"
    with pytest.raises(ValueError, match="not s3://"):
        local_folder("s3://bucket/lake")


CLUSTER = {
    "output_root": "/checkpoints",
    "namespace": "ml-training",
    "checkpoint_claim": "training-checkpoints",
    "gpus_per_pod": 4,
}


def test_the_launcher_is_chosen_per_environment_with_the_image_the_code_runs_in(tmp_path):
    config = tmp_path / "launcher.yaml"
    config.write_text(yaml.safe_dump(CLUSTER))
    image = "registry.example.com/ml-lifecycle@sha256:" + "a" * 64
    base = {"ML_LIFECYCLE_LAUNCHER_CONFIG": str(config), "IMAGE_TAG": image}
    assert isinstance(launcher(settings(tmp_path, ML_LIFECYCLE_LAUNCHER="torchrun")), LocalTorchrun)
    pod = launcher(settings(tmp_path, **base, ML_LIFECYCLE_LAUNCHER="k8s-pod"))
    assert isinstance(pod, K8sPod)
    assert (pod.image, pod.gpus_per_pod, pod.namespace) == (image, 4, "ml-training")
    multinode = settings(tmp_path, **base, ML_LIFECYCLE_LAUNCHER="k8s-multinode")
    assert isinstance(launcher(multinode), K8sMultiNode)


def test_a_wrong_launcher_setting_is_refused_when_the_code_loads(tmp_path):
    expected = r"ML_LIFECYCLE_LAUNCHER='slurm'.*k8s-pod"
    with pytest.raises(ValueError, match=expected):
        settings(tmp_path, ML_LIFECYCLE_LAUNCHER="slurm")
    with pytest.raises(ValueError, match="needs ML_LIFECYCLE_LAUNCHER_CONFIG"):
        settings(tmp_path, ML_LIFECYCLE_LAUNCHER="k8s-pod")
    config = tmp_path / "launcher.yaml"
    config.write_text(yaml.safe_dump({**CLUSTER, "output_root": "relative/path"}))
    variables = {
        "ML_LIFECYCLE_LAUNCHER": "k8s-pod",
        "ML_LIFECYCLE_LAUNCHER_CONFIG": str(config),
        "IMAGE_TAG": "img:1",
    }
    with pytest.raises(ValueError, match="output_root"):
        launcher(settings(tmp_path, **variables))


def test_one_file_mode_reaches_every_resource_that_publishes_files(tmp_path):
    publishing = ["lake", "lake_paths", "documents", "lake_files", "launcher"]

    def modes(resources: dict[str, object]) -> dict[str, int]:
        kinds = (ParquetLake, JsonDocuments, LakeFiles, TrainingLauncher)
        return {k: r.file_mode for k, r in resources.items() if isinstance(r, kinds)}

    for make in (local_resources, production_resources):
        assert modes(make(settings(tmp_path))) == dict.fromkeys(publishing, 0o640)
        world_readable = settings(tmp_path, ML_LIFECYCLE_FILE_MODE="0644")
        assert modes(make(world_readable)) == dict.fromkeys(publishing, 0o644)
    for wrong in ("rw-r-----", "0755", "0400"):
        with pytest.raises(ValueError, match=f"ML_LIFECYCLE_FILE_MODE='{wrong}'"):
            settings(tmp_path, ML_LIFECYCLE_FILE_MODE=wrong)


def test_the_executor_is_chosen_by_name_and_a_wrong_one_is_refused(tmp_path):
    from dagster_k8s import k8s_job_executor

    chosen = {
        name: executor(settings(tmp_path, ML_LIFECYCLE_EXECUTOR=name))
        for name in ("in_process", "multiprocess", "k8s_job")
    }
    assert chosen == {
        "in_process": dg.in_process_executor,
        "multiprocess": dg.multiprocess_executor,
        "k8s_job": k8s_job_executor,
    }
    with pytest.raises(ValueError, match="'celery'"):
        settings(tmp_path, ML_LIFECYCLE_EXECUTOR="celery")


def test_the_launcher_settings_deployed_as_a_configmap_build_both_cluster_launchers(tmp_path):
    configmap = yaml.safe_load((REPO / "deploy" / "k8s" / "launcher-config.yaml").read_text())
    config = tmp_path / "launcher.yaml"
    config.write_text(configmap["data"]["launcher.yaml"])
    for kind, cls in (("k8s-pod", K8sPod), ("k8s-multinode", K8sMultiNode)):
        variables = {"ML_LIFECYCLE_LAUNCHER": kind, "ML_LIFECYCLE_LAUNCHER_CONFIG": str(config)}
        built = launcher(settings(tmp_path, **variables))
        assert isinstance(built, cls)
        assert built.gpus_per_pod >= 1 and built.service_account == "ml-trainer"


def test_the_production_registry_links_the_uis_people_open():
    from resources.registry import production_registry

    assert {"MLFLOW_UI_URL", "DAGSTER_UI_URL"} <= listed()
    urls = {"MLFLOW_UI_URL": "https://mlflow.example", "DAGSTER_UI_URL": "https://dagster.example"}
    with mock.patch.dict(os.environ, urls):
        registry = production_registry()
    assert (registry.ui_url, registry.dagster_url) == tuple(urls.values())
    assert (
        registry.dagster_run("0123456789") == "[01234567](https://dagster.example/runs/0123456789)"
    )
    with mock.patch.dict(os.environ, {"MLFLOW_UI_URL": "", "DAGSTER_UI_URL": ""}):
        unset = production_registry()  # the local UIs, as a development machine has them
    assert (unset.ui_url, unset.dagster_url) == ("http://127.0.0.1:5000", "http://127.0.0.1:3000")
