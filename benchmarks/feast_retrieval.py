"""P4: a training set's point-in-time join through Feast (the project's DuckDB ASOF offline store)
÷ a hand-written native DuckDB ASOF JOIN producing the same frame, on the full year.

    python -m benchmarks.feature_data HOME/lake              # once: the year's feature tables
    python -m benchmarks.feast_retrieval feast  --home HOME
    python -m benchmarks.feast_retrieval duckdb --home HOME
    python -m benchmarks.feast_retrieval check  --home HOME   # both, and compare them

The entity rows are what `training_set` builds for the whole year: every labelled flight
(327,346 rows) with the join keys of `flight_delay_v1`. `feast` times
`FeastFeatureStore.historical_features` (`get_historical_features(...).to_df()`, as the asset
calls it); `duckdb` times one query with one ASOF JOIN per view of the service over the same
Parquet files, TTLs applied, from the same pandas frame to a pandas frame with the same columns.
Each prints one JSON line after a warm-up.
"""

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa

from ml.dataset import LabelSpec, labelled_rows
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore

SERVICE = "flight_delay_v1"
LABEL = LabelSpec(view="flight_outcome", label="arrival_delayed")


@dataclass(frozen=True)
class FeatureTable:
    """One feature view as the native query reads it."""

    view: str
    files: str
    keys: tuple[str, ...]
    timestamp: str
    features: tuple[str, ...]
    ttl: timedelta


def feature_store(home: Path) -> FeastFeatureStore:
    """The project's repo applied under `home` (registry in `home/feast`, tables in `home/lake`)."""
    store = FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)).for_use_case("flights")
    store.apply()
    return store


def entity_rows(home: Path, store: FeastFeatureStore) -> pd.DataFrame:
    outcomes = pd.read_parquet(home / "lake" / "flights" / "flight_outcomes")
    rows, _ = labelled_rows(outcomes, LABEL, store.join_keys(SERVICE))
    return rows


def service_tables(home: Path, store: FeastFeatureStore) -> list[FeatureTable]:
    feast_store = store.store()
    tables = []
    for projection in feast_store.get_feature_service(SERVICE).feature_view_projections:
        view = feast_store.get_feature_view(projection.name)
        source = view.batch_source
        assert source is not None
        tables.append(
            FeatureTable(
                view=view.name,
                files=str(home / "lake" / source.path / "*.parquet"),
                keys=tuple(view.join_keys),
                timestamp=source.timestamp_field,
                features=tuple(f.name for f in projection.features),
                ttl=view.ttl or timedelta(0),
            )
        )
    return tables


def native_sql(tables: list[FeatureTable]) -> str:
    """One hand-written ASOF JOIN per view, TTL applied, in the entity frame's order."""
    selects, joins = ["e.* EXCLUDE (__row)"], []
    for i, t in enumerate(tables):
        alias = f"f{i}"
        on = " AND ".join(f"e.{k} = {alias}.{k}" for k in t.keys)
        joins.append(
            f"ASOF LEFT JOIN read_parquet('{t.files}') AS {alias} "
            f"ON {on} AND e.event_timestamp >= {alias}.{t.timestamp}"
        )
        ttl_s = int(t.ttl.total_seconds())
        fresh = f"{alias}.{t.timestamp} >= e.event_timestamp - INTERVAL {ttl_s} SECOND"
        selects += [f"CASE WHEN {fresh} THEN {alias}.{f} END AS {t.view}__{f}" for f in t.features]
    return (
        "WITH e AS (SELECT *, row_number() OVER () AS __row FROM entity_df)\n"
        f"SELECT {', '.join(selects)}\nFROM e\n" + "\n".join(joins) + "\nORDER BY e.__row"
    )


def native_retrieval(tables: list[FeatureTable]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    """The same frame as Feast's, straight from one DuckDB query."""
    sql = native_sql(tables)

    def retrieve(entity_df: pd.DataFrame) -> pd.DataFrame:
        with duckdb.connect() as con:
            con.execute("SET TimeZone = 'UTC'")
            # Arrow in and out: DuckDB's pandas scan and `.df()` take about twice as long here.
            con.register("entity_df", pa.Table.from_pandas(entity_df, preserve_index=False))
            return con.sql(sql).to_arrow_table().to_pandas()

    return retrieve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("impl", choices=["feast", "duckdb", "check"])
    parser.add_argument("--home", type=Path, required=True)
    args = parser.parse_args()
    store = feature_store(args.home)
    rows = entity_rows(args.home, store)
    native = native_retrieval(service_tables(args.home, store))

    def ours(frame: pd.DataFrame) -> pd.DataFrame:
        return store.historical_features(frame, SERVICE)

    if args.impl == "check":
        pd.testing.assert_frame_equal(ours(rows), native(rows), check_dtype=False)
        print(json.dumps({"rows": len(rows), "equal": True}))
        return
    run = ours if args.impl == "feast" else native
    warm = run(rows)  # warm-up: imports, registry cache, file cache
    began = time.perf_counter()
    frame = run(rows)
    seconds = time.perf_counter() - began
    assert frame.shape == warm.shape
    print(json.dumps({"seconds": seconds, "rows": len(frame)}))


if __name__ == "__main__":
    main()
