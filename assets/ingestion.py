"""Ingestion: reading a day's drop of an event table, and the dimension tables, as received."""

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets import EXTERNAL_RETRY, asset_key
from assets.pods import SMALL
from declare import Dimension, UseCase, partition_day
from declare.contracts import TableContract
from resources.contract_frames import typed_empty
from resources.sources import RawChunks, RawSource, RawTable, SourceError

if TYPE_CHECKING:
    import pandas as pd

INGESTION = "ingestion"
KINDS = {"pandas", "parquet"}


class Refused(Exception):
    """A day that is not published, and why: the message names its partition, rule and count."""

    def __init__(self, partition_key: str, rule: str, message: str):
        super().__init__(message)
        self.partition_key, self.rule = partition_key, rule


def read_drop(source: RawSource, contract: TableContract, partition_key: str) -> RawChunks:
    """The day's drop, handed to the lake a chunk at a time (an empty day typed as its contract
    says: its `min_rows` decides its fate). Nothing is written unless every chunk is read: the
    lake keeps the last drop that could be."""
    day = partition_day(partition_key)
    try:
        drop = source.read_day_chunks(
            contract.table,
            day,
            timestamp_columns=contract.timestamp_columns,
            missing_values=contract.missing_values_by_column,
        )
    except SourceError as exc:
        raise _refused(partition_key, exc) from exc

    def frames() -> "Iterator[pd.DataFrame]":
        try:
            for chunk in drop.frames():
                yield typed_empty(contract, chunk) if drop.rows == 0 else chunk
        except SourceError as exc:
            raise _refused(partition_key, exc) from exc

    return dataclasses.replace(drop, frames=frames)


def drop_metadata(drop: RawChunks) -> dict[str, Any]:
    """What a raw partition's materialization records of the drop it was read from."""
    return {**_lineage(drop), "source_rows": drop.rows}


def _refused(partition_key: str, exc: SourceError) -> Refused:
    return Refused(
        partition_key, exc.rule, f"partition {partition_key}: rule {exc.rule} failed: {exc}"
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


def dimension_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """Each dimension table, as received (the event tables' days are `assets.validation`'s)."""
    return [_dimension(case, dimension) for dimension in case.dimensions]


def _lake_asset(
    case: UseCase,
    name: str,
    description: str,
):
    """The decorator a dimension table uses: its group, kinds and the lake it lands in."""
    return dg.asset(
        key=asset_key(case, name),
        description=description,
        code_version="1",
        group_name=case.group(INGESTION),
        kinds=KINDS,
        io_manager_key="lake",
        retry_policy=EXTERNAL_RETRY,  # the source may be a network share or an object store
        op_tags=SMALL,
        required_resource_keys={source_key(case)},
    )


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
