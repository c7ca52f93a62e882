"""A Feast offline store that does point-in-time joins with DuckDB's native ASOF JOIN.

Registered in `feature_store.yaml` as

    offline_store:
      type: ml.featurestore.offline_duckdb.DuckDBAsofOfflineStore
      root: ../.local/lake   # optional; relative FileSource paths resolve against it, and a
                             # relative root against the repo
      threads: 4                                                  # optional

Users keep the Feast API (`get_historical_features`, `materialize`); only the engine changes.
Batch sources are `FileSource`s of Parquet: a file, a directory of `*.parquet` files, or a glob.
A path that does not exist is an error naming the view and the path; an existing directory (or
glob) with no Parquet files in it is an empty table with the view's declared schema, so the
features of that view come back null.

Point-in-time semantics, per feature view: for each entity row, the latest feature row with the
same join keys and `event_ts - ttl <= feature_ts <= event_ts` (no lower bound when the ttl is
None or zero); among feature rows with equal keys and `feature_ts`, the latest created timestamp
wins. All timestamps are compared as UTC instants at microsecond precision; naive ones are UTC.
Every entity row comes back exactly once, in the entity frame's order, with its own columns.

Materialization reads `[start_date, end_date]`, both ends inclusive, as Feast's file, DuckDB and
SQL stores do (`materialize_incremental` may thus write a boundary row twice, which is harmless).
On-demand feature views are supported the way Feast's other stores support them: the retrieval
job carries the requested ones and `RetrievalJob.to_arrow` applies them. Writing to the offline
store, `persist` and `filter_by_created_timestamp` are not supported.
"""

import glob
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlparse

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from feast import FileSource
from feast.data_format import ParquetFormat
from feast.data_source import DataSource
from feast.errors import EntityTimestampInferenceException
from feast.feature_view import DUMMY_ENTITY_ID, DUMMY_ENTITY_VAL, FeatureView
from feast.infra.offline_stores.offline_store import (
    OfflineStore,
    RetrievalJob,
    RetrievalMetadata,
)
from feast.infra.offline_stores.offline_utils import DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
from feast.infra.registry.base_registry import BaseRegistry
from feast.on_demand_feature_view import OnDemandFeatureView
from feast.repo_config import FeastConfigBaseModel, RepoConfig
from feast.saved_dataset import SavedDatasetStorage, ValidationReference
from feast.types import from_feast_to_pyarrow_type
from feast.utils import _get_requested_feature_views_to_features_dict
from pydantic import PositiveInt

logger = logging.getLogger(__name__)

STORE_TYPE = "ml.featurestore.offline_duckdb.DuckDBAsofOfflineStore"
UTC_MICROS = pa.timestamp("us", tz="UTC")
_GLOB_CHARACTERS = frozenset("*?[")


class DuckDBAsofOfflineStoreConfig(FeastConfigBaseModel):
    """Configuration of the DuckDB ASOF offline store (`offline_store:` in feature_store.yaml)."""

    type: Literal["ml.featurestore.offline_duckdb.DuckDBAsofOfflineStore"] = STORE_TYPE
    """Offline store type selector: this module's store class."""

    root: str | None = None
    """Directory that relative FileSource paths resolve against (relative: to the repo path);
    None: the repo path."""

    threads: PositiveInt | None = None
    """DuckDB worker threads per query; None: DuckDB's default (all cores)."""


@dataclass(frozen=True)
class _Query:
    """A DuckDB query and the in-memory Arrow tables it reads, registered by name."""

    sql: str
    tables: Mapping[str, pa.Table] = field(default_factory=dict)


class EntityOrderedJob(RetrievalJob):
    """A lazy retrieval whose `_run` (an engine's) gives `__row` and the feature columns in the
    entity rows' order, for a point-in-time join; the job puts them beside the entity frame's
    own columns (`entities`). Without `entities`, `_run` gives the result as it is."""

    def __init__(
        self,
        entities: pd.DataFrame | None = None,
        feature_names: Sequence[str] = (),
        full_feature_names: bool = False,
        on_demand_feature_views: list[OnDemandFeatureView] | None = None,
        metadata: RetrievalMetadata | None = None,
    ):
        self._entities = entities
        self._feature_names = list(feature_names)
        self._full_feature_names = full_feature_names
        self._on_demand_feature_views = on_demand_feature_views or []
        self._metadata = metadata

    @property
    def full_feature_names(self) -> bool:
        return self._full_feature_names

    @property
    def on_demand_feature_views(self) -> list[OnDemandFeatureView]:
        return self._on_demand_feature_views

    @property
    def metadata(self) -> RetrievalMetadata | None:
        return self._metadata

    def to_df(
        self,
        validation_reference: ValidationReference | None = None,
        timeout: int | None = None,
    ) -> pd.DataFrame:
        """The result as pandas; see `RetrievalJob.to_df`."""
        if self._entities is None or self._on_demand_feature_views or validation_reference:
            return super().to_df(validation_reference=validation_reference, timeout=timeout)
        # Feast's to_df goes through Arrow, converting the entity columns there and back; with
        # nothing to transform or validate, the features can join the entity frame directly.
        return self._to_df_internal(timeout)

    def _to_arrow_internal(self, timeout: int | None = None) -> pa.Table:
        result = self._run()
        if self._entities is None:
            return result
        out = pa.Table.from_pandas(self._entities, preserve_index=False)
        for name, column in zip(self._feature_names, result.columns[1:], strict=True):
            out = out.append_column(name, column)
        return out

    def _to_df_internal(self, timeout: int | None = None) -> pd.DataFrame:
        result = self._run()
        if self._entities is None:
            return result.to_pandas()
        features = result.drop_columns("__row").rename_columns(self._feature_names).to_pandas()
        entities = self._entities.reset_index(drop=True)  # a copy: the caller's frame stays apart
        return pd.concat([entities, features], axis=1, copy=False)

    def _run(self) -> pa.Table:
        raise NotImplementedError

    def persist(
        self,
        storage: SavedDatasetStorage,
        allow_overwrite: bool = False,
        timeout: int | None = None,
    ):
        raise NotImplementedError(
            "this offline store does not persist saved datasets; write `job.to_arrow()` to"
            " Parquet instead."
        )


class DuckDBAsofRetrievalJob(EntityOrderedJob):
    """A lazy retrieval: the query runs in a fresh in-memory DuckDB on every `to_arrow`/`to_df`
    (for a point-in-time join: `__row` and the feature columns in entity order)."""

    def __init__(
        self,
        query: _Query,
        config: DuckDBAsofOfflineStoreConfig,
        entities: pd.DataFrame | None = None,
        feature_names: Sequence[str] = (),
        full_feature_names: bool = False,
        on_demand_feature_views: list[OnDemandFeatureView] | None = None,
        metadata: RetrievalMetadata | None = None,
    ):
        super().__init__(
            entities, feature_names, full_feature_names, on_demand_feature_views, metadata
        )
        self._query = query
        self._config = config

    def to_sql(self) -> str:
        return self._query.sql

    def _run(self) -> pa.Table:
        with _connect(self._config) as con:
            for name, table in self._query.tables.items():
                con.register(name, table)
            logger.debug("DuckDB query:\n%s", self._query.sql)
            return con.sql(self._query.sql).to_arrow_table()


class DuckDBAsofOfflineStore(OfflineStore):
    """Feast offline store over Parquet FileSources with DuckDB ASOF JOINs."""

    @staticmethod
    def get_historical_features(
        config: RepoConfig,
        feature_views: list[FeatureView],
        feature_refs: list[str],
        entity_df: pd.DataFrame | str | None,
        registry: BaseRegistry,
        project: str,
        full_feature_names: bool = False,
        **kwargs: Any,
    ) -> RetrievalJob:
        """Point-in-time correct features for each row of `entity_df`, in its order."""
        store_config = _store_config(config)
        if kwargs.get("filter_by_created_timestamp"):
            raise NotImplementedError(
                "DuckDBAsofOfflineStore does not support filter_by_created_timestamp"
            )
        entities = _entity_frame(entity_df, store_config, config)
        event_column = event_timestamp_column(entities)
        event_ts = utc_micros(entities[event_column])
        odfvs = OnDemandFeatureView.get_requested_odfvs(feature_refs, project, registry)
        views_to_features, _ = _get_requested_feature_views_to_features_dict(
            feature_refs, feature_views, odfvs
        )

        entity_columns = {
            "__row": pa.array(np.arange(len(entities), dtype=np.int64)),
            "__ts": pa.Array.from_pandas(event_ts),
        }
        plans, key_aliases = planned(views_to_features, entities, full_feature_names)
        for entity_key, alias in key_aliases.items():
            entity_columns[alias] = pa.Array.from_pandas(entities[entity_key])
        tables: dict[str, pa.Table] = {}
        ctes, joins, selects = [], [], []
        window = (event_ts.min(), event_ts.max())
        for plan in plans:
            view = plan.view
            scan = _scan(config, view.batch_source, plan.declared_schema(), view.name)
            tables.update(scan.tables)
            ctes.append(f"{_q(plan.alias)} AS (\n{plan.feature_sql(scan.sql, window)}\n)")
            joins.append(plan.join_sql([key_aliases[k] for k in plan.entity_keys]))
            selects.extend(plan.output_sql())
        output_names = [name for plan in plans for name in plan.output_names]
        tables["__entity"] = pa.table(entity_columns)
        with_clause = "WITH " + ",\n".join(ctes) + "\n" if ctes else ""
        sql = (
            with_clause
            + f"SELECT {', '.join(['e.__row', *selects])}\nFROM __entity AS e\n"
            + "".join(f"{join}\n" for join in joins)
            + "ORDER BY e.__row"
        )

        return DuckDBAsofRetrievalJob(
            _Query(sql, tables),
            store_config,
            entities=entities,
            feature_names=output_names,
            full_feature_names=full_feature_names,
            on_demand_feature_views=odfvs,
            metadata=join_metadata(feature_refs, entities, event_column, window),
        )

    @staticmethod
    def pull_latest_from_table_or_query(
        config: RepoConfig,
        data_source: DataSource,
        join_key_columns: list[str],
        feature_name_columns: list[str],
        timestamp_field: str,
        created_timestamp_column: str | None,
        start_date: datetime,
        end_date: datetime,
    ) -> RetrievalJob:
        """The latest row per join key with its timestamp in [start_date, end_date]."""
        order = [f"CAST({_q(timestamp_field)} AS TIMESTAMPTZ) DESC"]
        if created_timestamp_column:
            order.append(f"CAST({_q(created_timestamp_column)} AS TIMESTAMPTZ) DESC NULLS LAST")
        partition = f"PARTITION BY {', '.join(map(_q, join_key_columns))} " * bool(join_key_columns)
        latest = f"QUALIFY row_number() OVER ({partition}ORDER BY {', '.join(order)}) = 1"
        return _pull(
            config,
            data_source,
            join_key_columns,
            feature_name_columns,
            timestamp_field,
            created_timestamp_column,
            (start_date, end_date),
            latest,
        )

    @staticmethod
    def pull_all_from_table_or_query(
        config: RepoConfig,
        data_source: DataSource,
        join_key_columns: list[str],
        feature_name_columns: list[str],
        timestamp_field: str,
        created_timestamp_column: str | None = None,
        start_date: datetime | None = None,
        end_date: datetime | None = None,
    ) -> RetrievalJob:
        """Every row with its timestamp in [start_date, end_date] (an absent end is open)."""
        return _pull(
            config,
            data_source,
            join_key_columns,
            feature_name_columns,
            timestamp_field,
            created_timestamp_column,
            (start_date, end_date),
            "",
        )

    @staticmethod
    def offline_write_batch(
        config: RepoConfig,
        feature_view: FeatureView,
        table: pa.Table,
        progress: Callable[[int], Any] | None,
    ):
        raise NotImplementedError(
            "DuckDBAsofOfflineStore is read-only: write new Parquet files into the batch "
            f"source of {feature_view.name!r} instead of pushing to the offline store."
        )

    def get_table_column_names_and_types_from_data_source(
        self, config: RepoConfig, data_source: DataSource
    ) -> Iterable[tuple[str, str]]:
        """Column names and Arrow type names of a source, resolved as retrieval resolves it."""
        scan = _scan(config, data_source, None, data_source.name)
        with _connect(_store_config(config)) as con:
            schema = con.sql(f"SELECT * FROM {scan.sql} LIMIT 0").to_arrow_table().schema
        return [(f.name, str(f.type)) for f in schema]


def planned(
    views_to_features: Mapping[FeatureView, list[str]],
    entities: pd.DataFrame,
    full_feature_names: bool,
) -> tuple[list["ViewPlan"], dict[str, str]]:
    """Each view's plan, and an alias (`__e<i>`) per entity column a view joins on; refuses a
    join key the entity frame lacks and feature columns that collide with each other or with
    the entity frame's."""
    plans, key_aliases = [], {}
    for i, (view, features) in enumerate(views_to_features.items()):
        plan = ViewPlan.of(view, features, full_feature_names, alias=f"__f{i}")
        for entity_key in plan.entity_keys:
            if entity_key not in entities.columns:
                raise ValueError(
                    f"Feature view {view.name!r} joins on {entity_key!r}, "
                    f"which the entity dataframe lacks (columns: {list(entities.columns)})"
                )
            key_aliases.setdefault(entity_key, f"__e{len(key_aliases)}")
        plans.append(plan)
    output_names = [name for plan in plans for name in plan.output_names]
    clash = sorted(set(output_names) & set(map(str, entities.columns)))
    if clash or len(set(output_names)) != len(output_names):
        raise ValueError(
            f"Feature columns {clash or output_names} collide with each other or with "
            "entity dataframe columns; rename them or use full_feature_names=True"
        )
    return plans, key_aliases


@dataclass(frozen=True)
class ViewPlan:
    """The SQL pieces of one feature view's ASOF JOIN, with source column names resolved."""

    alias: str
    view: FeatureView
    source_keys: list[str]
    entity_keys: list[str]
    source_ts: str
    source_created: str | None
    source_features: list[str]
    output_names: list[str]
    ttl_us: int | None

    @classmethod
    def of(
        cls, view: FeatureView, features: list[str], full_feature_names: bool, alias: str
    ) -> "ViewPlan":
        source = view.batch_source
        if source is None:
            raise ValueError(f"Feature view {view.name!r} has no batch source")
        # field_mapping maps source column -> feature name; queries need the source names.
        to_source = {v: k for k, v in source.field_mapping.items()}
        columns = [c for c in view.entity_columns if c.name != DUMMY_ENTITY_ID]
        prefix = view.projection.name_to_use()
        ttl = view.ttl if view.ttl and view.ttl > timedelta(0) else None
        created = source.created_timestamp_column
        return cls(
            alias=alias,
            view=view,
            source_keys=[to_source.get(c.name, c.name) for c in columns],
            entity_keys=[view.projection.join_key_map.get(c.name, c.name) for c in columns],
            source_ts=to_source.get(source.timestamp_field, source.timestamp_field),
            source_created=to_source.get(created, created) if created else None,
            source_features=[to_source.get(f, f) for f in features],
            output_names=[f"{prefix}__{f}" if full_feature_names else f for f in features],
            ttl_us=ttl // timedelta(microseconds=1) if ttl else None,
        )

    def declared_schema(self) -> pa.Schema:
        """The source columns this plan reads, typed as the view declares them."""
        declared = {f.name: f.dtype for f in [*self.view.entity_columns, *self.view.features]}
        to_feature = self.view.batch_source.field_mapping if self.view.batch_source else {}
        fields = {c: UTC_MICROS for c in [self.source_ts, self.source_created] if c}
        for column in [*self.source_keys, *self.source_features]:
            dtype = declared.get(to_feature.get(column, column))
            fields[column] = from_feast_to_pyarrow_type(dtype) if dtype else pa.null()
        return pa.schema(list(fields.items()))

    def feature_sql(self, scan: str, window: tuple[pd.Timestamp, pd.Timestamp]) -> str:
        """The view's rows as `__k<i>, __ts, __v<j>`, one per (keys, ts), limited to the window."""
        ts = f"CAST({_q(self.source_ts)} AS TIMESTAMPTZ)"
        selects = [f"{_q(k)} AS __k{i}" for i, k in enumerate(self.source_keys)]
        selects.append(f"{ts} AS __ts")
        selects += [f"{_q(c)} AS __v{j}" for j, c in enumerate(self.source_features)]
        # Literal bounds let DuckDB skip Parquet row groups outside the entity rows' window.
        where = [f"{ts} IS NOT NULL"]
        if not pd.isna(window[1]):
            where.append(f"{ts} <= {_ts_literal(window[1])}")
        if self.ttl_us is not None and not pd.isna(window[0]):
            lower = window[0] - pd.Timedelta(microseconds=self.ttl_us)
            where.append(f"{ts} >= {_ts_literal(lower)}")
        sql = f"  SELECT {', '.join(selects)}\n  FROM {scan}\n  WHERE {' AND '.join(where)}"
        if self.source_created:
            # ASOF picks an arbitrary row among equal timestamps: keep the latest created first.
            keys = ", ".join([*map(_q, self.source_keys), ts])
            created = f"CAST({_q(self.source_created)} AS TIMESTAMPTZ)"
            sql += (
                f"\n  QUALIFY row_number() OVER "
                f"(PARTITION BY {keys} ORDER BY {created} DESC NULLS LAST) = 1"
            )
        return sql

    def join_sql(self, entity_aliases: Sequence[str]) -> str:
        on = [f"e.{_q(a)} = {_q(self.alias)}.__k{i}" for i, a in enumerate(entity_aliases)]
        on.append(f"e.__ts >= {_q(self.alias)}.__ts")
        return f"ASOF LEFT JOIN {_q(self.alias)} ON {' AND '.join(on)}"

    def output_sql(self) -> list[str]:
        values = [f"{_q(self.alias)}.__v{j}" for j in range(len(self.source_features))]
        if self.ttl_us is None:
            return values
        # ASOF found the latest row at or before the event; past the ttl there is none in range.
        fresh = f"{_q(self.alias)}.__ts >= e.__ts - to_microseconds({self.ttl_us})"
        return [f"CASE WHEN {fresh} THEN {v} END" for v in values]


@dataclass(frozen=True)
class _Scan:
    """A FROM item reading one source, and the empty table it names when there are no files."""

    sql: str
    tables: Mapping[str, pa.Table]


def _pull(
    config: RepoConfig,
    data_source: DataSource,
    join_key_columns: list[str],
    feature_name_columns: list[str],
    timestamp_field: str,
    created_timestamp_column: str | None,
    dates: tuple[datetime | None, datetime | None],
    qualify: str,
) -> RetrievalJob:
    """The rows of a source within `dates` (inclusive), as the materialization engine reads them."""
    store_config = _store_config(config)
    timestamps = [c for c in (timestamp_field, created_timestamp_column) if c]
    columns = list(dict.fromkeys([*join_key_columns, *feature_name_columns, *timestamps]))
    schema = pa.schema([(c, UTC_MICROS if c in timestamps else pa.null()) for c in columns])
    scan = _scan(config, data_source, schema, data_source.name)
    # No feature columns means "every column": transformations read raw source columns.
    selects = list(map(_q, columns)) if feature_name_columns else ["*"]
    if not join_key_columns:
        selects.append(f"{_sql_string(DUMMY_ENTITY_VAL)} AS {_q(DUMMY_ENTITY_ID)}")
    ts = f"CAST({_q(timestamp_field)} AS TIMESTAMPTZ)"
    where = [f"{ts} IS NOT NULL"]
    if dates[0] is not None:
        where.append(f"{ts} >= {_ts_literal(dates[0])}")
    if dates[1] is not None:
        where.append(f"{ts} <= {_ts_literal(dates[1])}")
    sql = f"SELECT {', '.join(selects)}\nFROM {scan.sql}\nWHERE {' AND '.join(where)}\n{qualify}"
    return DuckDBAsofRetrievalJob(_Query(sql.rstrip(), scan.tables), store_config)


def _scan(
    config: RepoConfig, source: DataSource | None, empty_schema: pa.Schema | None, name: str
) -> _Scan:
    """How to read `source`: a Parquet scan, or an empty typed table when it has no files."""
    if not isinstance(source, FileSource):
        raise ValueError(
            f"{name!r}: DuckDBAsofOfflineStore reads FileSources only, got {type(source).__name__}"
        )
    if source.file_format is not None and not isinstance(source.file_format, ParquetFormat):
        raise ValueError(f"{name!r}: only Parquet FileSources are supported, got {source.path!r}")
    if urlparse(source.path).netloc:  # a remote URI: DuckDB lists and reads it (httpfs)
        return _Scan(_read_parquet(source.path, many=True), {})
    resolved = FileSource.get_uri_for_file_path(_root(config), source.path)
    if _GLOB_CHARACTERS & set(source.path):
        files, many = glob.glob(resolved, recursive=True), True
        pattern = resolved
    elif Path(resolved).is_dir():
        pattern = str(Path(resolved) / "*.parquet")
        files, many = glob.glob(pattern), True
    elif Path(resolved).is_file():
        return _Scan(_read_parquet(resolved, many=False), {})
    else:
        raise FileNotFoundError(
            f"{name!r}: batch source path {source.path!r} does not exist (resolved to {resolved})"
        )
    if files:
        return _Scan(_read_parquet(pattern, many=many), {})
    if empty_schema is None:
        raise ValueError(f"{name!r}: batch source {resolved!r} has no Parquet files")
    logger.warning("%r: batch source %s has no Parquet files; reading it as empty", name, resolved)
    table = f"__empty_{uuid.uuid4().hex}"
    return _Scan(_q(table), {table: empty_schema.empty_table()})


def _read_parquet(path: str, many: bool) -> str:
    # union_by_name: files written over time may add columns; a missing one reads as null.
    return f"read_parquet({_sql_string(path)}{', union_by_name = true' if many else ''})"


def _connect(config: DuckDBAsofOfflineStoreConfig) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect(":memory:")
    # Naive timestamps are UTC: casts to TIMESTAMPTZ read them in the session zone.
    con.execute("SET TimeZone = 'UTC'")
    if config.threads is not None:
        con.execute(f"SET threads = {int(config.threads)}")
    return con


def _root(config: RepoConfig) -> str | None:
    return lake_root(config, _store_config(config).root)


def lake_root(config: RepoConfig, root: str | None) -> str | None:
    """The absolute folder relative FileSource paths resolve against: a store's `root`, itself
    relative to the repo as Feast's own relative paths are (so the CLI works from any
    directory), or the repo path."""
    repo = Path(config.repo_path) if config.repo_path is not None else None
    if root is None:
        return str(repo) if repo is not None else None
    folder = Path(root)
    if not folder.is_absolute() and repo is not None:
        folder = repo / folder
    return str(folder.resolve())


def _store_config(config: RepoConfig) -> DuckDBAsofOfflineStoreConfig:
    store_config = config.offline_store
    if not isinstance(store_config, DuckDBAsofOfflineStoreConfig):
        raise ValueError(
            f"offline_store must be a DuckDBAsofOfflineStoreConfig, got {type(store_config)}"
        )
    return store_config


def _entity_frame(
    entity_df: pd.DataFrame | str | None,
    store_config: DuckDBAsofOfflineStoreConfig,
    config: RepoConfig,
) -> pd.DataFrame:
    """The entity rows: the frame itself, or the result of a DuckDB SQL query over files."""
    if isinstance(entity_df, pd.DataFrame):
        return entity_df
    if isinstance(entity_df, str):
        with _connect(store_config) as con:
            root = _root(config)
            if root is not None:
                con.execute(f"SET file_search_path = {_sql_string(root)}")
            return con.sql(entity_df).df()
    raise ValueError(
        "DuckDBAsofOfflineStore needs an entity_df (a pandas DataFrame or a DuckDB SQL query); "
        f"got {type(entity_df).__name__}. Retrieval by start_date/end_date is not supported."
    )


def event_timestamp_column(entities: pd.DataFrame) -> str:
    """`event_timestamp`, else the entity frame's single datetime column (as Feast infers it)."""
    if DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL in entities.columns:
        return DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL
    datetimes = [
        c for c, dtype in entities.dtypes.items() if pd.api.types.is_datetime64_any_dtype(dtype)
    ]
    if len(datetimes) != 1:
        raise EntityTimestampInferenceException(DEFAULT_ENTITY_DF_EVENT_TIMESTAMP_COL)
    logger.info("Using %r as the entity event timestamp", datetimes[0])
    return str(datetimes[0])


def utc_micros(values: pd.Series) -> pd.Series:
    """Event timestamps as UTC instants in microseconds; naive values are taken as UTC."""
    utc = pd.to_datetime(values, utc=True)
    # DuckDB's TIMESTAMPTZ holds microseconds; flooring matches how it casts feature timestamps.
    return utc.dt.floor("us").dt.as_unit("us")


def _ts_literal(value: datetime | pd.Timestamp) -> str:
    ts = pd.Timestamp(value)
    ts = ts.tz_localize("UTC") if ts.tzinfo is None else ts.tz_convert("UTC")
    return f"TIMESTAMPTZ {_sql_string(ts.floor('us').isoformat())}"


def join_metadata(
    feature_refs: list[str],
    entities: pd.DataFrame,
    event_column: str,
    window: tuple[pd.Timestamp, pd.Timestamp],
) -> RetrievalMetadata:
    """What Feast records of a point-in-time join: its features, the entity frame's other
    columns, and the first and last event instant."""
    return RetrievalMetadata(
        features=feature_refs,
        keys=[str(c) for c in entities.columns if c != event_column],
        min_event_timestamp=_python_datetime(window[0]),
        max_event_timestamp=_python_datetime(window[1]),
    )


def _python_datetime(value: pd.Timestamp) -> datetime | None:
    return None if pd.isna(value) else value.to_pydatetime()


def _q(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _sql_string(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"
