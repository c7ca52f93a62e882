"""Monitoring: `feature_drift`, how far the days up to a partition have moved from what the
champion was trained on, per feature and for its score.

The comparison covers a trailing window of days (a single day's conditions and calendar are too
narrow to stand for a season), scored by the champion itself, against the drift reference that
was registered with it: training rows with the served file's scores. A drift event (the score
fails its thresholds) is recorded in the materialization's metadata, where the `drift_retrain`
sensor reads it. The logic is in `ml/drift.py`.
"""

import datetime as dt
import json
from typing import Any, Literal

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY
from assets.evaluation import markdown_image
from assets.inference import feature_chunks
from assets.pods import EVALUATION as EVALUATION_POD
from assets.usecase import UseCase
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles, write_text_atomically
from resources.serving import DATA_THROUGH_TAG, ModelServing

MONITORING = "monitoring"
DRIFT_CHECK = "drift_within_thresholds"
DRIFT_EVENT = "drift_event"
"""Metadata key of `feature_drift` materializations: true when the window drifted."""
CHAMPION_VERSION = "champion_version"
"""Metadata key: the model version whose reference the window was compared with."""
CHAMPION_DATA_THROUGH = "champion_data_through"
"""Metadata key: the last day of that version's training data ("" when not recorded)."""


def drift_config(case: UseCase) -> type[dg.Config]:
    """The window compared and the thresholds that make a column warn or fail, by default the
    use case's declared drift settings."""
    declared = case.drift

    class FeatureDriftConfig(dg.Config):
        window_days: int = Field(
            default=declared.window_days, ge=1, description="Days compared, ending with the day."
        )
        psi_warn: float = Field(
            default=declared.psi_warn, description="PSI from which a column warns."
        )
        psi_fail: float = Field(
            default=declared.psi_fail, description="PSI from which a column fails."
        )
        ks_warn: float = Field(
            default=declared.ks_warn, description="KS statistic from which a column warns."
        )
        ks_fail: float = Field(
            default=declared.ks_fail, description="KS statistic from which a column fails."
        )
        min_rows: int = Field(
            default=declared.min_rows,
            description="Fewer scored rows in the window: reported, never an event.",
        )
        lines: Literal["natural", "absolute"] = Field(
            default=declared.lines,
            description=(
                "natural: each column judged by how far it moved between windows of the"
                " champion's training period (never below the lines above); absolute: by the"
                " lines above."
            ),
        )
        chunk_rows: int = Field(default=50_000, description="Entity rows per feature retrieval.")

    FeatureDriftConfig.__name__ = f"FeatureDriftConfig_{case.name}"
    return FeatureDriftConfig


def monitoring_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_feature_drift(case)]


def _feature_drift(case: UseCase) -> dg.AssetsDefinition:
    model_name, entity_view = case.registered_model, case.label.view
    config_class = drift_config(case)

    @dg.asset(
        key=case.key("feature_drift"),
        partitions_def=case.partitions.definition(),
        deps=[case.key("batch_predictions")],
        output_required=False,  # nothing to compare before the first champion
        retry_policy=EXTERNAL_RETRY,
        op_tags=EVALUATION_POD,
        group_name=case.group(MONITORING),
        kinds={"pandas", "onnx", "feast"},
        code_version="1",
        check_specs=[
            dg.AssetCheckSpec(
                DRIFT_CHECK,
                asset=case.key("feature_drift"),
                description=(
                    "Warns when features drift past their thresholds; fails when the champion's"
                    " score drifts (a drift event: the drift_retrain sensor requests a retrain)."
                ),
            )
        ],
    )
    def feature_drift(
        context: dg.AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        feature_store: FeastFeatureStore,
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        """PSI and Kolmogorov-Smirnov of the window's features and champion scores vs its training
        reference; a table and a plot in metadata."""
        import pandas as pd

        from ml.drift import SCORE, DriftThresholds, compare
        from ml.plots import drift_bars

        day = context.partition_key
        served = serving.champion(model_name)
        if served is None:
            context.log.info(f"feature_drift {day}: no champion of {model_name} yet; skipped")
            return
        reference = pd.read_parquet(serving.drift_reference(served.version))
        window = context.partition_time_window
        start = window.end - dt.timedelta(days=config.window_days)
        service = served.scorer.properties["feature_service"]
        feature_store = feature_store.for_use_case(case.name)
        rows = feature_store.view_rows(
            entity_view, start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)
        )
        keys = [*feature_store.join_keys(service), "event_timestamp"]
        # Predicted at the day's start, from what was known then (as the model was trained).
        entities = (
            case.prediction.entity_rows(rows[keys], case.timezone)
            .sort_values(keys)
            .reset_index(drop=True)
        )
        frames = [
            chunk.assign(**{SCORE: served.scorer.predict(chunk)})
            for chunk in feature_chunks(feature_store, entities, service, config.chunk_rows)
        ]
        current = pd.concat(frames, ignore_index=True) if frames else reference.iloc[:0]
        thresholds = DriftThresholds(
            psi_warn=config.psi_warn,
            psi_fail=config.psi_fail,
            ks_warn=config.ks_warn,
            ks_fail=config.ks_fail,
            min_rows=config.min_rows,
        )
        measured = serving.drift_lines(served.version) if config.lines == "natural" else None
        if measured is not None:
            thresholds = thresholds.with_columns(measured.columns)
            lines = measured.describe()
        elif config.lines == "natural":
            lines = f"absolute: {served.label} was registered without measured lines"
        else:
            lines = "absolute, as configured"
        report = compare(
            reference,
            current,
            served.scorer.numeric_features,
            served.scorer.categorical_features,
            thresholds,
        )
        days_with_rows = (
            int(current["event_timestamp"].dt.tz_convert(window.start.tzinfo).dt.date.nunique())
            if len(current)
            else 0
        )
        span = f"[{start.date()}, {window.end.date()})"
        document = {
            "partition": day,
            "window": span,
            "days_with_rows": days_with_rows,
            "model": served.label,
            "lines": lines,
            **report.to_dict(),
        }
        path = lake_files.path_for(context.asset_key, day).with_suffix(".json")
        write_text_atomically(json.dumps(document, indent=2), path, lake_files.file_mode)

        level = report.level
        yield dg.AssetCheckResult(
            check_name=DRIFT_CHECK,
            passed=level == "ok",
            severity=dg.AssetCheckSeverity.ERROR if level == "fail" else dg.AssetCheckSeverity.WARN,
            description=f"{day}, window {span}: {report.summary()}",
            metadata={
                "score_psi": _number(report.score.psi if report.score else None),
                "failed_features": len(report.failed),
            },
        )
        metadata: dict[str, Any] = {
            DRIFT_EVENT: report.drift_event,
            CHAMPION_VERSION: served.version.version,
            CHAMPION_DATA_THROUGH: served.version.tags.get(DATA_THROUGH_TAG, ""),
            "level": level,
            "window": span,
            "days_with_rows": f"{days_with_rows} of {config.window_days}",
            "rows": report.current_rows,
            "reference_rows": report.reference_rows,
            "score_psi": _number(report.score.psi if report.score else None),
            "score_ks": _number(report.score.ks_statistic if report.score else None),
            "lines": lines,
            "failed_features": dg.MetadataValue.json(report.failed),
            "warned_features": dg.MetadataValue.json(report.warned),
            "drift_table": dg.MetadataValue.md(report.table()),
            "drift_plot": markdown_image(
                "PSI per column",
                drift_bars(
                    {c.name: c.psi for c in report.columns},
                    {c.name: c.level for c in report.columns},
                    thresholds.psi_warn,
                    thresholds.psi_fail,
                ),
            ),
            "path": dg.MetadataValue.path(str(path)),
        }
        yield dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(_digest(path)))

    return feature_drift


def _number(value: float | None) -> float | None:
    import math

    return round(value, 4) if value is not None and math.isfinite(value) else None


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()
