"""Jobs: what runs together."""

import dagster as dg

dimensions_job = dg.define_asset_job(
    "load_dimensions",
    selection=dg.AssetSelection.assets("planes", "airlines", "airports"),
    description="Load the dimension tables (planes, airlines, airports).",
)

daily_ingestion_job = dg.define_asset_job(
    "ingest_and_validate",
    selection=dg.AssetSelection.groups("ingestion", "validation").required_multi_asset_neighbors()
    - dg.AssetSelection.assets("planes", "airlines", "airports"),
    description="Ingest one day's raw tables, audit them with GX and publish what passes.",
)
