"""THE entry point: one Definitions for the whole lifecycle.

The environment is chosen here and nowhere else (`ML_LIFECYCLE_ENV`, default `local`):

- `local`: embedded defaults. State lives under one folder, `ML_LIFECYCLE_HOME` (default
  `<repo>/.local`), so a reset is one `rm -rf`.
- `prod`: shared services, every connection setting from the environment through `EnvVar`
  (deploy/.env.example lists them): the lake at `ML_LIFECYCLE_LAKE_URL`, Feast's SQL registry
  (`FEAST_REGISTRY_URL`) and Redis online store (`FEAST_REDIS_URL`), MLflow on PostgreSQL
  (`MLFLOW_TRACKING_URI`, `MLFLOW_ARTIFACT_ROOT`). The Dagster instance (PostgreSQL, queued runs)
  is deploy/dagster.yaml, or the Helm chart's on Kubernetes. Working files (checkpoints, the
  serving cache, GX data docs) stay under `ML_LIFECYCLE_HOME`, a volume on a cluster.

In both, `ML_LIFECYCLE_LAUNCHER` chooses where training runs: `torchrun` (default; this machine or
the run's pod), `k8s-pod` or `k8s-multinode` (resources/kubernetes.py), configured by the YAML file
`ML_LIFECYCLE_LAUNCHER_CONFIG` (docs/kubernetes.md). Raw data comes from each use case's bundled
data set unless `ML_LIFECYCLE_DROP_FOLDER` names a folder of daily drops (each file at most
`ML_LIFECYCLE_MAX_DROP_MIB`, default 256, read `ML_LIFECYCLE_CHUNK_MIB` at a time, default 4,
once unchanged for `ML_LIFECYCLE_DROP_SETTLE_S`, default 2, or once its completion marker of the
suffix `ML_LIFECYCLE_DROP_COMPLETION_SUFFIX` is there, where the producer writes one);
`ML_LIFECYCLE_TRAIN_PROCESSES` fixes the torchrun workers (default: measured), and
`ML_LIFECYCLE_FILE_MODE` (octal, default 640) the mode of the files the pipeline publishes: lake
tables and documents, predictions, a training run's weights, checkpoints and ONNX files. Loading
this module imports no heavy library (see tests/unit/test_definitions.py).
"""

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import dagster as dg

from assets.deployment import deployment_assets
from assets.evaluation import evaluation_assets
from assets.features import feature_assets
from assets.inference import inference_assets
from assets.ingestion import dimension_assets, source_key
from assets.monitoring import monitoring_assets
from assets.training import training_assets
from assets.validation import event_table_assets
from declare import UseCase
from declare.references import check_repository
from ml.files import FILE_MODE, check_file_mode
from pipelines.jobs import build_jobs, find_job
from pipelines.schedules import AutomationSettings, build_schedules
from pipelines.sensors import (
    EVENTS,
    build_event_sensor,
    build_prediction_sensor,
    build_range_sensor,
)
from resources.expectations import GreatExpectations
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from resources.k8s_manifests import KubernetesLauncher
from resources.kubernetes import K8sMultiNode, K8sPod
from resources.lake import JsonDocuments, LakeFiles, LakePaths, ParquetLake
from resources.launchers import LocalTorchrun, TrainingLauncher
from resources.registry import MlflowRegistry, local_registry, production_registry
from resources.serving import ModelServing
from resources.sources import DropFolderSource, RawSource
from usecases import USE_CASES

REPO_ROOT = Path(__file__).resolve().parents[1]


def local_home() -> Path:
    """The folder that holds all local state (Dagster home, lake, GX docs, later models)."""
    return Path(os.environ.get("ML_LIFECYCLE_HOME", REPO_ROOT / ".local")).resolve()


def source(case: UseCase) -> RawSource:
    """Where `case`'s raw tables come from: the drop folder `ML_LIFECYCLE_DROP_FOLDER` (one for
    every use case: tables are told apart by name), else the use case's bundled data."""
    drops = os.environ.get("ML_LIFECYCLE_DROP_FOLDER")
    if not drops:
        return case.source()
    settings: dict[str, Any] = {
        field: float(value)
        for field, variable in (
            ("max_drop_mib", "ML_LIFECYCLE_MAX_DROP_MIB"),
            ("chunk_mib", "ML_LIFECYCLE_CHUNK_MIB"),
            ("settle_s", "ML_LIFECYCLE_DROP_SETTLE_S"),
        )
        if (value := os.environ.get(variable))
    }
    if suffix := os.environ.get("ML_LIFECYCLE_DROP_COMPLETION_SUFFIX"):
        settings["completion_suffix"] = suffix
    return DropFolderSource(root=drops, **settings)


def batched(case: UseCase) -> UseCase:
    """`case` with `ML_LIFECYCLE_DAYS_PER_RUN`, when set, as the days a backfill run takes
    together (the declaration's `partitions.days_per_run` otherwise): fewer on a machine where
    a run of a month takes too long to give back its slot, more where process starts dominate."""
    text = os.environ.get("ML_LIFECYCLE_DAYS_PER_RUN")
    if not text:
        return case
    try:
        days = int(text)
    except ValueError:
        raise ValueError(f"ML_LIFECYCLE_DAYS_PER_RUN={text!r} is not a whole number") from None
    changed = dataclasses.replace(
        case, partitions=dataclasses.replace(case.partitions, days_per_run=days)
    )
    changed.partitions.check(case.name)
    return changed


def file_mode() -> int:
    """`ML_LIFECYCLE_FILE_MODE`, an octal mode such as 640 (the default: group-readable) or 644
    (world-readable), checked."""
    text = os.environ.get("ML_LIFECYCLE_FILE_MODE")
    if not text:
        return FILE_MODE
    try:
        return check_file_mode(int(text, 8))
    except ValueError as error:
        raise ValueError(f"ML_LIFECYCLE_FILE_MODE={text!r}: {error}") from None


def _registry(home: Path) -> MlflowRegistry:
    """MLflow under `home` (SQLite + files), or a shared server when `MLFLOW_TRACKING_URI` is set,
    as MLflow's own tools read it."""
    return production_registry() if os.environ.get("MLFLOW_TRACKING_URI") else local_registry(home)


LAUNCHERS: dict[str, type[KubernetesLauncher]] = {"k8s-pod": K8sPod, "k8s-multinode": K8sMultiNode}
"""The cluster launchers by `ML_LIFECYCLE_LAUNCHER` value; `torchrun` is the default."""


def launcher(home: Path, mode: int = FILE_MODE) -> TrainingLauncher:
    """The training launcher `ML_LIFECYCLE_LAUNCHER` names.

    A cluster launcher takes its fields from the YAML file `ML_LIFECYCLE_LAUNCHER_CONFIG` (a
    ConfigMap on a cluster). Its image defaults to `IMAGE_TAG`, the image this code runs in, so
    training runs the same code and the run manifest records which. These are settings, not
    secrets; they are checked here, when the code location loads, so a mistake shows at deploy."""
    kind = os.environ.get("ML_LIFECYCLE_LAUNCHER", "torchrun")
    if kind == "torchrun":
        processes = os.environ.get("ML_LIFECYCLE_TRAIN_PROCESSES")
        return LocalTorchrun(
            output_root=str(home / "models"),
            processes=int(processes) if processes else None,
            file_mode=mode,
        )
    if kind not in LAUNCHERS:
        known = ", ".join(["torchrun", *LAUNCHERS])
        raise ValueError(f"ML_LIFECYCLE_LAUNCHER={kind!r} is not a launcher; use one of {known}")
    settings_file = os.environ.get("ML_LIFECYCLE_LAUNCHER_CONFIG")
    if not settings_file:
        raise ValueError(f"ML_LIFECYCLE_LAUNCHER={kind} needs ML_LIFECYCLE_LAUNCHER_CONFIG")
    import yaml

    settings = yaml.safe_load(Path(settings_file).read_text()) or {}
    if not isinstance(settings, dict):
        raise ValueError(f"ML_LIFECYCLE_LAUNCHER_CONFIG={settings_file}: expected a mapping")
    if "image" not in settings and os.environ.get("IMAGE_TAG"):
        settings["image"] = os.environ["IMAGE_TAG"]
    return LAUNCHERS[kind](**{"file_mode": mode, **settings})


def sources() -> dict[str, RawSource]:
    """Each use case's raw source, under its resource key."""
    return {source_key(case): source(case) for case in USE_CASES}


def local_resources(home: Path) -> dict[str, object]:
    """Embedded defaults: everything on this machine, under `home`."""
    registry = _registry(home)
    lake, mode = str(home / "lake"), file_mode()
    return {
        **sources(),
        "lake": ParquetLake(root=lake, file_mode=mode),
        "lake_paths": LakePaths(root=lake, file_mode=mode),
        "expectations": GreatExpectations(data_docs_dir=str(home / "gx" / "data_docs")),
        "feature_store": FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)),
        "documents": JsonDocuments(root=lake, file_mode=mode),
        "lake_files": LakeFiles(root=lake, file_mode=mode),
        "launcher": launcher(home, mode),
        "mlflow": registry,
        "serving": ModelServing(registry=registry, cache_dir=str(home / "models" / "serving")),
    }


def production_resources(home: Path) -> dict[str, object]:
    """Shared services, connected through `EnvVar` (read when a run starts, never shown in run
    config or the UI): the same resources as `local_resources`, other backends."""
    lake = dg.EnvVar("ML_LIFECYCLE_LAKE_URL")
    registry, mode = production_registry(), file_mode()
    return {
        **sources(),
        "lake": ParquetLake(root=lake, file_mode=mode),
        # A training set in an object store is copied here for torchrun (on a volume the
        # training pods mount at the same path, with the Kubernetes launchers).
        "lake_paths": LakePaths(root=lake, staging_dir=str(home / "lake-staging"), file_mode=mode),
        "expectations": GreatExpectations(data_docs_dir=str(home / "gx" / "data_docs")),
        "feature_store": FeastFeatureStore(
            repo_path=str(DEFAULT_REPO),
            home=str(home),
            registry_url=dg.EnvVar("FEAST_REGISTRY_URL"),
            redis_url=dg.EnvVar("FEAST_REDIS_URL"),
            offline_root=lake,
        ),
        "documents": JsonDocuments(root=lake, file_mode=mode),
        "lake_files": LakeFiles(root=lake, file_mode=mode),
        "launcher": launcher(home, mode),
        "mlflow": registry,
        "serving": ModelServing(registry=registry, cache_dir=str(home / "models" / "serving")),
    }


def executor() -> dg.ExecutorDefinition:
    """How a run executes its steps, `ML_LIFECYCLE_EXECUTOR`:

    - `in_process` (default): one process per run. On a two-core machine a process per step
      spends more time importing GX (~7 s), Feast (~11 s) and torch than the step computes; runs
      still go side by side (max_concurrent_runs, dagster.yaml).
    - `multiprocess`: a process per step, steps of one run in parallel.
    - `k8s_job`: a Kubernetes pod per step, sized by its `dagster-k8s/config` tags
      (assets/pods.py; docs/cluster.md)."""
    name = os.environ.get("ML_LIFECYCLE_EXECUTOR", "in_process")
    if name == "in_process":
        return dg.in_process_executor
    if name == "multiprocess":
        return dg.multiprocess_executor
    if name == "k8s_job":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    raise ValueError(
        f"ML_LIFECYCLE_EXECUTOR={name!r} is not an executor; use in_process, multiprocess or"
        " k8s_job"
    )


ENVIRONMENTS = {"local": local_resources, "prod": production_resources}
INSTANCE_FILES = {
    "local": REPO_ROOT / "deploy" / "dagster.local.yaml",
    "prod": REPO_ROOT / "deploy" / "dagster.yaml",
}
"""The Dagster instance of each environment, as copied into DAGSTER_HOME (`make run`, `make dev`;
on Kubernetes the Helm chart writes the production one)."""


def environment() -> str:
    """`ML_LIFECYCLE_ENV`, checked."""
    name = os.environ.get("ML_LIFECYCLE_ENV", "local")
    if name not in ENVIRONMENTS:
        known = " or ".join(repr(known) for known in ENVIRONMENTS)
        raise ValueError(f"ML_LIFECYCLE_ENV={name!r} is not a known environment; use {known}")
    return name


def instance_file(environment: str) -> Path:
    return INSTANCE_FILES[environment]


def resources_for(environment: str) -> dict[str, object]:
    if environment not in ENVIRONMENTS:
        known = " or ".join(repr(name) for name in ENVIRONMENTS)
        raise ValueError(
            f"ML_LIFECYCLE_ENV={environment!r} is not a known environment; use {known}"
        )
    return ENVIRONMENTS[environment](local_home())


OWNERS = {
    "ingestion": ["team:data-platform"],
    "validation": ["team:data-platform"],
    "features": ["team:data-platform", "team:ml-platform"],
    "training": ["team:ml-platform"],
    "evaluation": ["team:ml-platform"],
    "deployment": ["team:ml-platform"],
    "inference": ["team:ml-platform"],
    "monitoring": ["team:ml-platform"],
}
"""Who answers for each stage of every use case (shown on every asset page and in the catalog)."""


def owned(case: UseCase, spec: dg.AssetSpec) -> dg.AssetSpec:
    """`spec` with the owners of its stage (OWNERS)."""
    stage = case.stage_of(spec.group_name or "")
    if stage not in OWNERS:
        raise ValueError(
            f"asset {spec.key.to_user_string()} is in group {spec.group_name!r},"
            f" whose stage {stage!r} has no owner in OWNERS"
        )
    return spec.replace_attributes(owners=OWNERS[stage])


def use_case_definitions(
    case: UseCase, automation: AutomationSettings | None = None
) -> dg.Definitions:
    """One use case's assets, checks, jobs, schedules and sensors, built from its declaration."""
    automation = automation or AutomationSettings.from_env(case)
    case = batched(case)
    assets = [
        *dimension_assets(case),
        *event_table_assets(case),
        *feature_assets(case),
        *training_assets(case),
        *evaluation_assets(case),
        *deployment_assets(case),
        *inference_assets(case),
        *monitoring_assets(case),
    ]
    jobs = build_jobs(case)
    return dg.Definitions(
        assets=dg.map_asset_specs(functools.partial(owned, case), assets),
        jobs=jobs,
        schedules=build_schedules(case, automation, jobs),
        sensors=[
            *(
                build_event_sensor(case, automation, find_job(jobs, case, "retrain"), event)
                for event in EVENTS
            ),
            build_range_sensor(case, find_job(jobs, case, "daily_partition")),
            *(
                [
                    build_prediction_sensor(
                        case,
                        automation,
                        find_job(jobs, case, "daily_partition"),
                        find_job(jobs, case, "predict_day"),
                    )
                ]
                if case.predicts_ahead
                else []
            ),
        ],
    )


def feast_repositories(resources: dict[str, object]) -> Path:
    """The folder of the use cases' Feast repositories that `resources` apply and read."""
    store = resources.get("feature_store")
    return Path(store.repo_path) if isinstance(store, FeastFeatureStore) else DEFAULT_REPO


def definitions(
    resources: dict[str, object],
    automation: AutomationSettings | None = None,
    use_cases: tuple[UseCase, ...] = USE_CASES,
) -> dg.Definitions:
    """Every use case's lifecycle, wired to `resources` (tests pass their own, under a temporary
    home), in one code location. Each use case's references into its Feast repository are
    checked first (`declare.references`): a wrong one stops the load, naming it."""
    repos = feast_repositories(resources)
    for case in use_cases:
        check_repository(case, repos / case.name)
    return dg.Definitions.merge(
        *(use_case_definitions(case, automation) for case in use_cases),
        dg.Definitions(resources=resources, executor=executor()),
    )


defs = definitions(resources_for(environment()))
