"""Feast's SQLite online store with a bulk write path for materialization.

Stock Feast materializes by converting every (entity, feature) of the pulled Arrow table into a
`ValueProto` (`feast.utils._convert_arrow_to_proto`), then `SqliteOnlineStore.online_write_batch`
runs one `INSERT ... ON CONFLICT DO UPDATE` per value from Python. Here:

- `BulkSqliteOnlineStore.online_write_batch` writes the same rows with one `executemany` in one
  transaction (every caller of the store benefits: materialize, push, `write_to_online_store`);
- `BulkSqliteComputeEngine`, Feast's local engine with another output node, hands the Arrow batch
  to the store, which encodes it column by column without the generic per-value conversion.

The rows are those stock Feast writes: same table and index, same entity-key bytes, same
serialized `ValueProto`, same `value_text`, same timestamps; so Feast's own `online_read` and
`get_online_features` read them, and a repo can switch back to `type: sqlite` on the same file.
One deliberate difference: an int64 column with nulls keeps values beyond 2**53 exact, where
stock Feast rounds them through float64. Views with types encoded here (Float64/32, Int64/32,
Bool, String; Int64/32 or String join keys) take the Arrow path; any other view, and stores with
`vector_enabled` or `enable_openai_compatible_store`, take Feast's own path unchanged.

    online_store:
      type: ml.featurestore.online_sqlite.BulkSqliteOnlineStore
      path: data/online.db
    batch_engine: ml.featurestore.online_sqlite.BulkSqliteComputeEngine
"""

import struct
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Literal

import pyarrow as pa
from feast.feature_view import FeatureView
from feast.infra.common.materialization_job import MaterializationJobStatus, MaterializationTask
from feast.infra.compute_engines.dag.context import ExecutionContext
from feast.infra.compute_engines.local.arrow_table_value import ArrowTableValue
from feast.infra.compute_engines.local.compute import (
    LocalComputeEngine,
    LocalComputeEngineConfig,
)
from feast.infra.compute_engines.local.feature_builder import LocalFeatureBuilder
from feast.infra.compute_engines.local.job import LocalMaterializationJob
from feast.infra.compute_engines.local.nodes import LocalOutputNode
from feast.infra.key_encoding_utils import serialize_entity_key, serialize_entity_key_prefix
from feast.infra.online_stores.helpers import extract_text_and_num
from feast.infra.online_stores.sqlite import (
    SqliteOnlineStore,
    SqliteOnlineStoreConfig,
    _quote_id,
    _table_id,
)
from feast.infra.registry.base_registry import BaseRegistry
from feast.protos.feast.types.EntityKey_pb2 import EntityKey as EntityKeyProto
from feast.protos.feast.types.Value_pb2 import Value as ValueProto
from feast.protos.feast.types.Value_pb2 import ValueType as ValueTypeProto
from feast.repo_config import RepoConfig
from feast.utils import to_naive_utc
from feast.value_type import ValueType

STORE_TYPE = "ml.featurestore.online_sqlite.BulkSqliteOnlineStore"
ENGINE_TYPE = "ml.featurestore.online_sqlite.BulkSqliteComputeEngine"
Row = tuple[bytes, str, bytes, str | None, int, int | None]
"""(entity_key, feature_name, value, value_text, event_ts, created_ts), as stock Feast writes."""

_ENCODERS: dict[ValueType, tuple[Callable[[Any], ValueProto], Callable[[ValueProto], Any]]] = {
    ValueType.DOUBLE: (lambda v: ValueProto(double_val=v), lambda p: str(p.double_val)),
    ValueType.FLOAT: (lambda v: ValueProto(float_val=v), lambda p: str(p.float_val)),
    ValueType.INT64: (lambda v: ValueProto(int64_val=int(v)), lambda p: str(p.int64_val)),
    ValueType.INT32: (lambda v: ValueProto(int32_val=int(v)), lambda p: str(p.int32_val)),
    ValueType.BOOL: (lambda v: ValueProto(bool_val=v), lambda p: str(p.bool_val)),
    ValueType.STRING: (lambda v: ValueProto(string_val=v), lambda p: p.string_val),
}
"""The feature types this module encodes itself: the `ValueProto` of a value, and the
`value_text` of that proto (what Feast's `extract_text_and_num` gives for its type)."""


def _is_text(arrow_type: pa.DataType) -> bool:
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _is_number(arrow_type: pa.DataType) -> bool:
    return pa.types.is_integer(arrow_type) or pa.types.is_floating(arrow_type)


_FEATURE_ARROW_TYPES: dict[ValueType, Callable[[pa.DataType], bool]] = {
    ValueType.DOUBLE: _is_number,
    ValueType.FLOAT: _is_number,
    # An integer column with nulls comes out of a pandas step as float64; Feast takes int(value).
    ValueType.INT64: _is_number,
    ValueType.INT32: _is_number,
    ValueType.BOOL: pa.types.is_boolean,
    ValueType.STRING: _is_text,
}
"""The Arrow columns each of those types is read from, as stock Feast reads them."""
_KEY_ARROW_TYPES: dict[ValueType, Callable[[pa.DataType], bool]] = {
    ValueType.INT64: pa.types.is_integer,
    ValueType.INT32: pa.types.is_integer,
    ValueType.STRING: _is_text,
}
_INT64_KEY = struct.Struct("<IIq")
_INT32_KEY = struct.Struct("<IIi")
_STRING_KEY = struct.Struct("<II")


class BulkSqliteOnlineStoreConfig(SqliteOnlineStoreConfig):
    """`SqliteOnlineStoreConfig` selecting `BulkSqliteOnlineStore`."""

    type: Literal["ml.featurestore.online_sqlite.BulkSqliteOnlineStore"] = STORE_TYPE  # pyright: ignore[reportIncompatibleVariableOverride]


class BulkSqliteOnlineStore(SqliteOnlineStore):
    """`SqliteOnlineStore` whose batch writes are one `executemany` in one transaction."""

    def online_write_batch(
        self,
        config: RepoConfig,
        table: FeatureView,
        data: list[tuple[EntityKeyProto, dict[str, ValueProto], datetime, datetime | None]],
        progress: Callable[[int], Any] | None,
    ) -> None:
        """Upsert `data` into the view's table as stock Feast would, in one statement."""
        if not plain_rows(config):
            super().online_write_batch(config, table, data, progress)
            return
        version = config.entity_key_serialization_version
        rows: list[Row] = []
        for entity_key, values, event_ts, created_ts in data:
            key = serialize_entity_key(entity_key, entity_key_serialization_version=version)
            event = _epoch_s(event_ts)
            created = None if created_ts is None else _epoch_s(created_ts)
            for name, value in values.items():
                text, _ = extract_text_and_num(value, False)
                rows.append((key, name, value.SerializeToString(), text, event, created))
        self.write_rows(config, table, [rows])
        if progress:
            progress(len(data))

    def write_rows(
        self, config: RepoConfig, table: FeatureView, batches: Iterable[list[Row]]
    ) -> None:
        """Upsert prepared rows into the view's table in one transaction, a batch at a time (a
        generator's next batch is prepared once the one before is written)."""
        registry = config.registry
        assert registry is not None  # RepoConfig always builds one
        name = _quote_id(
            _table_id(config.project, table, registry.enable_online_feature_view_versioning)
        )
        conn = self._get_conn(config)
        upsert = (
            f"INSERT INTO {name} (entity_key, feature_name, value, value_text, event_ts,"
            " created_ts) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(entity_key, feature_name)"
            " DO UPDATE SET value = excluded.value, value_text = excluded.value_text,"
            " event_ts = excluded.event_ts, created_ts = excluded.created_ts"
        )
        with conn:
            for rows in batches:
                conn.executemany(upsert, rows)


def plain_rows(config: RepoConfig) -> bool:
    """Whether the table has only the plain columns (no vector or numeric-search options)."""
    store = config.online_store
    assert isinstance(store, SqliteOnlineStoreConfig)
    return not (store.vector_enabled or store.enable_openai_compatible_store)


def arrow_applies(
    config: RepoConfig, view: FeatureView, schema: pa.Schema, join_keys: Mapping[str, ValueType]
) -> bool:
    """Whether `arrow_rows` encodes this view's table; otherwise Feast's generic path must."""
    source = view.batch_source
    if source is None or not plain_rows(config) or config.entity_key_serialization_version < 3:
        return False
    times = [source.timestamp_field, source.created_timestamp_column]
    columns = [
        *((f.name, _FEATURE_ARROW_TYPES.get(f.dtype.to_value_type())) for f in view.features),
        *((name, _KEY_ARROW_TYPES.get(kind)) for name, kind in join_keys.items()),
        *((name, pa.types.is_timestamp) for name in times if name),
    ]
    return all(
        accepts is not None and name in schema.names and accepts(schema.field(name).type)
        for name, accepts in columns
    )


def arrow_rows(
    batch: pa.Table | pa.RecordBatch, view: FeatureView, join_keys: Mapping[str, ValueType]
) -> list[Row]:
    """The rows stock Feast writes for `batch`, entity by entity; needs `arrow_applies`."""
    assert view.batch_source is not None
    created_column = view.batch_source.created_timestamp_column
    keys = _entity_keys(batch, join_keys)
    events = _epoch_s_column(batch.column(view.batch_source.timestamp_field))
    created = (
        _epoch_s_column(batch.column(created_column)) if created_column else [None] * len(keys)
    )
    names = [f.name for f in view.features]
    width, size = len(names), len(keys) * len(names)
    # Entity-major, as stock Feast writes: a key's features land next to each other in the index.
    values: list[Any] = [None] * size
    texts: list[Any] = [None] * size
    for k, feature in enumerate(view.features):
        column = _encoded(batch.column(feature.name), feature.dtype.to_value_type())
        values[k::width], texts[k::width] = column
    return list(
        zip(
            _repeated(keys, width),
            names * len(keys),
            values,
            texts,
            _repeated(events, width),
            _repeated(created, width),
            strict=True,
        )
    )


def _repeated(items: list, times: int) -> list:
    """Each item `times` times in a row."""
    out: list[Any] = [None] * (len(items) * times)
    for k in range(times):
        out[k::times] = items
    return out


def _encoded(
    column: pa.ChunkedArray | pa.Array, kind: ValueType
) -> tuple[list[bytes], list[str | None]]:
    """Serialized ValueProto and value_text per value; null and NaN are null, as in stock Feast."""
    make, text = _ENCODERS[kind]
    # Each distinct value is encoded once; Arrow's dictionary keeps -0.0 apart from 0.0.
    encoded = _dictionary_encoded(column)
    protos = [None if v != v else make(v) for v in encoded.dictionary.to_pylist()]  # NaN
    blobs = [b"" if proto is None else proto.SerializeToString() for proto in protos]
    texts = [None if proto is None else text(proto) for proto in protos]
    null = len(protos)
    blobs.append(b"")
    texts.append(None)
    indices = encoded.indices.fill_null(null).to_pylist()
    return [blobs[i] for i in indices], [texts[i] for i in indices]


def _dictionary_encoded(column: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return column.dictionary_encode()


def _entity_keys(batch: pa.Table | pa.RecordBatch, join_keys: Mapping[str, ValueType]) -> list:
    """`serialize_entity_key` (version 3) of every row, without building `EntityKey` protos."""
    names = sorted(join_keys)
    prefix = serialize_entity_key_prefix(names, entity_key_serialization_version=3)
    parts = [_key_part(batch.column(name), join_keys[name]) for name in names]
    return [prefix + b"".join(values) for values in zip(*parts, strict=True)]


def _key_part(column: pa.ChunkedArray | pa.Array, kind: ValueType) -> list[bytes]:
    values = column.to_pylist()
    if None in values:
        raise ValueError(f"Null join key in column of type {column.type}.")
    if kind == ValueType.INT64:
        return [_INT64_KEY.pack(ValueTypeProto.INT64, 8, v) for v in values]
    if kind == ValueType.INT32:
        return [_INT32_KEY.pack(ValueTypeProto.INT32, 4, v) for v in values]
    encoded = [v.encode("utf8") for v in values]
    return [_STRING_KEY.pack(ValueTypeProto.STRING, len(b)) + b for b in encoded]


def _epoch_s(ts: datetime) -> int:
    # What Feast's sqlite3 datetime adapter stores: int(naive_utc.timestamp()).
    return int(to_naive_utc(ts).timestamp())


def _epoch_s_column(column: pa.ChunkedArray | pa.Array) -> list[int]:
    """`_epoch_s` of every value, computed once per distinct timestamp."""
    # Dropping the zone keeps the UTC wall clock; microseconds, as `to_pydatetime` truncates to.
    encoded = _dictionary_encoded(column.cast(pa.timestamp("us"), safe=False))
    seconds = [int(ts.timestamp()) for ts in encoded.dictionary.to_pylist()]
    return [seconds[i] for i in encoded.indices.to_pylist()]


class BulkSqliteOutputNode(LocalOutputNode):
    """`LocalOutputNode` that hands Arrow batches straight to a `BulkSqliteOnlineStore`."""

    def execute(self, context: ExecutionContext) -> ArrowTableValue:
        store, config, view = context.online_store, context.repo_config, self.feature_view
        table = self.get_single_table(context).data
        join_keys = {e.name: e.dtype.to_value_type() for e in view.entity_columns}
        if not (
            view.online
            and table.num_rows
            and isinstance(store, BulkSqliteOnlineStore)
            and isinstance(view, FeatureView)
            and arrow_applies(config, view, table.schema, join_keys)
        ):
            return super().execute(context)
        # Encoded rows take many times the Arrow batch: `online_write_batch_size` bounds them.
        size = config.materialization_config.online_write_batch_size
        batches = [table] if size is None else table.to_batches(max_chunksize=size)
        store.write_rows(config, view, (arrow_rows(b, view, join_keys) for b in batches))
        if view.offline:
            context.offline_store.offline_write_batch(
                config=config, feature_view=view, table=table, progress=lambda _: None
            )
        output = ArrowTableValue(data=table)
        context.node_outputs[self.name] = output
        return output


class BulkSqliteFeatureBuilder(LocalFeatureBuilder):
    """`LocalFeatureBuilder` ending in a `BulkSqliteOutputNode`."""

    def build_output_nodes(self, view, input_node):
        # As Feast's LocalFeatureBuilder does: the node takes any view, despite its annotation.
        root = self.dag_root.view
        node = BulkSqliteOutputNode("output", root, inputs=[input_node])  # pyright: ignore[reportArgumentType]
        self.nodes.append(node)
        return node


class BulkSqliteComputeEngineConfig(LocalComputeEngineConfig):
    """`LocalComputeEngineConfig` selecting `BulkSqliteComputeEngine`."""

    type: Literal["ml.featurestore.online_sqlite.BulkSqliteComputeEngine"] = ENGINE_TYPE  # pyright: ignore[reportIncompatibleVariableOverride]


class BulkSqliteComputeEngine(LocalComputeEngine):
    """Feast's local engine, materializing through a `BulkSqliteOutputNode`."""

    def _materialize_one(
        self, registry: BaseRegistry, task: MaterializationTask, **kwargs
    ) -> LocalMaterializationJob:
        job_id = f"{task.feature_view.name}-{task.start_time}-{task.end_time}"
        context = self.get_execution_context(registry, task)
        try:
            builder = BulkSqliteFeatureBuilder(registry, task, backend=self._get_backend(context))
            builder.build().execute(context)
        except Exception as error:
            # Feast's engine contract: the job carries the error, the provider raises it.
            return LocalMaterializationJob(
                job_id=job_id, status=MaterializationJobStatus.ERROR, error=error
            )
        return LocalMaterializationJob(job_id=job_id, status=MaterializationJobStatus.SUCCEEDED)
