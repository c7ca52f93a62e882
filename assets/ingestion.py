"""Ingestion: each day's raw event tables and the dimension tables, as received, into the lake."""

from typing import TYPE_CHECKING

import dagster as dg

from assets.contracts import FLIGHTS, WEATHER
from pipelines.partitions import daily_partitions, partition_day
from resources.expectations import TableContract
from resources.sources import RawSource, SourceError

if TYPE_CHECKING:
    import pandas as pd

INGESTION = "ingestion"


def _ingest_day(
    context: dg.AssetExecutionContext, source: RawSource, contract: TableContract
) -> "pd.DataFrame":
    day = partition_day(context.partition_key)
    try:
        drop = source.read_day(contract.table, day, timestamp_columns=contract.timestamp_columns)
    except SourceError as exc:
        # Nothing is written: the lake keeps the last drop that could be read.
        raise dg.Failure(
            description=f"partition {context.partition_key}: rule readable_drop failed: {exc}",
            metadata={"partition": context.partition_key, "rule": "readable_drop"},
            allow_retries=False,
        ) from exc
    context.add_output_metadata({"source": dg.MetadataValue.url(drop.uri)})
    return drop.frame


@dg.asset(
    partitions_def=daily_partitions,
    group_name=INGESTION,
    kinds={"pandas", "parquet"},
    code_version="1",
    io_manager_key="lake",
)
def raw_flights(context: dg.AssetExecutionContext, source: RawSource):
    """The day's scheduled departures from New York airports, exactly as delivered."""
    return _ingest_day(context, source, FLIGHTS)


@dg.asset(
    partitions_def=daily_partitions,
    group_name=INGESTION,
    kinds={"pandas", "parquet"},
    code_version="1",
    io_manager_key="lake",
)
def raw_weather(context: dg.AssetExecutionContext, source: RawSource):
    """The day's hourly weather at the origin airports, exactly as the source delivered it."""
    return _ingest_day(context, source, WEATHER)


def _dimension(name: str, description: str) -> dg.AssetsDefinition:
    @dg.asset(
        name=name,
        description=description,
        group_name=INGESTION,
        kinds={"pandas", "parquet"},
        code_version="1",
        io_manager_key="lake",
    )
    def _load(context: dg.AssetExecutionContext, source: RawSource):
        try:
            table = source.read_table(name)
        except SourceError as exc:
            raise dg.Failure(description=f"rule readable_drop failed: {exc}") from exc
        if table.frame.empty:
            raise dg.Failure(
                description=f"table {name!r}: rule min_rows failed: 0 rows in {table.uri}"
            )
        context.add_output_metadata({"source": dg.MetadataValue.url(table.uri)})
        return table.frame

    return _load


planes = _dimension("planes", "Aircraft by tail number: year built, type, engines, seats.")
airlines = _dimension("airlines", "Carrier codes and names; the carriers flights may name.")
airports = _dimension("airports", "Airports by FAA code: name, location, altitude, timezone.")
