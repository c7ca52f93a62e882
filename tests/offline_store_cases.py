"""The cases every offline store of the project passes, through Feast's own API on a real repo in
a temporary folder: the DuckDB ASOF store (tests/unit/test_offline_duckdb.py) and the Spark
store (tests/integration/test_offline_spark.py) each bind `repo` and import the `test_*`
functions, so one body checks both engines.

Point-in-time retrieval is checked against a brute-force pure-Python reference on random data
(ties on the feature timestamp, duplicate entity rows, keys without features, TTL and no-TTL
views, a two-key view, a field mapping, a join key map, mixed time zones)."""

import math
import warnings
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

T0 = pd.Timestamp("2013-01-01", tz="UTC")
SPAN = pd.Timedelta(days=10)
ORIGINS = ["EWR", "JFK", "LGA"]
CARRIERS = ["AA", "B6", "DL", "EV", "UA", "WN"]
TAILS = [f"N{i:03d}" for i in range(1, 31)]
MISSING = {"origin": "XXX", "carrier": "ZZ", "tail": "N000", "tailnum": "N000"}  # no features
EVENT = "event_time"  # not `event_timestamp`: the store must infer the single datetime column


@dataclass(frozen=True)
class ViewSpec:
    """One feature view as the reference sees it: in source columns, as UTC microseconds."""

    name: str
    source_keys: tuple[str, ...]  # in the written Parquet
    join_keys: tuple[str, ...]  # of the view's entities, as online lookups name them
    entity_keys: tuple[str, ...]  # in the entity dataframe of the feature service
    ts: str
    created: str | None
    features: dict[str, str]  # feature name -> source column
    ttl: timedelta | None = None  # None or zero: no lower bound


SPECS = [
    ViewSpec(
        "weather",
        ("airport",),
        ("origin",),
        ("origin",),
        "time_hour",
        "loaded_at",
        {"temp": "temperature", "wind": "wind", "observed_at": "observed_at"},
        timedelta(hours=3),
    ),
    ViewSpec(
        "carrier_daily", ("carrier",), ("carrier",), ("carrier",), "day", None, {"delay": "delay"}
    ),
    ViewSpec(
        "route",
        ("origin", "carrier"),
        ("origin", "carrier"),
        ("origin", "carrier"),
        "ts",
        "created",
        {"n_flights": "n_flights", "route_at": "route_at"},
        timedelta(days=2),
    ),
    ViewSpec("plane", ("tailnum",), ("tailnum",), ("tail",), "updated", None, {"seats": "seats"}),
]


@dataclass
class Repo:
    store: Any  # feast.FeatureStore, entity timestamps coerced to UTC by Feast
    raw_store: Any  # the same repo with coerce_tz_aware=False: the store sees them untouched
    service: Any
    data: Path
    odfv_name: str


def build_repo(root: Path, offline_store: Any, batch_engine: Any = None) -> Repo:
    """A Feast repo in `root` over random feature tables, reading them with `offline_store`
    (and materializing with `batch_engine`, None: Feast's local engine)."""
    from feast import (
        Entity,
        FeatureService,
        FeatureStore,
        FeatureView,
        Field,
        FileSource,
        RepoConfig,
        ValueType,
    )
    from feast.infra.online_stores.sqlite import SqliteOnlineStoreConfig
    from feast.on_demand_feature_view import on_demand_feature_view
    from feast.types import Float64, Int64, String, UnixTimestamp

    data = root / "data"
    for folder in ("carrier_daily", "route", "empty"):
        (data / folder).mkdir(parents=True)
    write_feature_data(data, seed=0)

    origin = Entity(name="airport", join_keys=["origin"], value_type=ValueType.STRING)
    carrier = Entity(name="carrier", join_keys=["carrier"], value_type=ValueType.STRING)
    plane = Entity(name="plane", join_keys=["tailnum"], value_type=ValueType.STRING)
    weather = FeatureView(
        name="weather",
        entities=[origin],
        ttl=timedelta(hours=3),
        schema=[
            Field(name="origin", dtype=String),
            Field(name="temp", dtype=Float64),
            Field(name="wind", dtype=Int64),
            Field(name="observed_at", dtype=UnixTimestamp),
        ],
        source=FileSource(
            name="weather_source",
            path="weather.parquet",  # relative: resolved against the store's `root`
            timestamp_field="time_hour",
            created_timestamp_column="loaded_at",
            field_mapping={"temperature": "temp", "airport": "origin"},
        ),
    )
    carrier_daily = FeatureView(
        name="carrier_daily",
        entities=[carrier],
        ttl=None,
        schema=[Field(name="carrier", dtype=String), Field(name="delay", dtype=Float64)],
        source=FileSource(name="carrier_source", path="carrier_daily", timestamp_field="day"),
    )
    route = FeatureView(
        name="route",
        entities=[origin, carrier],
        ttl=timedelta(days=2),
        schema=[
            Field(name="origin", dtype=String),
            Field(name="carrier", dtype=String),
            Field(name="n_flights", dtype=Int64),
            Field(name="route_at", dtype=UnixTimestamp),
        ],
        source=FileSource(
            name="route_source",
            path=str(data / "route" / "part-*.parquet"),  # an absolute glob
            timestamp_field="ts",
            created_timestamp_column="created",
        ),
    )
    planes = FeatureView(
        name="plane",
        entities=[plane],
        ttl=timedelta(0),
        schema=[Field(name="tailnum", dtype=String), Field(name="seats", dtype=Int64)],
        source=FileSource(name="plane_source", path="planes.parquet", timestamp_field="updated"),
    )
    empty = FeatureView(
        name="empty_view",
        entities=[origin],
        ttl=None,
        schema=[Field(name="origin", dtype=String), Field(name="gusts", dtype=Float64)],
        source=FileSource(name="empty_source", path="empty", timestamp_field="ts"),
    )
    missing = FeatureView(
        name="missing_view",
        entities=[origin],
        ttl=None,
        schema=[Field(name="origin", dtype=String), Field(name="visib", dtype=Float64)],
        source=FileSource(name="missing_source", path="does_not_exist", timestamp_field="ts"),
    )

    @on_demand_feature_view(
        sources=[weather], schema=[Field(name="temp_f", dtype=Float64)], mode="pandas"
    )
    def temp_f(inputs: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"temp_f": inputs["temp"] * 1.8 + 32})

    service = FeatureService(
        name="training_v1",
        features=[weather, carrier_daily, route, planes.with_join_key_map({"tailnum": "tail"})],
    )

    def config(coerce: bool) -> RepoConfig:
        return RepoConfig(
            project="offline_duckdb_test",
            provider="local",
            registry=str(root / "registry.db"),
            online_store=SqliteOnlineStoreConfig(path=str(root / "online.db")),
            offline_store=offline_store,
            **({"batch_engine": batch_engine} if batch_engine is not None else {}),
            entity_key_serialization_version=3,
            repo_path=root,
            coerce_tz_aware=coerce,
        )

    store = FeatureStore(config=config(coerce=True))
    views = [weather, carrier_daily, route, planes, empty, missing, temp_f]
    with warnings.catch_warnings():
        # Feast flags every on-demand view as experimental; this one is here on purpose.
        warnings.filterwarnings("ignore", "On demand feature view", RuntimeWarning)
        store.apply([origin, carrier, plane, *views, service])
    return Repo(store, FeatureStore(config=config(coerce=False)), service, data, "temp_f")


def write_feature_data(data: Path, seed: int) -> dict[str, pd.DataFrame]:
    """Random feature tables, written where the views read them; returned in source columns."""
    rng = np.random.default_rng(seed)

    def unique_created(ts: pd.Series) -> pd.Series:
        # A permutation: rows that tie on (keys, ts) never tie on the created timestamp too.
        return ts + pd.to_timedelta(rng.permutation(len(ts)), unit="s")

    n = 600
    # Half-hour grid with gaps: ties on (airport, time_hour) and stretches longer than the TTL.
    time_hour = T0 + pd.to_timedelta(rng.integers(0, 480, n) * 30, unit="min")
    weather = pd.DataFrame(
        {
            "airport": rng.choice(ORIGINS, n),
            "time_hour": time_hour,
            "loaded_at": unique_created(pd.Series(time_hour)),
            "temperature": rng.normal(5, 10, n).round(2),
            "wind": rng.integers(0, 40, n),
            "observed_at": time_hour,
        }
    )
    weather.to_parquet(data / "weather.parquet")

    carrier_rows = []
    for carrier in CARRIERS:
        hours = rng.choice(240, size=25, replace=False)  # unique per key: no created column
        carrier_rows.append(
            pd.DataFrame(
                {
                    "carrier": carrier,
                    # Naive timestamps: UTC by convention.
                    "day": (T0 + pd.to_timedelta(hours, unit="h")).tz_convert(None),
                    "delay": np.where(rng.random(25) < 0.1, np.nan, rng.normal(10, 5, 25)),
                }
            )
        )
    carrier_daily = pd.concat(carrier_rows, ignore_index=True)
    shuffled = carrier_daily.sample(frac=1, random_state=seed)
    for i in range(3):
        shuffled.iloc[i::3].to_parquet(data / "carrier_daily" / f"{i}.parquet")

    m = 500
    ts = (T0 + pd.to_timedelta(rng.integers(0, 40, m) * 6, unit="h")).tz_convert("America/New_York")
    route = pd.DataFrame(
        {
            "origin": rng.choice(ORIGINS, m),
            "carrier": rng.choice(CARRIERS, m),
            "ts": ts,
            "created": unique_created(pd.Series(ts)),
            "n_flights": rng.integers(0, 100, m),
            "route_at": ts,
        }
    )
    for i in range(2):
        route.iloc[i::2].to_parquet(data / "route" / f"part-{i}.parquet")

    plane_rows = [
        pd.DataFrame(
            {
                "tailnum": tail,
                "updated": (
                    T0 + pd.to_timedelta(rng.choice(240, 4, replace=False), unit="h")
                ).tz_convert(None),
                "seats": rng.integers(50, 300, 4),
            }
        )
        for tail in TAILS
    ]
    planes = pd.concat(plane_rows, ignore_index=True)
    planes.to_parquet(data / "planes.parquet")
    return {"weather": weather, "carrier_daily": carrier_daily, "route": route, "plane": planes}


def entity_frame(seed: int, tables: dict[str, pd.DataFrame], n: int = 3000) -> pd.DataFrame:
    """Random entity rows with duplicates, missing keys and events on the window's edges."""
    rng = np.random.default_rng(1000 + seed)
    micros = rng.integers(-86_400_000_000, 11 * 86_400_000_000, n)
    frame = pd.DataFrame(
        {
            "origin": rng.choice([*ORIGINS, MISSING["origin"]], n, p=[0.3, 0.3, 0.3, 0.1]),
            "carrier": rng.choice([*CARRIERS, MISSING["carrier"]], n),
            "tail": rng.choice([*TAILS, MISSING["tail"]], n),
            EVENT: T0 + pd.to_timedelta(micros, unit="us"),
        }
    )
    # Events exactly at a feature timestamp (inclusive upper bound) and exactly a TTL after one
    # (inclusive lower bound).
    edges = tables["weather"].sample(200, random_state=seed)
    frame.loc[:199, "origin"] = edges["airport"].to_numpy()
    frame.loc[:99, EVENT] = edges["time_hour"].iloc[:100].to_numpy()
    frame.loc[100:199, EVENT] = (edges["time_hour"].iloc[100:] + pd.Timedelta(hours=3)).to_numpy()
    duplicates = frame.sample(n // 10, random_state=seed)
    frame = pd.concat([frame, duplicates]).sample(frac=1, random_state=seed)
    return frame.reset_index(drop=True).assign(row=np.arange(len(frame)))


def micros_utc(values: pd.Series) -> np.ndarray:
    return pd.to_datetime(values, utc=True).dt.as_unit("us").astype("int64").to_numpy()


def reference(spec: ViewSpec, table: pd.DataFrame, entities: pd.DataFrame) -> dict[str, list]:
    """Brute force: for each entity row, the latest feature row with equal keys and
    `event - ttl <= ts <= event`; among equal timestamps the latest created one."""
    ts = micros_utc(table[spec.ts])
    created = micros_utc(table[spec.created]) if spec.created else np.zeros(len(table), "int64")
    by_key: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)
    keys = zip(*(table[k] for k in spec.source_keys), strict=True)
    for i, key in enumerate(keys):
        by_key[key].append((int(ts[i]), int(created[i]), i))
    ttl_us = spec.ttl // timedelta(microseconds=1) if spec.ttl else None
    events = micros_utc(entities[EVENT])
    picks = []
    entity_keys = zip(*(entities[k] for k in spec.entity_keys), strict=True)
    for event, key in zip(events, entity_keys, strict=True):
        candidates = [
            row
            for row in by_key.get(key, [])
            if row[0] <= event and (ttl_us is None or row[0] >= event - ttl_us)
        ]
        picks.append(max(candidates)[2] if candidates else None)
    return {
        feature: [None if p is None else table[column].iloc[p] for p in picks]
        for feature, column in spec.features.items()
    }


def same(actual: Any, expected: Any) -> bool:
    if expected is None or (isinstance(expected, float) and math.isnan(expected)):
        return (
            actual is None or actual is pd.NaT or (isinstance(actual, float) and math.isnan(actual))
        )
    if isinstance(expected, pd.Timestamp):
        return pd.Timestamp(actual) == expected
    return actual == pytest.approx(expected)


@pytest.mark.parametrize(
    ("seed", "zone", "full_names"),
    [(1, None, False), (2, "America/Chicago", True), (3, "Asia/Kolkata", False)],
)
def test_point_in_time_join_matches_brute_force(
    repo: Repo, seed: int, zone: str | None, full_names: bool
):
    tables = write_feature_data(repo.data, seed)
    entities = entity_frame(seed, tables)
    entities[EVENT] = (
        entities[EVENT].dt.tz_convert(zone) if zone else entities[EVENT].dt.tz_convert(None)
    )
    # Naive events reach the store as they are; aware ones after Feast's own UTC coercion.
    store = repo.raw_store if zone is None else repo.store

    job = store.get_historical_features(
        entity_df=entities, features=repo.service, full_feature_names=full_names
    )
    result = job.to_df()

    pd.testing.assert_frame_equal(job.to_arrow().to_pandas(), result)
    assert len(result) == len(entities)
    assert result["row"].tolist() == entities["row"].tolist()
    for column in ("origin", "carrier", "tail"):
        assert result[column].tolist() == entities[column].tolist()
    assert (
        pd.to_datetime(result[EVENT], utc=True) == pd.to_datetime(entities[EVENT], utc=True)
    ).all()
    if zone is None:
        assert result[EVENT].dt.tz is None  # the entity frame's own column, not a UTC copy
    events = pd.to_datetime(entities[EVENT], utc=True)
    for spec in SPECS:
        expected = reference(spec, tables[spec.name], entities)
        for feature, values in expected.items():
            column = f"{spec.name}__{feature}" if full_names else feature
            actual = result[column].tolist()
            wrong = [
                i for i, (a, e) in enumerate(zip(actual, values, strict=True)) if not same(a, e)
            ]
            assert not wrong, f"{column}: {len(wrong)} rows differ, first {wrong[:5]}"
            assert any(v is not None and v == v for v in values), f"{column}: never matched"
            assert any(v is None for v in values), f"{column}: never missing"

    for spec, stamp in ((SPECS[0], "observed_at"), (SPECS[2], "route_at")):
        seen = pd.to_datetime(result[f"{spec.name}__{stamp}" if full_names else stamp], utc=True)
        found = seen.notna()
        assert (seen[found] <= events[found]).all(), "a feature from after its event"
        assert spec.ttl is not None
        assert (seen[found] >= events[found] - spec.ttl).all(), "a feature older than the TTL"
        # Rows whose latest feature is older than the TTL are kept, with null features.
        stale = pd.Series(reference(replace(spec, ttl=None), tables[spec.name], entities)[stamp])
        assert (stale.notna() & ~found).any()


def test_materialize_writes_the_latest_row_per_entity_in_the_range(repo: Repo):
    tables = write_feature_data(repo.data, seed=7)
    start, end = T0 + pd.Timedelta(days=2), T0 + pd.Timedelta(days=6)
    # A row exactly at the end, created last: the range is inclusive at both ends.
    weather = tables["weather"]
    boundary = weather.iloc[[0]].assign(
        airport="EWR", time_hour=end, loaded_at=end + pd.Timedelta(days=1), temperature=99.5
    )
    tables["weather"] = pd.concat([weather, boundary], ignore_index=True)
    tables["weather"].to_parquet(repo.data / "weather.parquet")

    repo.store.materialize(
        start.to_pydatetime(), end.to_pydatetime(), feature_views=["weather", "route", "plane"]
    )

    for spec, feature in ((SPECS[0], "temp"), (SPECS[2], "n_flights"), (SPECS[3], "seats")):
        table = tables[spec.name].assign(__ts=lambda t, c=spec.ts: pd.to_datetime(t[c], utc=True))
        inside = table[(table["__ts"] >= start) & (table["__ts"] <= end)]
        latest = inside.sort_values(["__ts", spec.created or "__ts"]).groupby(
            list(spec.source_keys)
        )
        latest = latest.tail(1)
        rows = [
            dict(zip(spec.join_keys, key, strict=True))
            for key in latest[list(spec.source_keys)].itertuples(index=False)
        ]
        rows.append({k: MISSING[k] for k in spec.join_keys})

        online = repo.store.get_online_features(
            features=[f"{spec.name}:{feature}"], entity_rows=rows
        ).to_dict()

        assert online[feature][:-1] == pytest.approx(latest[spec.features[feature]].tolist())
        assert online[feature][-1] is None
    assert (
        99.5
        in repo.store.get_online_features(
            features=["weather:temp"], entity_rows=[{"origin": "EWR"}]
        ).to_dict()["temp"]
    )


def test_an_empty_source_directory_reads_as_an_empty_table(repo: Repo):
    entities = pd.DataFrame({"origin": ["EWR", "JFK"], EVENT: [T0, T0 + SPAN]})

    result = repo.store.get_historical_features(
        entity_df=entities, features=["empty_view:gusts", "weather:temp"]
    ).to_df()

    assert len(result) == 2
    assert result["gusts"].isna().all()


def test_a_missing_source_path_names_the_view_and_the_path(repo: Repo):
    entities = pd.DataFrame({"origin": ["EWR"], EVENT: [T0]})

    with pytest.raises(FileNotFoundError, match=r"missing_view.*does_not_exist"):
        repo.store.get_historical_features(entity_df=entities, features=["missing_view:visib"])
