"""P15: the training set's point-in-time join on Apache Spark (`ENGINE=spark`): `local[2]` ÷
`local[1]` at 10x rows (it must scale with cores), and Spark ÷ DuckDB at 1x and 10x (reported:
on one machine DuckDB is expected to win).

    python -m benchmarks.spark_join prepare --scale 10 --home /tmp/p15-10x [--window FIRST LAST]
    python -m benchmarks.spark_join join --home /tmp/p15-10x --engine duckdb
    python -m benchmarks.spark_join join --home /tmp/p15-10x --engine spark --master local[1]

`prepare` writes the feature tables of the days `make run` processes (the training window and
its history lead-in, 59 days) under `<home>/lake`, built by the functions the assets call, each
day's flights `--scale` times (`benchmarks.large_drop.scaled_day`). `join` applies the flights'
Feast repository under `home` and times `FeastFeatureStore.historical_features` for every
labelled flight of those days (the entity rows a training set joins) through `flight_delay_v1`,
after a warm-up join of a thousand of them (the imports, the registry, and for Spark the JVM,
the session and its first plans). It prints one JSON line: `seconds`, `rows`, and the result's
`fingerprint` (`ml.dataset.fingerprint`), which is the same on every engine.
"""

import argparse
import datetime as dt
import json
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks.feast_retrieval import LABEL, SERVICE, entity_rows, feature_store
from benchmarks.feature_data import build
from benchmarks.lifecycle_scale import window_days
from ml.dataset import fingerprint
from resources.spark import SparkEngine


def join(home: Path, engine: str, master: str, extra: Sequence[str] = ()) -> dict:
    """Time the join of every labelled flight under `home` on `engine`."""
    store = feature_store(home)
    if engine == "spark":
        conf = SparkEngine(master=master, conf=dict(c.split("=", 1) for c in extra)).session_conf()
        store = store.model_copy(update={"spark_conf": conf})
    rows = entity_rows(home, store)
    store.historical_features(rows.head(1000), SERVICE)  # warm-up
    started = time.perf_counter()
    frame = store.historical_features(rows, SERVICE)
    seconds = time.perf_counter() - started
    assert len(frame) == len(rows)
    return {
        "engine": store.engine,
        "seconds": seconds,
        "rows": len(rows),
        "fingerprint": fingerprint(frame.drop(columns=[LABEL.label]))[:12],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("prepare", help="the feature tables of make run's days at --scale")
    made.add_argument("--scale", type=int, required=True)
    made.add_argument("--home", type=Path, required=True)
    made.add_argument("--window", nargs=2, type=dt.date.fromisoformat, metavar=("FIRST", "LAST"))
    joined = commands.add_parser("join", help="time the training set's join; one JSON line")
    joined.add_argument("--home", type=Path, required=True)
    joined.add_argument("--engine", choices=("duckdb", "spark"), required=True)
    joined.add_argument("--master", default="local[2]")
    joined.add_argument("--conf", action="append", default=[], help="KEY=VALUE, a Spark setting")
    args = parser.parse_args()
    if args.command == "prepare":
        window = tuple(args.window) if args.window else None
        print(json.dumps(build(args.home / "lake", window_days(window), args.scale)))
    else:
        print(json.dumps(join(args.home, args.engine, args.master, args.conf)))


if __name__ == "__main__":
    main()
