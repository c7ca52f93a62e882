"""Batch inference: `batch_predictions`, the champion scoring a day's entity rows with onnxruntime.

The day's entity rows come from the use case's entities table, built before the day from what
was published ahead of it (`Prediction.entities`; without one, from the label view's source,
keys and timestamps only), their features from Feast through the FeatureService the champion
was trained on, as of the prediction instant, in chunks; each chunk is scored and appended to a
temporary Parquet file that replaces the partition's file only when every row is written. A
re-run replaces the day, a killed run leaves the previous file. The logic is in `ml/predict.py`.
"""

import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, daily_partitions
from assets.pods import EVALUATION as EVALUATION_POD
from declare import UseCase
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles, ParquetLake
from resources.serving import ModelServing

if TYPE_CHECKING:
    import pandas as pd

INFERENCE = "inference"


class BatchPredictionsConfig(dg.Config):
    chunk_rows: int = Field(
        default=50_000, description="Entity rows per feature retrieval and scoring chunk."
    )


def inference_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_batch_predictions(case)]


def _batch_predictions(case: UseCase) -> dg.AssetsDefinition:
    model_name = case.registered_model

    @dg.asset(
        key=asset_key(case, "batch_predictions"),
        partitions_def=daily_partitions(case),
        deps=[asset_key(case, "registered_model"), *_feature_deps(case)],
        group_name=case.group(INFERENCE),
        kinds={"onnx", "parquet", "feast"},
        code_version="1",
        # Before the first champion there is nothing to score with: the nightly job still ingests
        # and publishes the day, and this step says why it made nothing (downstream is skipped).
        output_required=False,
        retry_policy=EXTERNAL_RETRY,
        op_tags=EVALUATION_POD,
    )
    def batch_predictions(
        context: dg.AssetExecutionContext,
        config: BatchPredictionsConfig,
        feature_store: FeastFeatureStore,
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        """The champion's prediction for each entity row of the day (the entities table's rows,
        or the label view's), with its version."""
        from ml.dataset import as_predicted
        from ml.predict import score_to_parquet

        served = serving.champion(model_name)
        if served is None:
            context.log.info(  # expected before the first champion
                f"batch_predictions {context.partition_key}: no champion of {model_name} yet,"
                " nothing scored; run the `retrain` job until a model passes the gate"
            )
            return
        properties = served.scorer.properties
        binary, output = served.scorer.task.name == "binary", served.scorer.task.output
        service = properties["feature_service"]
        feature_store = feature_store.for_use_case(case.name)
        keys = [*feature_store.join_keys(service), "event_timestamp"]
        rows = _entity_rows(context, case, feature_store, lake_files, keys)
        # Predicted at the day's start, from what was known then (as the model was trained).
        entities = (
            as_predicted(rows[keys], case.prediction.at, case.timezone)
            .sort_values(keys)
            .reset_index(drop=True)
        )
        if entities.empty:
            # A day without events (its tables published empty): nothing to score, no file.
            yield dg.MaterializeResult(
                metadata={"dagster/row_count": 0, "model": served.label, "path": "none"}
            )
            return
        # The declared slices' columns ride along, for realized performance to cut by.
        served_columns = set(feature_store.feature_columns(service))
        slices = [s.column for s in case.slices if s.column in served_columns]
        path = lake_files.path_for(context.asset_key, context.partition_key)
        with lake_files.local_target(path) as target:
            summary = score_to_parquet(
                served.scorer,
                feature_chunks(feature_store, entities, service, config.chunk_rows),
                target,
                keep=[*keys, *dict.fromkeys(slices)],
                constants={
                    "model_name": served.version.name,
                    "model_version": served.version.version,
                    "predicted_at": dt.datetime.now(dt.UTC),
                },
                threshold=float(properties["threshold"]) if binary else None,
            )
        yield dg.MaterializeResult(
            metadata={
                "dagster/row_count": summary.rows,
                "model": served.label,
                "model_sha256": served.version.sha256,
                "feature_service": service,
                "rows_with_missing_features": summary.incomplete_rows,
                "missing_features_treatment": (
                    "scored as trained: a missing number is its training mean plus a missing flag,"
                    " a missing or unseen category the reserved unknown index"
                ),
                "missing_by_feature": dg.MetadataValue.json(summary.missing_by_feature),
                **({"predicted_positive": summary.positive_predictions} if binary else {}),
                f"mean_{output}": summary.mean,
                f"{output}_quantiles": dg.MetadataValue.json(summary.quantiles),
                f"{output}_histogram": dg.MetadataValue.md(
                    _histogram(output, summary.histogram, summary.histogram_edges)
                ),
                "rows_per_s": summary.rows_per_s,
                "path": dg.MetadataValue.path(str(path)),
            },
            data_version=dg.DataVersion(_sha256(path)),
        )

    return batch_predictions


def _feature_deps(case: UseCase) -> list[dg.AssetDep]:
    """The feature tables a day's predictions read. Predicted before the day: the day's rows of
    the tables built ahead of it, and of the others (observations, the label) the day before,
    whose last rows are what was known at the day's start."""
    if not case.predicts_ahead:
        return [dg.AssetDep(asset_key(case, spec.name)) for spec in case.feature_tables]
    ahead = set(case.ahead_feature_tables)
    day_before = dg.TimeWindowPartitionMapping(
        start_offset=-1, end_offset=-1, allow_nonexistent_upstream_partitions=True
    )
    return [
        dg.AssetDep(asset_key(case, spec.name))
        if spec.name in ahead
        else dg.AssetDep(asset_key(case, spec.name), partition_mapping=day_before)
        for spec in case.feature_tables
        if spec.name != case.label.table
    ]


def _entity_rows(
    context: dg.AssetExecutionContext,
    case: UseCase,
    feature_store: FeastFeatureStore,
    lake_files: LakeFiles,
    keys: list[str],
) -> "pd.DataFrame":
    """The day's entity rows, with `keys`: the rows of the declared entities table (built
    before the day), or else the label view's rows (the day's events, once published)."""
    import pandas as pd

    partition = context.partition_key
    table = case.prediction.entities
    if table is None:
        window = context.partition_time_window
        rows = feature_store.view_rows(
            case.label.view, window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)
        )
        if rows.empty:
            labels = context.instance.get_materialized_partitions(asset_key(case, case.label.table))
            if partition not in labels:
                raise dg.Failure(
                    f"batch_predictions {partition}: {case.label.view!r} has no rows that day;"
                    " materialize the day's feature tables first",
                    allow_retries=False,
                )
        return rows
    try:
        stored = ParquetLake(root=lake_files.root).table(asset_key(case, table), partition)
    except FileNotFoundError as error:
        raise dg.Failure(
            f"batch_predictions {partition}: the entities to predict are the rows of {table},"
            f" whose day is not built: {error}; materialize it first (`predict_day`)",
            allow_retries=False,
        ) from None
    missing = [key for key in keys if key not in stored.columns]
    if missing:
        raise dg.Failure(
            f"batch_predictions {partition}: {table} lacks the columns {missing} the feature"
            " service joins on; its rows cannot be the entities to predict",
            allow_retries=False,
        )
    return pd.concat(list(stored.frames(columns=keys)), ignore_index=True)


def feature_chunks(
    store: FeastFeatureStore, entities: "pd.DataFrame", service: str, chunk_rows: int
) -> Iterator["pd.DataFrame"]:
    """The service's features for the entity rows, one chunk at a time (bounded memory)."""
    for start in range(0, len(entities), chunk_rows):
        yield store.historical_features(entities.iloc[start : start + chunk_rows], service)


def _histogram(output: str, counts: list[int], edges: list[float]) -> str:
    """Counts of the scores in the summary's bins, as a Markdown bar table."""
    peak = max(counts, default=0) or 1
    rows = [
        f"| {low:.3g}-{high:.3g} | {n} | {'█' * round(20 * n / peak)} |"
        for low, high, n in zip(edges, edges[1:], counts, strict=False)
    ]
    return f"| {output} | rows | |\n|---|---|---|\n" + "\n".join(rows)


def _sha256(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
