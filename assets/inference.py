"""Batch inference: `batch_predictions`, the champion scoring a day's flights with onnxruntime.

The day's entity rows come from the label view's source (keys and timestamps only, never the
outcome), their features from Feast through the FeatureService the champion was trained on, in
chunks; each chunk is scored and appended to a temporary Parquet file that replaces the
partition's file only when every row is written. A re-run replaces the day, a killed run leaves
the previous file. The logic is in `ml/predict.py`.
"""

import datetime as dt
from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY
from assets.deployment import registered_model
from assets.evaluation import REGISTERED_MODEL
from assets.features import FEATURE_TABLES
from assets.pods import EVALUATION as EVALUATION_POD
from pipelines.partitions import daily_partitions
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles
from resources.serving import ModelServing

if TYPE_CHECKING:
    import pandas as pd

INFERENCE = "inference"


class BatchPredictionsConfig(dg.Config):
    entity_view: str = Field(
        default="flight_outcome",
        description="Feature view whose source rows (keys and timestamps only) are scored.",
    )
    chunk_rows: int = Field(
        default=50_000, description="Entity rows per feature retrieval and scoring chunk."
    )


@dg.asset(
    partitions_def=daily_partitions,
    deps=[registered_model, *FEATURE_TABLES],
    group_name=INFERENCE,
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
    """P(arrival delayed) for each flight of the day, by the champion, with its version."""
    from ml.predict import score_to_parquet

    served = serving.champion(REGISTERED_MODEL)
    if served is None:
        context.log.info(  # expected before the first champion
            f"batch_predictions {context.partition_key}: no champion of {REGISTERED_MODEL} yet,"
            " nothing scored; run the `retrain` job until a model passes the gate"
        )
        return
    properties = served.scorer.properties
    service = properties["feature_service"]
    window = context.partition_time_window
    rows = feature_store.view_rows(
        config.entity_view, window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)
    )
    keys = [*feature_store.join_keys(service), "event_timestamp"]
    entities = rows[keys].sort_values(keys).reset_index(drop=True)
    if entities.empty:
        raise dg.Failure(
            f"batch_predictions {context.partition_key}: {config.entity_view!r} has no rows that"
            " day; materialize the day's feature tables first",
            allow_retries=False,
        )
    path = lake_files.path_for(context.asset_key, context.partition_key)
    with lake_files.local_target(path) as target:
        summary = score_to_parquet(
            served.scorer,
            feature_chunks(feature_store, entities, service, config.chunk_rows),
            target,
            keep=keys,
            constants={
                "model_name": served.version.name,
                "model_version": served.version.version,
                "predicted_at": dt.datetime.now(dt.UTC),
            },
            threshold=float(properties["threshold"]),
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
            "predicted_delayed": summary.positive_predictions,
            "mean_probability": summary.mean_probability,
            "probability_quantiles": dg.MetadataValue.json(summary.quantiles),
            "probability_histogram": dg.MetadataValue.md(_histogram(summary.histogram)),
            "rows_per_s": summary.rows_per_s,
            "path": dg.MetadataValue.path(str(path)),
        },
        data_version=dg.DataVersion(_sha256(path)),
    )


def feature_chunks(
    store: FeastFeatureStore, entities: "pd.DataFrame", service: str, chunk_rows: int
) -> Iterator["pd.DataFrame"]:
    """The service's features for the entity rows, one chunk at a time (bounded memory)."""
    for start in range(0, len(entities), chunk_rows):
        yield store.historical_features(entities.iloc[start : start + chunk_rows], service)


def _histogram(counts: list[int]) -> str:
    """Counts of probabilities in equal-width bins of [0, 1], as a Markdown bar table."""
    width = 1 / len(counts) if counts else 1
    peak = max(counts, default=0) or 1
    rows = [
        f"| {i * width:.2f}-{(i + 1) * width:.2f} | {n} | {'█' * round(20 * n / peak)} |"
        for i, n in enumerate(counts)
    ]
    return "| probability | flights | |\n|---|---|---|\n" + "\n".join(rows)


def _sha256(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
