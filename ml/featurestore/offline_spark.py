"""A Feast offline store on Apache Spark over the lake's Parquet: Feast's Spark offline store,
reading each `FileSource` as a `SparkSource` generated from it, with a point-in-time join of
its own.

Registered in `feature_store.yaml` (or set by `resources.feature_store.Services` for
`ENGINE=spark`) as

    offline_store:
      type: ml.featurestore.offline_spark.LakeSparkOfflineStore
      root: ../.local/lake        # optional; relative FileSource paths resolve against it
      spark_conf: {spark.master: "local[2]", ...}   # the session's settings, when none is active

A use case declares its sources once, as `FileSource`s of Parquet (what the DuckDB store reads);
this store reads the same files with Spark, so moving from DuckDB to Spark changes no
declaration and no registry. Materialization reads are Feast's own Spark queries; the
point-in-time join of a pandas entity frame is this module's (`point_in_time`), with the DuckDB
store's semantics; what else this module adds is how a source becomes a Spark table, and
results in the entity frame's order:

- A source is a directory of `*.parquet` files (or one file, or a glob). A path that does not
  exist is an error naming the view and the path; a directory without Parquet files reads as an
  empty table with the view's declared schema.
- Spark refuses Parquet `TIMESTAMP(NANOS)`, which pandas writes by default. Such columns (found
  from the files' own schema) are read as integers and turned into microsecond instants, floored,
  as the DuckDB store compares them.
- A point-in-time join uploads only the entity frame's join keys, its event timestamp and its row
  number. Per view, the view's rows in the entity rows' window and the entity rows go into one
  window partitioned by the join keys and ordered by time (a view's rows before the entity rows
  of the same instant, the latest created last), and each entity row takes the last view row
  before it: one shuffle and one sort per view, where Feast's query joins every entity row to
  every view row of its key and then filters by time. Each view's result is collected in turn
  and put in the entity rows' order, so every entity row comes back once, with its own columns
  and dtypes, the feature columns beside them.
- Results reach pandas through Arrow (`DataFrame.toArrow`): instants stay UTC-aware
  (`toPandas` would make them naive in the session's zone).

Where no session is active in the process, one starts from `spark_conf` (the settings of
`resources.spark.SparkEngine`, master included: `ml.spark_session`). pyspark and feast are
imported here, so this module is imported only when Feast loads this store.
"""

import copy
import glob
import logging
import uuid
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pads
from feast import FeatureView, FileSource
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.infra.common.materialization_job import MaterializationJobStatus, MaterializationTask
from feast.infra.compute_engines.dag.context import ColumnInfo
from feast.infra.compute_engines.spark.compute import SparkComputeEngine, SparkComputeEngineConfig
from feast.infra.compute_engines.spark.feature_builder import SparkFeatureBuilder
from feast.infra.compute_engines.spark.job import SparkMaterializationJob
from feast.infra.compute_engines.spark.nodes import SparkDedupNode
from feast.infra.offline_stores.contrib.spark_offline_store.spark import (
    SparkOfflineStore,
    SparkOfflineStoreConfig,
    SparkRetrievalJob,
)
from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
from feast.infra.offline_stores.offline_store import RetrievalJob
from feast.infra.registry.base_registry import BaseRegistry
from feast.on_demand_feature_view import OnDemandFeatureView
from feast.repo_config import RepoConfig
from feast.types import from_feast_to_pyarrow_type
from feast.utils import _get_requested_feature_views_to_features_dict
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from ml.featurestore.offline_duckdb import (
    EntityOrderedJob,
    ViewPlan,
    event_timestamp_column,
    join_metadata,
    lake_root,
    planned,
    utc_micros,
)
from ml.holds import hold
from ml.spark_session import spark_session

logger = logging.getLogger(__name__)
# Feast says on every Spark call that its Spark store and sources are in alpha: once, here.
warnings.filterwarnings("ignore", r"The spark .* experimental feature", RuntimeWarning)

STORE_TYPE = "ml.featurestore.offline_spark.LakeSparkOfflineStore"
ENGINE_TYPE = "ml.featurestore.offline_spark.LakeSparkComputeEngine"
HOLD_IN_SPARK_JOIN = "ML_LIFECYCLE_HOLD_IN_SPARK_JOIN"
"""`ml.holds`: a point-in-time join holds once its entity rows are in Spark and its query is
planned, before any of its result is collected."""
ROW = "__feast_row"
"""The entity row's position, carried through Spark's join and sorted on at the end."""
TS = "__ts"
"""The instant of an entity row, or of a view's row, in a point-in-time join."""
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"
ARROW = "spark.sql.execution.arrow.pyspark.enabled"
"""pandas to Spark and back through Arrow: Feast's engine sets it on the sessions it starts."""
_GLOB_CHARACTERS = frozenset("*?[")


class LakeSparkOfflineStoreConfig(SparkOfflineStoreConfig):
    """Feast's Spark offline store settings, and where the lake's relative paths resolve."""

    type: Literal["ml.featurestore.offline_spark.LakeSparkOfflineStore"] = STORE_TYPE  # type: ignore[assignment]
    """Offline store type selector: this module's store class."""

    root: str | None = None
    """Directory that relative FileSource paths resolve against (relative: to the repo path);
    None: the repo path."""


class LakeSparkRetrievalJob(SparkRetrievalJob):
    """Feast's Spark retrieval (a pull for materialization, or a join of entity rows already in
    Spark), read through Arrow."""

    def __init__(self, job: SparkRetrievalJob):
        super().__init__(
            spark_session=job.spark_session,
            query=job.query,
            full_feature_names=job.full_feature_names,
            config=job._config,
            on_demand_feature_views=job.on_demand_feature_views,
            metadata=job.metadata,
        )

    def _to_df_internal(self, timeout: int | None = None) -> pd.DataFrame:
        return self.to_spark_df().toArrow().to_pandas()

    def _to_arrow_internal(self, timeout: int | None = None) -> pa.Table:
        return self.to_spark_df().toArrow()


class LakeSparkOfflineStore(SparkOfflineStore):
    """Feast's Spark offline store over the lake's Parquet FileSources."""

    @staticmethod
    def get_historical_features(
        config: RepoConfig,
        feature_views: list[FeatureView],
        feature_refs: list[str],
        entity_df: pd.DataFrame | str | DataFrame | None,
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        filter_by_created_timestamp: bool = False,
        **kwargs: Any,
    ) -> RetrievalJob:
        """Point-in-time correct features for each row of `entity_df`, in its order (a pandas
        frame); a Spark SQL query or DataFrame of entity rows is Feast's own retrieval."""
        spark = spark_session(_store_config(config).spark_conf)
        if not isinstance(entity_df, pd.DataFrame):
            job = SparkOfflineStore.get_historical_features(
                config,
                [_on_spark(spark, config, view) for view in feature_views],
                feature_refs,
                entity_df,
                registry,
                project,
                full_feature_names,
                filter_by_created_timestamp,
                **kwargs,
            )
            return LakeSparkRetrievalJob(job)  # type: ignore[arg-type]
        if filter_by_created_timestamp:
            raise NotImplementedError(
                "LakeSparkOfflineStore joins a pandas entity frame without"
                " filter_by_created_timestamp"
            )
        event_column = event_timestamp_column(entity_df)
        event_ts = utc_micros(entity_df[event_column])
        odfvs = OnDemandFeatureView.get_requested_odfvs(feature_refs, project, registry)
        views_to_features, _ = _get_requested_feature_views_to_features_dict(
            feature_refs, feature_views, odfvs
        )
        plans, key_aliases = planned(views_to_features, entity_df, full_feature_names)
        upload = pd.DataFrame({ROW: np.arange(len(entity_df), dtype=np.int64), TS: event_ts})
        for entity_key, alias in key_aliases.items():
            upload[alias] = entity_df[entity_key].to_numpy()
        # Stored once in Spark's block manager: every view's join reads the entity rows, and a
        # pandas frame handed over as it is stays inline in each of those plans.
        entities = spark.createDataFrame(upload).localCheckpoint()
        window = (event_ts.min(), event_ts.max())
        sources = {
            plan.alias: _read(
                spark,
                config,
                _file_source(plan.view.batch_source, plan.view.name),
                plan.view,
                plan.view.name,
            )
            for plan in plans
        }
        return SparkPointInTimeJob(
            [point_in_time(entities, sources[p.alias], p, key_aliases, window) for p in plans],
            entities=entity_df,
            feature_names=[name for plan in plans for name in plan.output_names],
            full_feature_names=full_feature_names,
            on_demand_feature_views=odfvs,
            metadata=join_metadata(feature_refs, entity_df, event_column, window),
        )

    @staticmethod
    def pull_latest_from_table_or_query(
        config: RepoConfig,
        data_source: DataSource,
        join_key_columns: list[str],
        feature_name_columns: list[str],
        timestamp_field: str,
        created_timestamp_column: str | None,
        start_date: Any,
        end_date: Any,
    ) -> RetrievalJob:
        """The latest row per entity in [start_date, end_date]: what materialization writes."""
        columns = (join_key_columns, feature_name_columns, timestamp_field)
        dates = (created_timestamp_column, start_date, end_date)
        return _pulled(
            SparkOfflineStore.pull_latest_from_table_or_query, config, data_source, *columns, *dates
        )

    @staticmethod
    def pull_all_from_table_or_query(
        config: RepoConfig,
        data_source: DataSource,
        join_key_columns: list[str],
        feature_name_columns: list[str],
        timestamp_field: str,
        created_timestamp_column: str | None = None,
        start_date: Any = None,
        end_date: Any = None,
    ) -> RetrievalJob:
        """Every row in [start_date, end_date] (both included)."""
        columns = (join_key_columns, feature_name_columns, timestamp_field)
        dates = (created_timestamp_column, start_date, end_date)
        return _pulled(
            SparkOfflineStore.pull_all_from_table_or_query, config, data_source, *columns, *dates
        )


class SparkPointInTimeJob(EntityOrderedJob):
    """A point-in-time join on Spark (`point_in_time` per view), collected on every
    `to_arrow`/`to_df`: each view's features in turn, put in the entity rows' order."""

    def __init__(self, views: list[DataFrame], **kwargs: Any):
        super().__init__(**kwargs)
        self._views = views

    def _run(self) -> pa.Table:
        hold(HOLD_IN_SPARK_JOIN)
        rows = len(self._entities) if self._entities is not None else 0
        columns: dict[str, pa.ChunkedArray] = {"__row": pa.chunked_array([np.arange(rows)])}
        for view in self._views:
            table = view.toArrow()
            if table.num_rows != rows:
                raise RuntimeError(f"a view's join gave {table.num_rows} rows for {rows}")
            table = table.sort_by(ROW)
            for name in table.column_names[1:]:
                columns[name] = table[name]
        return pa.table(columns)


def point_in_time(
    entities: DataFrame,
    source: DataFrame,
    plan: ViewPlan,
    key_aliases: dict[str, str],
    window: tuple[pd.Timestamp, pd.Timestamp],
) -> DataFrame:
    """`ROW` and `plan`'s output columns for every entity row: the values of the view's latest
    row with the same keys at or before the row's instant (within the ttl), its latest created
    among rows of one instant; nulls where there is none. `entities` holds `ROW`, `TS` and each
    join key under its alias; `source` the view's rows under their source names."""
    keys = [f"__k{i}" for i in range(len(plan.source_keys))]
    values = [f"__v{j}" for j in range(len(plan.source_features))]
    ts = F.col(f"`{plan.source_ts}`").cast("timestamp")
    created = F.col(f"`{plan.source_created}`") if plan.source_created else F.lit(None)
    rows = source.select(
        *(F.col(f"`{k}`").alias(key) for k, key in zip(plan.source_keys, keys, strict=True)),
        ts.alias(TS),
        created.cast("timestamp").alias("__c"),
        *(F.col(f"`{c}`").alias(v) for c, v in zip(plan.source_features, values, strict=True)),
    )
    bounds = [F.col(TS).isNotNull(), *(F.col(key).isNotNull() for key in keys)]
    if not pd.isna(window[1]):
        bounds.append(F.col(TS) <= F.lit(window[1].to_pydatetime()))
    if plan.ttl_us is not None and not pd.isna(window[0]):
        lower = window[0] - pd.Timedelta(microseconds=plan.ttl_us)
        bounds.append(F.col(TS) >= F.lit(lower.to_pydatetime()))
    for bound in bounds:
        rows = rows.where(bound)
    asked = entities.select(
        F.col(ROW),
        F.col(TS),
        *(
            F.col(key_aliases[entity_key]).cast(rows.schema[key].dataType).alias(key)
            for entity_key, key in zip(plan.entity_keys, keys, strict=True)
        ),
    )
    both = rows.withColumn("__e", F.lit(0)).unionByName(
        asked.withColumn("__e", F.lit(1)), allowMissingColumns=True
    )
    # At one instant a view's row comes before the entity rows it is known to, and among a view's
    # rows of one instant the latest created comes last (none created: first).
    order = Window.partitionBy(*keys).orderBy(TS, "__e", F.col("__c").asc_nulls_first())
    latest = F.last(
        F.when(F.col("__e") == 0, F.struct(F.col(TS).alias("__at"), *values)), ignorenulls=True
    ).over(order.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    joined = both.select(ROW, TS, "__e", latest.alias("__m")).where(F.col("__e") == 1)
    fresh = None
    if plan.ttl_us is not None:
        fresh = F.expr("unix_micros(__m.__at)") >= F.expr("unix_micros(" + TS + ")") - F.lit(
            plan.ttl_us
        )
    outputs = []
    for value, name in zip(values, plan.output_names, strict=True):
        picked = F.col(f"__m.{value}")
        outputs.append((picked if fresh is None else F.when(fresh, picked)).alias(name))
    return joined.select(ROW, *outputs)


def _file_source(source: DataSource | None, name: str) -> FileSource:
    """`source`, a Parquet FileSource, or a ValueError naming what it is."""
    if not isinstance(source, FileSource):
        raise ValueError(
            f"{name!r}: LakeSparkOfflineStore reads FileSources (or SparkSources), got"
            f" {type(source).__name__}"
        )
    if source.file_format is not None and not isinstance(source.file_format, ParquetFormat):
        raise ValueError(f"{name!r}: only Parquet FileSources are supported, got {source.path!r}")
    return source


def _pulled(pull: Any, config: RepoConfig, data_source: DataSource, *args: Any) -> RetrievalJob:
    """Feast's `pull` (its pull_latest or pull_all) of `data_source` read as a SparkSource."""
    spark = spark_session(_store_config(config).spark_conf)
    source = _spark_source(spark, config, data_source, None, data_source.name)
    return LakeSparkRetrievalJob(pull(config, source, *args))


def _on_spark(spark: SparkSession, config: RepoConfig, view: FeatureView) -> FeatureView:
    """`view` with its FileSource read as a SparkSource (a view reading Spark already: itself)."""
    if isinstance(view.batch_source, SparkSource):
        return view
    moved = copy.copy(view)
    moved.batch_source = _spark_source(spark, config, view.batch_source, view, view.name)
    moved.projection = view.projection
    return moved


def _spark_source(
    spark: SparkSession,
    config: RepoConfig,
    source: DataSource | None,
    view: FeatureView | None,
    name: str,
) -> SparkSource:
    """A SparkSource over a temporary view of `source`'s Parquet files."""
    if isinstance(source, SparkSource):
        return source
    source = _file_source(source, name)
    table = f"__lake_{uuid.uuid4().hex}"
    _read(spark, config, source, view, name).createOrReplaceTempView(table)
    return SparkSource(
        name=source.name,
        table=table,
        timestamp_field=source.timestamp_field,
        created_timestamp_column=source.created_timestamp_column,
        field_mapping=source.field_mapping,
    )


def _read(
    spark: SparkSession,
    config: RepoConfig,
    source: FileSource,
    view: FeatureView | None,
    name: str,
) -> DataFrame:
    """`source`'s rows as a Spark DataFrame, nanosecond instants read as microseconds."""
    resolved = FileSource.get_uri_for_file_path(
        lake_root(config, _store_config(config).root), source.path
    )
    if "://" in resolved and not resolved.startswith("file://"):
        files: list[str] = [resolved]  # an object store: Spark lists it
    elif _GLOB_CHARACTERS & set(source.path):
        files = sorted(glob.glob(resolved, recursive=True))
    elif Path(resolved).is_dir():
        files = sorted(glob.glob(str(Path(resolved) / "*.parquet")))
    elif Path(resolved).is_file():
        files = [resolved]
    else:
        raise FileNotFoundError(
            f"{name!r}: batch source path {source.path!r} does not exist (resolved to {resolved})"
        )
    if not files:
        logger.warning(
            "%r: batch source %s has no Parquet files; reading it as empty", name, resolved
        )
        return spark.createDataFrame(_declared_schema(source, view).empty_table())
    # The files' own schema (one footer) says which columns Spark must read as integers.
    nanos = [
        f.name
        for f in pads.dataset(files[0], format="parquet").schema
        if pa.types.is_timestamp(f.type) and f.type.unit == "ns"
    ]
    # Read lazily, so set for the whole session: it changes nothing but NANOS columns.
    spark.conf.set(NANOS_AS_LONG, "true")
    frame = spark.read.option("mergeSchema", "true").parquet(*files)
    for column in nanos:
        ns = F.col(f"`{column}`")
        # Floored to the microsecond, as the DuckDB store casts them (integer division rounds
        # toward zero, which is a floor only from 1970 on).
        micros = F.floor(ns / F.lit(1000)).cast("long")
        exact = F.when(ns >= 0, F.expr(f"`{column}` DIV 1000")).otherwise(micros)
        frame = frame.withColumn(column, F.timestamp_micros(exact))
    return frame


def _declared_schema(source: FileSource, view: FeatureView | None) -> pa.Schema:
    """The columns an empty source has: its timestamps, and the view's keys and features typed
    as declared."""
    utc = pa.timestamp("us", tz="UTC")
    fields = {c: utc for c in (source.timestamp_field, source.created_timestamp_column) if c}
    if view is not None:
        to_source = {v: k for k, v in source.field_mapping.items()}
        for field in [*view.entity_columns, *view.features]:
            fields[to_source.get(field.name, field.name)] = from_feast_to_pyarrow_type(field.dtype)
    return pa.schema(list(fields.items()))


def _store_config(config: RepoConfig) -> LakeSparkOfflineStoreConfig:
    store_config = config.offline_store
    if not isinstance(store_config, LakeSparkOfflineStoreConfig):
        raise ValueError(
            f"offline_store must be a LakeSparkOfflineStoreConfig, got {type(store_config)}"
        )
    return store_config


class LakeSparkComputeEngineConfig(SparkComputeEngineConfig):
    """Feast's Spark compute engine settings (`batch_engine:` in feature_store.yaml)."""

    type: Literal["ml.featurestore.offline_spark.LakeSparkComputeEngine"] = ENGINE_TYPE  # type: ignore[assignment]


class LakeSparkComputeEngine(SparkComputeEngine):
    """Feast's Spark compute engine: materialization reads the offline store on Spark, keeps the
    latest row per entity and writes the online store from Spark's Python workers. One repair:
    Feast 0.67 keeps the latest row per join key under the key's source name after the read
    has renamed it to the view's (a `field_mapping` of a join key fails with
    UNRESOLVED_COLUMN); here it goes by the renamed one."""

    def _get_feature_view_spark_session(self, feature_view: Any) -> SparkSession:
        # Feast's own start skips what `ml.spark_session` sets from the settings (the Python
        # workers' interpreter among them), and gives Spark the engine's whole entry, `type`
        # and all, for settings.
        engine = self._get_feature_view_engine_config(feature_view)
        session = spark_session(engine.get("spark_conf"))
        session.conf.set(ARROW, "true")
        return session

    def _materialize_one(
        self,
        registry: BaseRegistry,
        task: MaterializationTask,
        from_offline_store: bool = False,
        **kwargs: Any,
    ) -> SparkMaterializationJob:
        if from_offline_store:
            return super()._materialize_one(registry, task, from_offline_store, **kwargs)  # type: ignore[return-value]
        job_id = f"{task.feature_view.name}-{task.start_time}-{task.end_time}"
        context = self.get_execution_context(registry, task)
        spark = self._get_feature_view_spark_session(task.feature_view)
        try:
            _FeatureBuilder(registry=registry, spark_session=spark, task=task).build().execute(
                context
            )
        except Exception as error:  # Feast reports a view's failure in its job, as its engine does
            return SparkMaterializationJob(job_id, MaterializationJobStatus.ERROR, error=error)
        return SparkMaterializationJob(job_id, MaterializationJobStatus.SUCCEEDED)


class _FeatureBuilder(SparkFeatureBuilder):
    def build_dedup_node(self, view: Any, input_node: Any) -> Any:
        info = self.get_column_info(view)
        mapping = info.field_mapping or {}
        renamed = ColumnInfo(
            join_keys=[mapping.get(k, k) for k in info.join_keys],
            feature_cols=info.feature_cols,
            ts_col=info.ts_col,
            created_ts_col=info.created_ts_col,
            field_mapping=info.field_mapping,
        )
        node = SparkDedupNode(
            f"{view.name}:dedup", renamed, self.spark_session, inputs=[input_node]
        )
        self.nodes.append(node)
        return node
