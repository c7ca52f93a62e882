"""Ingestion: each day's raw event tables and the dimension tables, as received, into the lake."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg

from assets import EXTERNAL_RETRY
from assets.pods import SMALL
from assets.usecase import Dimension, EventTable, UseCase, partition_day
from resources.expectations import TableContract
from resources.lake import Chunks
from resources.sources import RawChunks, RawSource, RawTable, SourceError

if TYPE_CHECKING:
    import pandas as pd

INGESTION = "ingestion"
KINDS = {"pandas", "parquet"}


def _ingest_day(
    context: dg.AssetExecutionContext, source: RawSource, contract: TableContract
) -> Chunks:
    """The day's drop, handed to the lake a chunk at a time. Nothing is written unless every
    chunk is read: the lake keeps the last drop that could be."""
    day = partition_day(context.partition_key)
    try:
        drop = source.read_day_chunks(
            contract.table,
            day,
            timestamp_columns=contract.timestamp_columns,
            missing_values=contract.missing_values_by_column,
        )
    except SourceError as exc:
        raise _refused(context, exc) from exc
    context.add_output_metadata({**_lineage(drop), "source_rows": drop.rows})

    def frames() -> "Iterator[pd.DataFrame]":
        try:
            for chunk in drop.frames():
                # An empty day, typed as its contract says (its `min_rows` decides its fate).
                yield contract.typed_empty(chunk) if drop.rows == 0 else chunk
        except SourceError as exc:
            raise _refused(context, exc) from exc

    return Chunks(frames)


def _refused(context: dg.AssetExecutionContext, exc: SourceError) -> dg.Failure:
    return dg.Failure(
        description=f"partition {context.partition_key}: rule {exc.rule} failed: {exc}",
        metadata={"partition": context.partition_key, "rule": exc.rule},
        allow_retries=False,
    )


def _lineage(table: RawTable | RawChunks) -> dict[str, dg.MetadataValue]:
    """Where a table was read from: the real file and the sha256 of the bytes read."""
    return {
        "source": dg.MetadataValue.url(table.uri),
        "source_sha256": dg.MetadataValue.text(table.sha256),
    }


def source_key(case: UseCase) -> str:
    """The resource key of the use case's raw source."""
    return f"{case.name}_source"


def ingestion_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """Each event table's daily raw partitions and each dimension table, as received."""
    return [_raw_day(case, table) for table in case.event_tables] + [
        _dimension(case, dimension) for dimension in case.dimensions
    ]


def _lake_asset(
    case: UseCase,
    name: str,
    description: str,
    partitions_def: dg.PartitionsDefinition | None = None,
):
    """The decorator every ingested table shares: its group, kinds and the lake it lands in."""
    return dg.asset(
        key=case.key(name),
        description=description,
        partitions_def=partitions_def,
        code_version="1",
        group_name=case.group(INGESTION),
        kinds=KINDS,
        io_manager_key="lake",
        retry_policy=EXTERNAL_RETRY,  # the source may be a network share or an object store
        op_tags=SMALL,
        required_resource_keys={source_key(case)},
    )


def _raw_day(case: UseCase, table: EventTable) -> dg.AssetsDefinition:
    @_lake_asset(case, f"raw_{table.name}", table.description, case.partitions.definition())
    def _ingest(context: dg.AssetExecutionContext):
        return _ingest_day(context, getattr(context.resources, source_key(case)), table.contract)

    return _ingest


def _dimension(case: UseCase, dimension: Dimension) -> dg.AssetsDefinition:
    name = dimension.name

    @_lake_asset(case, name, dimension.description)
    def _load(context: dg.AssetExecutionContext):
        source: RawSource = getattr(context.resources, source_key(case))
        try:
            table = source.read_table(name)
        except SourceError as exc:
            raise dg.Failure(description=f"rule {exc.rule} failed: {exc}") from exc
        if table.frame.empty:
            raise dg.Failure(
                description=f"table {name!r}: rule min_rows failed: 0 rows in {table.uri}"
            )
        context.add_output_metadata(_lineage(table))
        return table.frame

    return _load
