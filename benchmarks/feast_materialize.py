"""P5: Feast materialization (entity rows x features)/s ÷ raw SQLite upserts/s of the same rows,
on the first `--days` days of the year (all of it by default; `make bench` takes a quarter, 0.75M
values, which gives the same ratio in a quarter of the time).

    python -m benchmarks.feature_data HOME/lake                # once: the year's feature tables
    python -m benchmarks.feast_materialize feast  --home HOME [--days 90]
    python -m benchmarks.feast_materialize sqlite --home HOME [--days 90]

`feast` applies the project's repo under HOME and times `FeastFeatureStore.materialize` of the
days, as `online_features` calls it: every online view of `feature_repo/`, through the project's
DuckDB offline store, bulk SQLite online store and batch engine (`feature_store.yaml`). The
warm-up materializes the first day.

`sqlite` is the floor: the exact rows Feast wrote (entity key, feature name, serialized value,
value text, timestamps; read back from the online store after an untimed materialization) upserted
with Python's sqlite3 into tables with Feast's own DDL and indexes, one `INSERT ... ON CONFLICT
DO UPDATE` per table through `executemany` in one transaction, in the order Feast wrote them. It
serializes nothing while timed: a hand-written store would keep numbers as native SQLite values,
so Feast's value and key encoding count as Feast's cost.

Each prints one JSON line: `{"seconds": ..., "values": rows written}`.
"""

import argparse
import datetime as dt
import json
import sqlite3
import time
from pathlib import Path

from resources.feature_store import DEFAULT_REPO, FeastFeatureStore

YEAR = (dt.datetime(2013, 1, 1, 5, tzinfo=dt.UTC), dt.datetime(2014, 1, 1, 5, tzinfo=dt.UTC))
FIRST_DAY = (YEAR[0], YEAR[0] + dt.timedelta(days=1))
COLUMNS = "entity_key, feature_name, value, value_text, event_ts, created_ts"


def online_db(home: Path) -> Path:
    return home / "feast" / "online.db"


def materialized_store(home: Path) -> FeastFeatureStore:
    store = FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)).for_use_case("flights")
    store.apply()
    store.materialize(*FIRST_DAY)  # warm-up: imports, registry, connections, statement caches
    return store


def written_rows(db: Path) -> dict[str, tuple[str, list[tuple]]]:
    """Per online table: its DDL (table and indexes) and every row, in the order written."""
    with sqlite3.connect(db) as conn:
        tables = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
        ]
        out = {}
        for table in tables:
            ddl = ";\n".join(
                sql
                for (sql,) in conn.execute(
                    "SELECT sql FROM sqlite_master WHERE tbl_name = ? AND sql IS NOT NULL",
                    (table,),
                )
            )
            rows = conn.execute(f'SELECT {COLUMNS} FROM "{table}" ORDER BY rowid').fetchall()
            out[table] = (ddl, rows)
    return out


def period(days: int) -> tuple[dt.datetime, dt.datetime]:
    """The first `days` days of the year, New York days (05:00 UTC in winter)."""
    return YEAR[0], min(YEAR[1], YEAR[0] + dt.timedelta(days=days))


def time_feast(home: Path, days: int) -> dict:
    online_db(home).unlink(missing_ok=True)  # every measure writes into empty tables
    store = materialized_store(home)
    began = time.perf_counter()
    store.materialize(*period(days))
    seconds = time.perf_counter() - began
    values = sum(len(rows) for _, rows in written_rows(online_db(home)).values())
    return {"seconds": seconds, "values": values}


def time_sqlite(home: Path, days: int) -> dict:
    if not online_db(home).exists():
        materialized_store(home).materialize(*period(days))  # untimed: the rows Feast writes
    tables = written_rows(online_db(home))
    floor = home / "floor.db"
    floor.unlink(missing_ok=True)
    with sqlite3.connect(floor) as conn:
        for ddl, _ in tables.values():
            conn.executescript(ddl)
        upserts = {
            table: (
                f'INSERT INTO "{table}" ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT'
                " (entity_key, feature_name) DO UPDATE SET value = excluded.value,"
                " value_text = excluded.value_text, event_ts = excluded.event_ts,"
                " created_ts = excluded.created_ts"
            )
            for table in tables
        }
        with conn:  # warm-up: the first rows of each table
            for table, (_, rows) in tables.items():
                conn.executemany(upserts[table], rows[:1000])
        began = time.perf_counter()
        with conn:
            for table, (_, rows) in tables.items():
                conn.executemany(upserts[table], rows)
        seconds = time.perf_counter() - began
    return {"seconds": seconds, "values": sum(len(rows) for _, rows in tables.values())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("impl", choices=["feast", "sqlite"])
    parser.add_argument("--home", type=Path, required=True)
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    timed = time_feast if args.impl == "feast" else time_sqlite
    result = timed(args.home, args.days)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
