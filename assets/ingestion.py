"""Ingestion: each day's raw event tables and the dimension tables, as received, into the lake."""

from collections.abc import Iterator
from typing import TYPE_CHECKING

import dagster as dg

from assets import EXTERNAL_RETRY
from assets.contracts import FLIGHTS, WEATHER
from assets.pods import SMALL
from pipelines.partitions import daily_partitions, partition_day
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
            yield from drop.frames()
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


def _lake_asset(name: str, description: str, partitions_def: dg.PartitionsDefinition | None = None):
    """The decorator every ingested table shares: its group, kinds and the lake it lands in."""
    return dg.asset(
        name=name,
        description=description,
        partitions_def=partitions_def,
        code_version="1",
        group_name=INGESTION,
        kinds=KINDS,
        io_manager_key="lake",
        retry_policy=EXTERNAL_RETRY,  # the source may be a network share or an object store
        op_tags=SMALL,
    )


def _raw_day(contract: TableContract, description: str) -> dg.AssetsDefinition:
    @_lake_asset(f"raw_{contract.table}", description, daily_partitions)
    def _ingest(context: dg.AssetExecutionContext, source: RawSource):
        return _ingest_day(context, source, contract)

    return _ingest


raw_flights = _raw_day(
    FLIGHTS, "The day's scheduled departures from New York airports, exactly as delivered."
)
raw_weather = _raw_day(
    WEATHER, "The day's hourly weather at the origin airports, exactly as delivered."
)


def _dimension(name: str, description: str) -> dg.AssetsDefinition:
    @_lake_asset(name, description)
    def _load(context: dg.AssetExecutionContext, source: RawSource):
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


planes = _dimension("planes", "Aircraft by tail number: year built, type, engines, seats.")
airlines = _dimension("airlines", "Carrier codes and names; the carriers flights may name.")
airports = _dimension("airports", "Airports by FAA code: name, location, altitude, timezone.")
