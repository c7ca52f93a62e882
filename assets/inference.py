"""Batch inference: `batch_predictions`, the champion scoring a day's entity rows with onnxruntime.

The day's entity rows come from the use case's entities table, built before the day from what
was published ahead of it (`Prediction.entities`; without one, from the label view's source,
keys and timestamps only), their features from Feast through the FeatureService the champion
was trained on, as of the prediction instant, in chunks; each chunk is scored and appended to a
temporary Parquet file that replaces the partition's file only when every row is written. A
re-run replaces the day, a killed run leaves the previous file. The work is `ml.score`'s
(`day_entities`, `score_day`); Feast, the lake and the instance are reached through this module's
`LakeDays` and `InstanceDays` and the Feast resource.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, dagster_metadata, daily_partitions, refusing
from assets.pods import EVALUATION as EVALUATION_POD
from declare import UseCase
from ml.results import FilePath
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles, LakePath, LakeTable, ParquetLake
from resources.serving import DATA_THROUGH_TAG, ModelServing, ServedModel

if TYPE_CHECKING:
    from ml.score import ServedVersion

INFERENCE = "inference"


class BatchPredictionsConfig(dg.Config):
    chunk_rows: int = Field(
        default=50_000, description="Entity rows per feature retrieval and scoring chunk."
    )


def inference_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_batch_predictions(case)]


def _predictions_step(case: UseCase):
    return dg.asset(
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


def _batch_predictions(case: UseCase) -> dg.AssetsDefinition:
    @_predictions_step(case)
    def batch_predictions(
        context: dg.AssetExecutionContext,
        config: BatchPredictionsConfig,
        feature_store: FeastFeatureStore,
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        """The champion's prediction for each entity row of the day (the entities table's rows,
        or the label view's), with its version."""
        from ml.score import day_entities, score_day

        day, name = context.partition_key, case.registered_model
        if (champion := serving.champion(name)) is None:
            context.log.info(  # expected before the first champion
                f"batch_predictions {day}: no champion of {name} yet, nothing scored;"
                " run the `retrain` job until a model passes the gate"
            )
            return
        served, store = served_version(champion), feature_store.for_use_case(case.name)
        tables = InstanceDays(case, lake_files, context.instance)
        with refusing(f"batch_predictions {day}"):
            entities = day_entities(
                case, day, context.partition_time_window, served.feature_service, store, tables
            )
        if entities.empty:
            # A day without events (its tables published empty): nothing to score, no file.
            yield dg.MaterializeResult(
                metadata={"dagster/row_count": 0, "model": served.label, "path": "none"}
            )
            return
        path = lake_files.path_for(context.asset_key, day)
        with lake_files.local_target(path) as target:
            scores = score_day(served, entities, case.slices, store, target, config.chunk_rows)
        yield file_materialization(
            {"dagster/row_count": scores.summary.rows, **scores.metadata()}, path
        )

    return batch_predictions


def served_version(served: ServedModel) -> "ServedVersion":
    """The registered version `served`, as `ml.score` and `ml.monitor` take it."""
    from ml.score import ServedVersion

    version = served.version
    data_through = version.tags.get(DATA_THROUGH_TAG, "")
    return ServedVersion(version.name, version.version, version.sha256, data_through, served.scorer)


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


@dataclass(frozen=True)
class LakeDays:
    """A use case's lake tables by asset name, a partition at a time: how the `ml/` services
    read stored days (`ml.score.DayTables`)."""

    case: UseCase
    lake_files: LakeFiles

    def table(self, name: str, partition: str) -> LakeTable:
        return ParquetLake(root=self.lake_files.root).table(asset_key(self.case, name), partition)


@dataclass(frozen=True)
class InstanceDays(LakeDays):
    """`LakeDays` that also say which partitions the Dagster instance has materialized
    (`ml.score.EntityTables`)."""

    instance: dg.DagsterInstance

    def materialized(self, name: str, partition: str) -> bool:
        return partition in self.instance.get_materialized_partitions(asset_key(self.case, name))


def file_materialization(metadata: Mapping[str, Any], path: LakePath) -> dg.MaterializeResult:
    """The materialization of a lake file a step wrote itself: the result's `metadata` and the
    file's path, and the hash of its bytes as the data version."""
    shown = dagster_metadata({**metadata, "path": FilePath(str(path))})
    return dg.MaterializeResult(metadata=shown, data_version=dg.DataVersion(_sha256(path)))


def _sha256(path: LakePath) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as source:
        for block in iter(lambda: source.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
