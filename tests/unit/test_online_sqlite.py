"""The bulk SQLite online store and engine write what stock Feast writes, through Feast's own API.

Two repos over the same Parquet sources, one with Feast's `sqlite` store and `local` engine, one
with `BulkSqliteOnlineStore` and `BulkSqliteComputeEngine`: their online tables must hold the same
bytes, and `get_online_features` must return each entity's latest row, nulls as nulls."""

import math
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.unit

T0 = pd.Timestamp("2013-01-01", tz="UTC")
START, END = T0 - pd.Timedelta(days=1), T0 + pd.Timedelta(days=10)
STATIONS = list(range(1, 31))
OUTSIDE = 99  # a station whose only row is after END: never materialized
FEATURES = ["temp", "ratio", "count", "legacy_count", "small", "label", "flag"]
NAN_STATION, NEG_ZERO_STATION, TIE_STATION = 3, 4, 5


@dataclass(frozen=True)
class Repos:
    stock: Any  # feast.FeatureStore
    bulk: Any
    stations: pd.DataFrame
    routes: pd.DataFrame
    arrow_batches: int  # batches the bulk engine encoded from Arrow on its first materialize
    batched: Any  # the bulk engine with `online_write_batch_size` set
    batched_arrow_batches: int


def station_table(seed: int) -> pa.Table:
    """Three rows per station inside the window, every feature type, nulls, NaN and -0.0."""
    rng = np.random.default_rng(seed)
    n = len(STATIONS) * 3
    ids = [s for s in STATIONS for _ in range(3)]
    hours = [day * 24 + int(rng.integers(0, 24)) for _ in STATIONS for day in (1, 3, 5)]
    events = [T0 + pd.Timedelta(hours=h) for h in hours]
    created = [e + pd.Timedelta(minutes=1) for e in events]
    # A later row at the same event time: the one created last must win.
    ids.append(TIE_STATION)
    events.append(events[TIE_STATION * 3 - 1])
    created.append(created[TIE_STATION * 3 - 1] + pd.Timedelta(minutes=5))
    ids.append(OUTSIDE)
    events.append(END + pd.Timedelta(days=1))
    created.append(END + pd.Timedelta(days=1))
    n += 2

    def nullable(values: list) -> list:
        return [None if rng.random() < 0.2 else v for v in values]

    temp = nullable([round(float(v), 2) for v in rng.normal(10, 8, n)])
    latest = {s: max(i for i in range(n) if ids[i] == s) for s in (NAN_STATION, NEG_ZERO_STATION)}
    temp[latest[NAN_STATION]] = math.nan  # Feast stores NaN as null
    temp[latest[NEG_ZERO_STATION]] = -0.0
    legacy = nullable([float(v) for v in rng.integers(-500, 500, n)])
    return pa.table(
        {
            "station_id": pa.array(ids, pa.int64()),
            "event_timestamp": pa.array(events, pa.timestamp("us", tz="UTC")),
            "created": pa.array(created, pa.timestamp("us", tz="UTC")),
            "temp": pa.array(temp, pa.float64()),
            "ratio": pa.array(nullable([float(v) for v in rng.random(n)]), pa.float32()),
            "count": pa.array(nullable([int(v) for v in rng.integers(-(2**40), 2**40, n)])),
            # An Int64 feature stored as float64, as pandas writes an int column with nulls.
            "legacy_count": pa.array(legacy, pa.float64()),
            "small": pa.array(nullable([int(v) for v in rng.integers(-1000, 1000, n)]), pa.int32()),
            "label": pa.array(
                nullable([str(rng.choice(["", "a", "ü", "long text"])) for _ in ids])
            ),
            "flag": pa.array(nullable([bool(v) for v in rng.integers(0, 2, n)]), pa.bool_()),
        }
    )


def route_table() -> pa.Table:
    """A view with two join keys, one a string."""
    rows = [("AA", 11, 1, 5.5), ("AA", 11, 2, None), ("B6", 11, 1, -2.0), ("B6", 7, 4, 0.25)]
    return pa.table(
        {
            "carrier": [r[0] for r in rows],
            "flight": pa.array([r[1] for r in rows], pa.int64()),
            "event_timestamp": pa.array(
                [T0 + pd.Timedelta(days=r[2]) for r in rows], pa.timestamp("us", tz="UTC")
            ),
            "delay": pa.array([r[3] for r in rows], pa.float64()),
        }
    )


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Repos]:
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Bool, Float32, Float64, Int32, Int64, String

    from ml.featurestore import online_sqlite

    root = tmp_path_factory.mktemp("online_sqlite")
    sources = {"stations": station_table(seed=5), "routes": route_table()}
    for name, table in sources.items():
        pq.write_table(table, root / f"{name}.parquet")
    station = Entity(name="station", join_keys=["station_id"], value_type=ValueType.INT64)
    carrier = Entity(name="carrier", join_keys=["carrier"], value_type=ValueType.STRING)
    flight = Entity(name="flight", join_keys=["flight"], value_type=ValueType.INT64)
    types = [Float64, Float32, Int64, Int64, Int32, String, Bool]
    views = [
        FeatureView(
            name="stations",
            entities=[station],
            ttl=timedelta(days=365),
            schema=[Field(name=n, dtype=t) for n, t in zip(FEATURES, types, strict=True)],
            source=FileSource(
                path=str(root / "stations.parquet"),
                timestamp_field="event_timestamp",
                created_timestamp_column="created",
            ),
        ),
        FeatureView(
            name="routes",
            entities=[carrier, flight],
            ttl=timedelta(days=365),
            schema=[Field(name="delay", dtype=Float64)],
            source=FileSource(path=str(root / "routes.parquet"), timestamp_field="event_timestamp"),
        ),
    ]

    def store(name: str, online_type: str, engine: str, batch_rows: int | None = None) -> Any:
        folder = root / name
        folder.mkdir()
        feature_store = FeatureStore(config=repo_config(folder, online_type, engine, batch_rows))
        feature_store.apply([station, carrier, flight, *views])
        return feature_store

    stock = store("stock", "sqlite", "local")
    bulk = store("bulk", online_sqlite.STORE_TYPE, online_sqlite.ENGINE_TYPE)
    stock.materialize(START.to_pydatetime(), END.to_pydatetime())
    with mock.patch.object(online_sqlite, "arrow_rows", wraps=online_sqlite.arrow_rows) as spy:
        bulk.materialize(START.to_pydatetime(), END.to_pydatetime())
    batched = store("batched", online_sqlite.STORE_TYPE, online_sqlite.ENGINE_TYPE, batch_rows=4)
    with mock.patch.object(online_sqlite, "arrow_rows", wraps=online_sqlite.arrow_rows) as batches:
        batched.materialize(START.to_pydatetime(), END.to_pydatetime())
    yield Repos(
        stock,
        bulk,
        sources["stations"].to_pandas(),
        sources["routes"].to_pandas(),
        spy.call_count,
        batched,
        batches.call_count,
    )


def repo_config(folder: Path, online_type: str, engine: str, batch_rows: int | None = None) -> Any:
    from feast import RepoConfig

    return RepoConfig(
        materialization={"online_write_batch_size": batch_rows},
        project="p5",
        provider="local",
        registry=str(folder / "registry.db"),
        online_store={"type": online_type, "path": str(folder / "online.db")},
        offline_store={"type": "file"},
        batch_engine=engine,
        entity_key_serialization_version=3,
        repo_path=folder,
    )


def table_rows(store: Any, view: str) -> list[tuple]:
    """Every row of the view's online table, sorted, with every column Feast writes."""
    return db_rows(store.config.online_store.path, view)


def db_rows(path: str, view: str) -> list[tuple]:
    with closing(sqlite3.connect(path)) as conn:
        return sorted(
            conn.execute(
                "SELECT entity_key, feature_name, value, value_text, event_ts, created_ts"
                f" FROM p5_{view}"
            ).fetchall()
        )


def online(store: Any, view: str, features: list[str], rows: list[dict]) -> dict[str, list]:
    refs = [f"{view}:{name}" for name in features]
    return store.get_online_features(features=refs, entity_rows=rows).to_dict()


def test_the_bulk_engine_encodes_from_arrow_instead_of_falling_back(repos: Repos):
    assert repos.arrow_batches == 2  # one per view: the comparisons below test the Arrow path


@pytest.mark.parametrize("view", ["stations", "routes"])
def test_a_range_written_in_batches_holds_the_bytes_of_one_written_whole(repos: Repos, view: str):
    assert repos.batched_arrow_batches > 4  # online_write_batch_size=4: several per view
    assert table_rows(repos.batched, view) == table_rows(repos.stock, view)


@pytest.mark.parametrize("view", ["stations", "routes"])
def test_the_online_tables_hold_the_same_bytes_as_stock_feast(repos: Repos, view: str):
    stock = table_rows(repos.stock, view)
    assert stock  # the comparison is not between two empty tables
    assert table_rows(repos.bulk, view) == stock


def test_get_online_features_returns_the_latest_row_per_entity(repos: Repos):
    frame = repos.stations
    inside = frame[(frame.event_timestamp >= START) & (frame.event_timestamp <= END)]
    latest = (
        inside.sort_values(["event_timestamp", "created"])
        .drop_duplicates("station_id", keep="last")
        .set_index("station_id")
    )
    entity_rows = [{"station_id": s} for s in [*STATIONS, OUTSIDE]]
    got = online(repos.bulk, "stations", FEATURES, entity_rows)
    assert got == online(repos.stock, "stations", FEATURES, entity_rows)
    for name in FEATURES:
        want = [as_served(latest.loc[s, name], name) for s in STATIONS] + [None]
        assert got[name] == want, name


def as_served(value: Any, name: str) -> Any:
    """What Feast returns for a source value of the feature `name`: null and NaN as None."""
    if pd.isna(value):
        return None
    if name in ("count", "legacy_count", "small"):
        return int(value)
    if name == "ratio":
        return float(np.float32(value))
    if name == "flag":
        return bool(value)
    return value


def test_nulls_nan_and_negative_zero_come_back_as_stock_feast_returns_them(repos: Repos):
    rows = [{"station_id": NAN_STATION}, {"station_id": NEG_ZERO_STATION}]
    got = online(repos.bulk, "stations", ["temp"], rows)["temp"]
    assert got[0] is None
    assert got[1] == 0.0 and math.copysign(1.0, got[1]) == -1.0


def test_a_two_key_view_with_a_string_key_reads_back(repos: Repos):
    rows = [
        {"carrier": "AA", "flight": 11},
        {"carrier": "B6", "flight": 7},
        {"carrier": "ZZ", "flight": 1},
    ]
    got = online(repos.bulk, "routes", ["delay"], rows)
    assert got == online(repos.stock, "routes", ["delay"], rows)
    assert got["delay"] == [None, 0.25, None]  # AA 11's latest delay is null


def test_rematerializing_the_same_range_changes_nothing(repos: Repos):
    before = table_rows(repos.bulk, "stations")
    for _ in range(2):
        repos.bulk.materialize(START.to_pydatetime(), END.to_pydatetime())
        assert table_rows(repos.bulk, "stations") == before


def test_pushed_rows_go_through_the_executemany_path_with_the_same_bytes(repos: Repos):
    frame = pd.DataFrame(
        {
            "station_id": [1001, 1002],
            "event_timestamp": [T0, T0 + pd.Timedelta(hours=1)],
            "created": [T0, T0],
            "temp": [1.5, None],
            "ratio": [0.1, 0.2],
            "count": [7, -3],
            "legacy_count": [1, 2],
            "small": [4, 5],
            "label": ["x", None],
            "flag": [True, False],
        }
    )
    for store in (repos.stock, repos.bulk):
        store.write_to_online_store("stations", frame)
    assert table_rows(repos.bulk, "stations") == table_rows(repos.stock, "stations")


def test_the_arrow_encoding_is_feasts_own_conversion_on_what_no_offline_store_here_yields(
    repos: Repos, tmp_path: Path
):
    """NaN (a polars backend keeps it apart from null), -0.0, ints stored as floats, float64 data
    for a Float32 feature: `arrow_rows` against Feast's conversion written by the stock store."""
    from feast import ValueType
    from feast.infra.online_stores.sqlite import SqliteOnlineStore
    from feast.utils import _convert_arrow_to_proto

    from ml.featurestore.online_sqlite import arrow_rows

    n = 6
    table = pa.table(
        {
            "station_id": pa.array(range(2001, 2001 + n), pa.int64()),
            "event_timestamp": pa.array([T0] * n, pa.timestamp("ns", tz="UTC")),
            "created": pa.array([T0 + pd.Timedelta(seconds=k) for k in range(n)]),
            "temp": [math.nan, -0.0, None, 1e300, -2.5, 0.1],
            "ratio": [0.1, math.nan, None, 1 / 3, -0.0, 2.0],
            "count": [1.0, math.nan, None, -(2.0**40), -2.7, 2.7],
            "legacy_count": pa.array([1, None, -7, 0, 2**40, 5], pa.int64()),
            "small": pa.array([1, None, -7, 0, 2**20, 5], pa.int64()),
            "label": ["", None, "é", "a b", "0", "None"],
            "flag": [True, None, False, True, False, None],
        }
    )
    view = repos.stock.get_feature_view("stations")
    join_keys = {"station_id": ValueType.INT64}
    config = repo_config(tmp_path, "sqlite", "local")
    oracle = SqliteOnlineStore()
    oracle.update(config, [], [view], [], [], partial=False)
    oracle.online_write_batch(config, view, _convert_arrow_to_proto(table, view, join_keys), None)
    assert sorted(arrow_rows(table, view, join_keys)) == db_rows(
        str(tmp_path / "online.db"), view.name
    )
