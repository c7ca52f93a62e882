"""THE entry point: one Definitions for the whole lifecycle.

The environment is chosen here and nowhere else, from one typed settings object read when the
code location loads (`pipelines.settings.Settings`; README.md's table lists every variable):

- `local` (default): embedded services. State lives under one folder, `ML_LIFECYCLE_HOME`
  (default `<repo>/.local`), so a reset is one `rm -rf`.
- `prod`: shared services, every connection setting from the environment through `EnvVar`
  (deploy/.env.example lists them): the lake at `ML_LIFECYCLE_LAKE_URL`, Feast's SQL registry
  (`FEAST_REGISTRY_URL`) and Redis online store (`FEAST_REDIS_URL`), MLflow on PostgreSQL
  (`MLFLOW_TRACKING_URI`, `MLFLOW_ARTIFACT_ROOT`). The Dagster instance (PostgreSQL, queued runs)
  is deploy/dagster.yaml, or the Helm chart's on Kubernetes. Working files (checkpoints, the
  serving cache, GX data docs) stay under `ML_LIFECYCLE_HOME`, a volume on a cluster.

Loading this module imports no heavy library (see tests/integration/test_imports.py).
"""

import functools
from pathlib import Path

import dagster as dg

from assets.backtest import backtest_assets
from assets.deployment import deployment_assets
from assets.evaluation import evaluation_assets
from assets.features import feature_assets
from assets.inference import inference_assets
from assets.ingestion import dimension_assets, source_key
from assets.monitoring import monitoring_assets
from assets.training import training_assets
from assets.tuning import tuning_assets
from assets.validation import event_table_assets
from declare import UseCase
from declare.references import check_repository, check_source
from pipelines.jobs import build_jobs, find_job
from pipelines.schedules import AutomationSettings, build_schedules
from pipelines.sensors import (
    EVENTS,
    build_event_sensor,
    build_prediction_sensor,
    build_range_sensor,
)
from pipelines.settings import REPO_ROOT, Settings
from resources.documents import JsonDocuments
from resources.expectations import GreatExpectations
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from resources.k8s_manifests import KubernetesLauncher
from resources.kubernetes import K8sMultiNode, K8sPod
from resources.lake import LakeFiles, LakePaths, ParquetLake
from resources.launchers import LocalTorchrun, TrainingLauncher
from resources.registry import MlflowRegistry, local_registry, production_registry
from resources.serving import ModelServing
from resources.sources import DropFolderSource, RawSource
from resources.spark import SparkEngine
from resources.studies import StudyStorage
from usecases import USE_CASES

DEFAULTS = Settings()
"""A deployment with no variable set: what tests build their definitions with."""


def source(case: UseCase, settings: Settings) -> RawSource:
    """Where `case`'s raw tables come from: the drop folder (one for every use case: tables are
    told apart by name), else the use case's bundled data."""
    if settings.drop_folder is None:
        return case.source()
    limits = {
        "max_drop_mib": settings.max_drop_mib,
        "chunk_mib": settings.chunk_mib,
        "settle_s": settings.drop_settle_s,
        "completion_suffix": settings.drop_completion_suffix,
    }
    given = {name: value for name, value in limits.items() if value is not None}
    return DropFolderSource(root=str(settings.drop_folder), **given)


def _registry(settings: Settings) -> MlflowRegistry:
    """MLflow under the home (SQLite + files), or a shared server when `MLFLOW_TRACKING_URI` is
    set, as MLflow's own tools read it."""
    return production_registry() if settings.shared_mlflow else local_registry(settings.home)


LAUNCHERS: dict[str, type[KubernetesLauncher]] = {"k8s-pod": K8sPod, "k8s-multinode": K8sMultiNode}
"""The cluster launchers by `ML_LIFECYCLE_LAUNCHER` value; `torchrun` is the default."""


def launcher(settings: Settings) -> TrainingLauncher:
    """The training launcher the settings name. A cluster launcher takes its fields from the
    YAML file `launcher_config` (a ConfigMap on a cluster); its image defaults to `image_tag`,
    the image this code runs in, so training runs the same code and the run manifest records
    which. They are checked here, when the code location loads, so a mistake shows at deploy."""
    mode = settings.file_mode
    if settings.launcher == "torchrun":
        return LocalTorchrun(
            output_root=str(settings.home / "models"),
            processes=settings.train_processes,
            file_mode=mode,
        )
    import yaml

    assert settings.launcher_config is not None  # Settings requires it for a cluster launcher
    fields = yaml.safe_load(settings.launcher_config.read_text()) or {}
    if not isinstance(fields, dict):
        raise ValueError(
            f"ML_LIFECYCLE_LAUNCHER_CONFIG={settings.launcher_config}: expected a mapping"
        )
    if "image" not in fields and settings.image_tag:
        fields["image"] = settings.image_tag
    return LAUNCHERS[settings.launcher](**{"file_mode": mode, **fields})


def sources(settings: Settings) -> dict[str, RawSource]:
    """Each use case's raw source, under its resource key."""
    return {source_key(case): source(case, settings) for case in USE_CASES}


def spark_conf(settings: Settings) -> dict[str, str] | None:
    """The Spark session the feature store joins and materializes on (`Settings.engine`);
    None: DuckDB, embedded."""
    if settings.engine != "spark":
        return None
    where = settings.spark_master
    engine = SparkEngine(remote=where) if where.startswith("sc://") else SparkEngine(master=where)
    return engine.session_conf()


def local_resources(settings: Settings) -> dict[str, object]:
    """Embedded defaults: everything on this machine, under the settings' home."""
    home, registry = settings.home, _registry(settings)
    lake, mode = str(home / "lake"), settings.file_mode
    return {
        **sources(settings),
        "lake": ParquetLake(root=lake, file_mode=mode),
        "lake_paths": LakePaths(root=lake, file_mode=mode),
        "expectations": GreatExpectations(data_docs_dir=str(home / "gx" / "data_docs")),
        "feature_store": FeastFeatureStore(
            repo_path=str(DEFAULT_REPO), home=str(home), spark_conf=spark_conf(settings)
        ),
        "documents": JsonDocuments(root=lake, file_mode=mode),
        "lake_files": LakeFiles(root=lake, file_mode=mode),
        "launcher": launcher(settings),
        "mlflow": registry,
        "serving": ModelServing(registry=registry, cache_dir=str(home / "models" / "serving")),
        "studies": StudyStorage(url=f"journal:{home / 'studies' / 'journal.log'}"),
    }


def production_resources(settings: Settings) -> dict[str, object]:
    """Shared services, connected through `EnvVar` (read when a run starts, never shown in run
    config or the UI): the same resources as `local_resources`, other backends."""
    lake = dg.EnvVar("ML_LIFECYCLE_LAKE_URL")
    home, registry, mode = settings.home, production_registry(), settings.file_mode
    return {
        **sources(settings),
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
            spark_conf=spark_conf(settings),
        ),
        "documents": JsonDocuments(root=lake, file_mode=mode),
        "lake_files": LakeFiles(root=lake, file_mode=mode),
        "launcher": launcher(settings),
        "mlflow": registry,
        "serving": ModelServing(registry=registry, cache_dir=str(home / "models" / "serving")),
        "studies": StudyStorage(url=dg.EnvVar("ML_LIFECYCLE_STUDY_STORAGE_URL")),
    }


def executor(settings: Settings) -> dg.ExecutorDefinition:
    """How a run executes its steps (`Settings.executor`):

    - `in_process` (default): one process per run. On a two-core machine a process per step
      spends more time importing GX (~7 s), Feast (~11 s) and torch than the step computes; runs
      still go side by side (max_concurrent_runs, dagster.yaml).
    - `multiprocess`: a process per step, steps of one run in parallel.
    - `k8s_job`: a Kubernetes pod per step, sized by its `dagster-k8s/config` tags
      (assets/pods.py; docs/cluster.md)."""
    if settings.executor == "multiprocess":
        return dg.multiprocess_executor
    if settings.executor == "k8s_job":
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor
    return dg.in_process_executor


ENVIRONMENTS = {"local": local_resources, "prod": production_resources}
INSTANCE_FILES = {
    "local": REPO_ROOT / "deploy" / "dagster.local.yaml",
    "prod": REPO_ROOT / "deploy" / "dagster.yaml",
}
"""The Dagster instance of each environment, as copied into DAGSTER_HOME (`make run`, `make dev`;
on Kubernetes the Helm chart writes the production one)."""


def instance_file(profile: str) -> Path:
    return INSTANCE_FILES[profile]


def resources_for(settings: Settings) -> dict[str, object]:
    """The resources of the settings' profile."""
    return ENVIRONMENTS[settings.profile](settings)


OWNERS = {
    "ingestion": ["team:data-platform"],
    "validation": ["team:data-platform"],
    "features": ["team:data-platform", "team:ml-platform"],
    "training": ["team:ml-platform"],
    "experiments": ["team:ml-platform"],
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
    case: UseCase, automation: AutomationSettings | None = None, settings: Settings = DEFAULTS
) -> dg.Definitions:
    """One use case's assets, checks, jobs, schedules and sensors, built from its declaration."""
    automation = automation or AutomationSettings.of(case, settings)
    assets = [
        *dimension_assets(case),
        *event_table_assets(case, settings.days_per_run),
        *feature_assets(case, settings.days_per_run),
        *training_assets(case),
        *tuning_assets(case),
        *backtest_assets(case),
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
    settings: Settings = DEFAULTS,
) -> dg.Definitions:
    """Every use case's lifecycle, wired to `resources` (tests pass their own, under a temporary
    home), in one code location. Each use case's references into its Feast repository and its
    declared source's schema are checked first (`declare.references`): a wrong one stops the
    load, naming it. The declared source's schema holds even where a drop folder replaces it:
    the drops must carry the same columns."""
    repos = feast_repositories(resources)
    for case in use_cases:
        check_repository(case, repos / case.name)
        check_source(case, case.source().table_columns())
    return dg.Definitions.merge(
        *(use_case_definitions(case, automation, settings) for case in use_cases),
        dg.Definitions(resources=resources, executor=executor(settings)),
    )


SETTINGS = Settings.from_env()
"""This deployment's settings, read once, when the code location loads."""
defs = definitions(resources_for(SETTINGS), settings=SETTINGS)
