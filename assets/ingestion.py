"""Ingestion: the dimension tables, as received (an event table's days are read by
`resources.publishing.read_drop`, in the step of `assets.validation`)."""

import dagster as dg

from assets import EXTERNAL_RETRY, asset_key
from assets.pods import SMALL
from declare import Dimension, UseCase
from resources.sources import RawSource, RawTable, SourceError

INGESTION = "ingestion"
KINDS = {"pandas", "parquet"}


def _lineage(table: RawTable) -> dict[str, dg.MetadataValue]:
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
