"""Monitoring: `feature_drift`, how far the days up to a partition have moved from what the
champion was trained on, per feature and for its score; and `realized_performance`, how the
day's predictions did once its outcomes were published, against the predicting version's tested
figure.

The work is `ml.monitor`'s (`drift_day`; `predicted_day` and `realized_day`); each step here reads
what the resources hold (the champion and its drift reference from the registry, Feast, the
lake), writes the outcome's document to the lake and records its metadata and check. A drift or
decay event is recorded in the materialization's metadata (`ml.monitor_keys`), where the
`drift_retrain` and `decay_retrain` sensors read it.
"""

import datetime as dt
import json

import dagster as dg
from pydantic import Field

from assets import (
    EXTERNAL_RETRY,
    asset_key,
    check_result,
    daily_partitions,
    refusing,
)
from assets.config import config_class
from assets.inference import LakeDays, file_materialization, served_version
from assets.pods import EVALUATION as EVALUATION_POD
from declare import DecayPolicy, DriftSettings, UseCase
from ml.monitor_keys import DRIFT_CHECK, REALIZED_CHECK
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles, LakePath, write_text_atomically
from resources.serving import DATA_THROUGH_TAG, ModelServing

MONITORING = "monitoring"


DECLARED_ONLY = ("rule", "warn_at", "fail_at", "calendar")
"""Drift settings that are not the launchpad's: the rule sets a model's measured lines when it is
exported, and which features are calendar ones is the use case's to say."""


def drift_config(case: UseCase) -> type[dg.Config]:
    """`feature_drift`'s config for a use case: the window compared and the lines that make a
    column warn or fail (`declare.DriftSettings`, the use case's as defaults)."""
    chunk_rows = Field(default=50_000, description="Entity rows per feature retrieval.")
    return config_class(
        DriftSettings,
        f"FeatureDriftConfig_{case.name}",
        case.drift,
        skip=DECLARED_ONLY,
        extra={"chunk_rows": (int, chunk_rows)},
    )


def monitoring_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_feature_drift(case), _realized_performance(case)]


def _monitor(
    case: UseCase,
    name: str,
    deps: list[dg.AssetKey],
    kinds: set[str],
    description: str,
    check: dg.AssetCheckSpec,
):
    """The decorator of a daily monitoring asset and its check. Before the first champion, or on
    a day nobody predicted, there is nothing to measure: the step says so and records neither
    the asset nor its check (a check that ran on nothing would read as passed). Dagster makes a
    check's output optional only in a subsettable multi-asset, hence this form."""
    return dg.multi_asset(
        name=asset_key(case, name).to_python_identifier(),
        specs=[
            dg.AssetSpec(
                asset_key(case, name),
                deps=deps,
                description=description,
                group_name=case.group(MONITORING),
                kinds=kinds,
                code_version="1",
                skippable=True,
            )
        ],
        check_specs=[check],
        can_subset=True,
        partitions_def=daily_partitions(case),
        retry_policy=EXTERNAL_RETRY,
        op_tags=EVALUATION_POD,
    )


def _drift_step(case: UseCase):
    return _monitor(
        case,
        "feature_drift",
        # The window it measures ends with the day's rows: in the day's run it comes after the
        # day's features are published (the online store, written after every feature table);
        # in a run of a range, where those steps are skipped, it is skipped with them.
        deps=[asset_key(case, "batch_predictions"), asset_key(case, "online_features")],
        kinds={"pandas", "onnx", "feast"},
        description=(
            "PSI and Kolmogorov-Smirnov of the window's features and champion scores vs its"
            " training reference; a table and a plot in metadata."
        ),
        check=dg.AssetCheckSpec(
            DRIFT_CHECK,
            asset=asset_key(case, "feature_drift"),
            description=(
                "Warns when features drift past their thresholds; fails when the champion's"
                " score drifts (a drift event: the drift_retrain sensor requests a retrain)."
            ),
        ),
    )


def _feature_drift(case: UseCase) -> dg.AssetsDefinition:
    config_type = drift_config(case)

    @_drift_step(case)
    def feature_drift(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        feature_store: FeastFeatureStore,
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        from ml.monitor import drift_day, drift_settings

        day, name = context.partition_key, case.registered_model
        with refusing("feature_drift"):
            settings = drift_settings(case.drift, config.model_dump(exclude={"chunk_rows"}))
        if (champion := serving.champion(name)) is None:
            context.log.info(f"feature_drift {day}: no champion of {name} yet; skipped")
            return
        natural = settings.lines == "natural"
        drift = drift_day(
            case, day, context.partition_time_window, served_version(champion),
            reference=serving.drift_reference(champion.version),
            measured=serving.drift_lines(champion.version) if natural else None,
            store=feature_store.for_use_case(case.name),
            settings=settings,
            chunk_rows=config.chunk_rows,
        )  # fmt: skip
        for warning in drift.warnings:
            context.log.warning(f"feature_drift {day}: {warning}")
        path = _kept(lake_files, context.asset_key, day, drift.to_document())
        for outcome in drift.checks():
            yield check_result(outcome)
        yield file_materialization(drift.metadata(), path)

    return feature_drift


def _kept(lake_files: LakeFiles, key: dg.AssetKey, partition: str, document: dict) -> LakePath:
    """Where the partition's `document` is written, as JSON beside the lake's tables."""
    path = lake_files.path_for(key, partition).with_suffix(".json")
    write_text_atomically(json.dumps(document, indent=2), path, lake_files.file_mode)
    return path


def realized_config(case: UseCase) -> type[dg.Config]:
    """`realized_performance`'s config for a use case: its declared `declare.DecayPolicy`."""
    return config_class(
        DecayPolicy, f"RealizedPerformanceConfig_{case.name}", case.realized, skip=("metric",)
    )


def _realized_step(case: UseCase):
    return _monitor(
        case,
        "realized_performance",
        deps=[asset_key(case, "batch_predictions"), asset_key(case, case.label.table)],
        kinds={"pandas"},
        description=(
            "The day's predictions joined with what happened, once its outcomes are published:"
            " the task's metrics for the day and its trailing window, with bootstrap intervals,"
            " against the test figures of the model version that made the predictions."
        ),
        check=dg.AssetCheckSpec(
            REALIZED_CHECK,
            asset=asset_key(case, "realized_performance"),
            description=(
                "Warns when the trailing window's realized performance is worse than the"
                " model's test figure beyond its bootstrap interval; fails when worse by more"
                " than the configured drop (a decay event)."
            ),
        ),
    )


def _realized_performance(case: UseCase) -> dg.AssetsDefinition:
    config_type = realized_config(case)

    @_realized_step(case)
    def realized_performance(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        from ml.monitor import decay_policy, predicted_day, realized_day

        day, tables = dt.date.fromisoformat(context.partition_key), LakeDays(case, lake_files)
        with refusing(f"realized_performance {day}"):
            predicted = predicted_day(tables, case.label, day)
        if predicted is None:
            context.log.info(f"realized_performance {day}: no predictions of that day; skipped")
            return
        model = serving.registry.version(case.registered_model, predicted.version)
        tested = serving.test_metrics(model)
        with refusing("realized_performance config"):
            policy = decay_policy(case.realized, config.model_dump())
        with refusing(f"realized_performance {day}"):
            realized = realized_day(
                case, predicted, tables,
                tested=tested,
                data_through=model.tags.get(DATA_THROUGH_TAG, ""),
                policy=policy,
                history=_history(lake_files, context.asset_key, day),
            )  # fmt: skip
        path = _kept(lake_files, context.asset_key, day.isoformat(), realized.to_document())
        for outcome in realized.checks():
            yield check_result(outcome)
        yield file_materialization(realized.metadata(), path)

    return realized_performance


HISTORY_DAYS = 28
"""Days of realized figures the plot over time shows, up to the partition's."""


def _history(lake_files: LakeFiles, key: dg.AssetKey, day: dt.date) -> list[dict]:
    """The realized documents of the `HISTORY_DAYS` - 1 days before `day` that were measured,
    in order: each day's figure and its window's, for the plot over time."""
    found = []
    for n in range(HISTORY_DAYS - 1, 0, -1):
        path = lake_files.path_for(key, (day - dt.timedelta(days=n)).isoformat())
        path = path.with_suffix(".json")
        if path.exists():
            found.append(json.loads(path.read_text()))
    return found
