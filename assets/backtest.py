"""Backtests: `backtest`, a catalog entry trained at each of a use case's rolling origins and
measured on the month after it (`declare.backtest`, `ml.backtest`).

Partitioned by entry and fold: a fold is one run, a backfill of folds runs them one after another
locally (a training takes every core) and side by side where the launcher's pool allows. Each
fold builds its own training set through the FeatureService, trains through the configured
`TrainingLauncher` (an MLflow run of its own), and records what it measured as its
materialization, which the gate's `no_fold_regression` reads back. A fold run again with the
same entry, features and seed measures the same figures."""

import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets import asset_key, dagster_metadata, refusing
from assets.pods import TRAINING as TRAINING_POD
from assets.training import launch_training
from assets.tuning import EXPERIMENTS
from declare import UseCase
from ml.results import Link, image
from resources.feature_store import FeastFeatureStore
from resources.launchers import TrainingLauncher
from resources.mlflow_runs import DAGSTER_RUN_TAG
from resources.registry import MlflowRegistry

if TYPE_CHECKING:
    from ml.backtest import FoldResult

CONFIG, FOLD = "config", "fold"
"""The dimensions of a backtest's partitions: the catalog entry, and the tested month."""
FOLDS_PAGE = 1000

# A fold reads the feature tables' days of its month (and those before: `declare.backtest`).
warnings.filterwarnings(
    "ignore", message="Class `MultiToSingleDimensionPartitionMapping`", category=dg.BetaWarning
)


def backtest_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """Its backtest, when its partitions hold a fold (`UseCase.backtests`)."""
    return [_backtest(case)] if case.backtests else []


def backtest_partitions(case: UseCase) -> dg.MultiPartitionsDefinition:
    """Every catalog entry by every fold: the months from the first fold to the last month the
    partitions hold whole, each named by its first day."""
    first = case.backtest.first_fold(case.partitions.start)
    return dg.MultiPartitionsDefinition(
        {
            CONFIG: dg.StaticPartitionsDefinition(sorted(case.configs.names())),
            FOLD: dg.MonthlyPartitionsDefinition(
                start_date=first.isoformat(),
                end_date=case.partitions.end,
                timezone=case.timezone,
            ),
        }
    )


def _backtest(case: UseCase) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(case, "backtest"),
        partitions_def=backtest_partitions(case),
        deps=[
            asset_key(case, "feature_registry"),
            *(
                dg.AssetDep(
                    asset_key(case, table.name),
                    partition_mapping=dg.MultiToSingleDimensionPartitionMapping(FOLD),
                )
                for table in case.feature_tables
            ),
        ],
        group_name=case.group(EXPERIMENTS),
        kinds={"pytorch", "mlflow", "feast"},
        code_version="1",
        pool="training",  # a fold's training takes every core, as trained_model's does
        op_tags=TRAINING_POD,
    )
    def backtest(
        context: dg.AssetExecutionContext,
        launcher: TrainingLauncher,
        mlflow: MlflowRegistry,
        feature_store: FeastFeatureStore,
    ) -> dg.MaterializeResult:
        """The partition's catalog entry trained on the days before its fold's month and
        measured on the month: the metric with its interval, and the naive forecast's."""
        from ml import backtest, plots
        from ml.training_run import plan_settings, trained_run

        keys = context.partition_key.keys_by_dimension  # type: ignore[attr-defined]
        entry, fold = keys[CONFIG], keys[FOLD]
        window = case.backtest.split(backtest.fold_month(fold))
        output = launcher.output_dir(context)
        with refusing(f"backtest {entry} fold {fold}"):
            built = _training_set(case, feature_store, window, output)
        tracking = mlflow.for_use_case(case.name)
        plan = plan_settings(
            case, _entry(case, entry), built, output, tracking.dagster_run(context.run.run_id)
        )
        with tracking.live_run(
            run_name=f"backtest-{entry}-{fold}",
            params=plan.params(),
            tags={DAGSTER_RUN_TAG: context.run.run_id, FOLD: fold, **plan.tags()},
            description=f"Backtest fold {fold} of entry {entry}: {plan.description()}",
            source=f"Dagster asset {context.asset_key.to_user_string()}, fold {fold}",
        ) as live:
            reported = launch_training(context, launcher, plan.settings, live, tracking)
            trained = trained_run(plan, reported, live, launcher.file_mode)
        with refusing(f"backtest {entry} fold {fold}"):
            result = backtest.measure_fold(
                fold, window, Path(trained.run.folder), _read(built), case.baseline,
                case.backtest, trained.run.mlflow_run_id,
            )  # fmt: skip
        done = {(r.entry_sha256, r.fold): r for r in fold_results(context.instance, case)}
        done[(result.entry_sha256, result.fold)] = result
        drawn = plots.folds_over_time(_by_config(list(done.values())), case.baseline)
        shown = {
            **result.metadata(),
            "folds_plot": image(f"{result.metric} per fold", drawn),
            "mlflow_run": Link(trained.mlflow_link),
        }
        return dg.MaterializeResult(metadata=dagster_metadata(shown))

    return backtest


def _entry(case: UseCase, name: str) -> Any:
    from ml.catalog import entry_settings

    return entry_settings(case.configs.entry(name))


def _training_set(
    case: UseCase, feature_store: FeastFeatureStore, window: dict[str, str], output: Path
) -> Path:
    """The fold's training set, built as `training_set` builds one, in the run's folder."""
    from ml.backtest import check_parts
    from ml.dataset import LabelSpec
    from ml.training_set import assemble_training_set, time_split

    label = LabelSpec(view=case.label.view, label=case.label.column, task=case.label.task)
    store = feature_store.for_use_case(case.name)
    split = time_split(window, case.timezone)
    built = assemble_training_set(store, label, case.feature_service, split, case.prediction.at)
    check_parts(window["test_start"], window, built.summary.rows)
    output.mkdir(parents=True, exist_ok=True)
    path = output / "training_set.parquet"
    built.frame.to_parquet(path, index=False)
    return path


def _read(path: Path) -> Any:
    import pandas as pd

    return pd.read_parquet(path)


def fold_results(instance: dg.DagsterInstance, case: UseCase) -> list["FoldResult"]:
    """What every fold of every entry last measured, from the instance's record of the
    backtest's materializations (the newest of each entry's settings and fold)."""
    from ml.backtest import FOLD_DOCUMENT, FoldResult

    found: dict[tuple[str, str], FoldResult] = {}
    cursor = None
    while True:
        page = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key(case, "backtest")),
            limit=FOLDS_PAGE,
            cursor=cursor,
            ascending=False,
        )
        for record in page.records:
            materialization = record.asset_materialization
            document = materialization.metadata.get(FOLD_DOCUMENT) if materialization else None
            if document is None:
                continue
            result = FoldResult.from_document(document.value)  # type: ignore[arg-type]
            found.setdefault((result.entry_sha256, result.fold), result)
        if not page.has_more:
            break
        cursor = page.cursor
    return sorted(found.values(), key=lambda r: (r.entry, r.fold))


def _by_config(results: list["FoldResult"]) -> dict[str, list[dict[str, Any]]]:
    """Each entry's fold documents, by its `config`, in fold order."""
    by: dict[str, list[dict[str, Any]]] = {}
    for result in sorted(results, key=lambda r: r.fold):
        by.setdefault(result.config, []).append(result.document())
    return by
