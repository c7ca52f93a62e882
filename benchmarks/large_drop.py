"""The memory bound of one large drop: peak RSS of ingesting, validating (the blocking GX check)
and publishing one flights day from a drop folder, of building its feature tables, and of
materializing it into the online store, at 1x, 10x, 100x and 1000x a normal day's rows.

    .venv/bin/python -m benchmarks.large_drop                     # the table (5 runs per scale)
    .venv/bin/python -m benchmarks.large_drop --scales 1 10 --repeats 3
    .venv/bin/python -m benchmarks.large_drop run --drops FOLDER  # one measure (one JSON line)

A scaled day is a real one (2013-01-02, 943 flights) repeated: copy k of a flight gets a tail
number with k in front (two base-36 characters, so up to 1296 copies), and the flights are
numbered anew within each carrier and scheduled time, so natural keys stay unique and the day
validates as the real one does. The drop is a CSV file, as `tests/conftest.py` writes them
(timestamps in ISO-8601 with a `Z`), beside the dimension tables.

Each measure is a fresh process (`benchmarks.harness.measure`) that loads the dimension tables,
publishes the real day before (PREVIOUS_DAY, for the history) and both days' weather into a
temporary lake and Dagster home, notes its peak RSS (the floor: Python, Dagster, GX, pandas
imported and warmed), then materializes `raw_flights`, the `flights_contract` check and
`publish_flights` (`validated_flights`, `quarantined_flights`) in process, as `make run` does
(in_process executor, GX Data Docs built), and notes its peak RSS (VmHWM). Each later stage
starts by setting the high-water mark back to the RSS of the moment, and its peak is noted:
the features (the day's `flight_features`, `flight_outcomes` and `aircraft_features`, and the
delay histories of the day after, whose 28-day window holds the large day), then the online
store (`feature_registry` applied, which imports Feast, then the day's `online_features`).
"""

import argparse
import datetime as dt
import json
import platform
import statistics
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

from assets import asset_key
from benchmarks.harness import REPEATS, measure

DAY = "2013-01-02"
PREVIOUS_DAY = "2013-01-01"
NEXT_DAY = "2013-01-03"
FEATURES = ("flight_features", "flight_outcomes", "aircraft_features")
WEATHER = ("raw_weather", "validated_weather", "quarantined_weather", "weather_features")
HISTORIES = ("carrier_history", "route_history")
SCALES = (1, 10, 100, 1000)
RESULTS = Path(__file__).parent / "results" / "large_drop.json"


def scaled_day(copies: int, day: str = DAY):
    """The flights of `day` (YYYY-MM-DD), `copies` times, with distinct natural keys."""
    import pandas as pd

    from usecases.flights.contracts import FLIGHTS
    from usecases.flights.source import BundledFlightsSource

    raw = BundledFlightsSource().read_day(
        "flights", dt.date.fromisoformat(day), timestamp_columns=FLIGHTS.timestamp_columns
    )
    frame = raw.frame.reset_index(drop=True)
    if copies == 1:
        return frame
    parts = [frame]
    for k in range(1, copies):
        copy = frame.copy()
        copy["tailnum"] = _base36(k) + copy["tailnum"].str[-5:]
        parts.append(copy)
    scaled = pd.concat(parts, ignore_index=True)
    # Flights numbered anew within each carrier and scheduled time: the natural key stays unique
    # and the numbers stay far below the contract's largest.
    scaled["flight"] = scaled.groupby(["carrier", "sched_dep_time"]).cumcount() + 1
    duplicated = int(scaled.duplicated(list(FLIGHTS.natural_key)).sum())
    if duplicated:
        raise AssertionError(f"{copies}x: {duplicated} duplicate natural keys")
    return scaled


def _base36(k: int) -> str:
    """`k` (below 1296) as two characters of the tail numbers' alphabet."""
    digits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    return digits[k // 36] + digits[k % 36]


def write_drops(root: Path, copies: int) -> Path:
    """A drop folder: the dimension tables, PREVIOUS_DAY's flights and DAY's flights `copies`
    times, as CSV."""
    import pandas as pd

    from usecases.flights.contracts import FLIGHTS, WEATHER
    from usecases.flights.source import BundledFlightsSource

    source = BundledFlightsSource()

    def real(table: str, day: str) -> pd.DataFrame:
        contract = {"flights": FLIGHTS, "weather": WEATHER}[table]
        timestamps = contract.timestamp_columns
        return source.read_day(
            table, dt.date.fromisoformat(day), timestamp_columns=timestamps
        ).frame

    root.mkdir(parents=True)
    for table in ("airlines", "airports", "planes"):
        source.read_table(table).frame.to_csv(root / f"{table}.csv", index=False)
    drops = {
        ("flights", PREVIOUS_DAY): real("flights", PREVIOUS_DAY),
        ("flights", DAY): scaled_day(copies),
        ("weather", PREVIOUS_DAY): real("weather", PREVIOUS_DAY),
        ("weather", DAY): real("weather", DAY),
    }
    for (table, day), frame in drops.items():
        write_csv_drop(frame, root / table / f"{day}.csv")
    return root


def write_csv_drop(frame, path: Path) -> None:
    """`frame` as a CSV drop at `path` (its folder made): timestamps in ISO-8601 with a `Z`."""
    import pandas as pd

    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    path.parent.mkdir(exist_ok=True)
    frame.to_csv(path, index=False)


def run(drops: Path) -> dict:
    """One measure in this process: the floor, the day published, its features, the online
    store; peak RSS of each in MiB."""
    import dagster as dg

    from assets.features import feature_assets
    from assets.ingestion import dimension_assets
    from assets.validation import event_table_assets
    from pipelines.settings import Settings
    from resources.expectations import GreatExpectations
    from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
    from resources.lake import ParquetLake
    from resources.sources import DropFolderSource
    from usecases.flights import USE_CASE as FLIGHTS_CASE

    with tempfile.TemporaryDirectory(prefix="bench-large-drop-") as folder:
        home = Path(folder)
        lake = ParquetLake(root=str(home / "lake"))
        resources = {
            "flights_source": DropFolderSource(root=str(drops)),
            "lake": lake,
            "expectations": GreatExpectations(data_docs_dir=str(home / "data_docs")),
            "feature_store": FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(home)),
        }
        days_per_run = Settings.from_env().days_per_run
        definitions = [
            *dimension_assets(FLIGHTS_CASE),
            *event_table_assets(FLIGHTS_CASE, days_per_run),
            *feature_assets(FLIGHTS_CASE, days_per_run),
        ]
        (home / "dagster_home").mkdir()
        with dg.instance_for_test(temp_dir=str(home / "dagster_home")) as instance:

            def materialize(names: tuple[str, ...], partition: str | None) -> float:
                began = time.perf_counter()
                result = dg.materialize(
                    definitions,
                    selection=dg.AssetSelection.assets(*names),
                    partition_key=partition,
                    instance=instance,
                    resources=resources,
                )
                assert result.success
                return time.perf_counter() - began

            published = ("raw_flights", "validated_flights", "quarantined_flights")
            materialize(("airlines", "airports", "planes"), None)
            materialize(published, PREVIOUS_DAY)
            for day in (PREVIOUS_DAY, DAY):
                materialize(WEATHER, day)
            floor = _peak_rss_mib()
            seconds = materialize(published, DAY)
            peak = _peak_rss_mib()
            _reset_peak_rss()
            features_seconds = materialize(FEATURES, DAY) + materialize(HISTORIES, NEXT_DAY)
            features_peak = _peak_rss_mib()
            _reset_peak_rss()
            materialize(("feature_registry",), None)
            online_seconds = materialize(("online_features",), DAY)
            online_peak = _peak_rss_mib()
            published_file = lake.path_for(asset_key(FLIGHTS_CASE, "validated_flights"), DAY)
            checks = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(asset_key(FLIGHTS_CASE, "raw_flights"), "flights_contract"),
                limit=1,
            )
            assert checks and checks[0].status.value == "SUCCEEDED", "the day did not validate"
            return {
                "floor_rss_mib": floor,
                "peak_rss_mib": peak,
                "seconds": seconds,
                "published_bytes": Path(str(published_file)).stat().st_size,
                "features_peak_rss_mib": features_peak,
                "features_seconds": features_seconds,
                "online_peak_rss_mib": online_peak,
                "online_seconds": online_seconds,
            }


def _peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, the high-water mark of its own memory map. Not
    ru_maxrss, which Linux carries over from the parent through fork and exec (the parent that
    built a 100x drop would set every child's floor)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def _reset_peak_rss() -> None:
    """Set this process's VmHWM back to its current RSS (Linux: "5" to clear_refs), so the next
    stage's peak is its own."""
    Path("/proc/self/clear_refs").write_text("5")


def table(scales: list[int], repeats: int) -> list[dict]:
    """Every scale measured `repeats` times in fresh processes; one row per scale (medians)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-large-drops-") as folder:
        for copies in scales:
            drops = write_drops(Path(folder) / f"{copies}x", copies)
            drop = drops / "flights" / f"{DAY}.csv"
            samples = measure(
                ["-m", "benchmarks.large_drop", "run", "--drops", str(drops)], repeats
            )

            def med(key: str, samples: list[dict] = samples) -> float:
                return statistics.median(s[key] for s in samples)

            def span(key: str, samples: list[dict] = samples) -> list[float]:
                return [min(s[key] for s in samples), max(s[key] for s in samples)]

            rows.append(
                {
                    "scale": copies,
                    "rows": sum(1 for _ in drop.open()) - 1,
                    "drop_bytes": drop.stat().st_size,
                    "published_bytes": samples[0]["published_bytes"],
                    "floor_rss_mib": med("floor_rss_mib"),
                    "peak_rss_mib": med("peak_rss_mib"),
                    "peak_rss_range_mib": span("peak_rss_mib"),
                    "seconds": med("seconds"),
                    "features_peak_rss_mib": med("features_peak_rss_mib"),
                    "features_peak_rss_range_mib": span("features_peak_rss_mib"),
                    "features_seconds": med("features_seconds"),
                    "online_peak_rss_mib": med("online_peak_rss_mib"),
                    "online_peak_rss_range_mib": span("online_peak_rss_mib"),
                    "online_seconds": med("online_seconds"),
                    "repeats": repeats,
                }
            )
    return rows


def report(rows: list[dict]) -> str:
    lines = [
        f"{'scale':>5} {'rows':>8} {'drop bytes':>12} {'published':>11} {'floor MiB':>9}"
        f" {'peak MiB':>9} {'day MiB':>8} {'seconds':>8} {'features MiB':>12} {'seconds':>8}"
        f" {'online MiB':>10} {'seconds':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r['scale']:>4}x {r['rows']:>8,} {r['drop_bytes']:>12,} {r['published_bytes']:>11,}"
            f" {r['floor_rss_mib']:>9.0f} {r['peak_rss_mib']:>9.0f}"
            f" {r['peak_rss_mib'] - r['floor_rss_mib']:>8.0f} {r['seconds']:>8.1f}"
            f" {r['features_peak_rss_mib']:>12.0f} {r['features_seconds']:>8.1f}"
            f" {r['online_peak_rss_mib']:>10.0f} {r['online_seconds']:>8.1f}"
        )
    first, last = rows[0], rows[-1]
    if last is not first:
        lines.append(
            f"peak RSS {last['scale']}x ÷ {first['scale']}x:"
            f" {last['peak_rss_mib'] / first['peak_rss_mib']:.2f}; features"
            f" {last['features_peak_rss_mib'] / first['features_peak_rss_mib']:.2f}; online"
            f" {last['online_peak_rss_mib'] / first['online_peak_rss_mib']:.2f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["table", "run"], default="table")
    parser.add_argument("--drops", type=Path, help="run: the drop folder of one measure")
    parser.add_argument("--scales", type=int, nargs="+", default=list(SCALES))
    parser.add_argument("--repeats", type=int, default=REPEATS)
    args = parser.parse_args()
    if args.command == "run":
        sys.stdout.write(json.dumps(run(args.drops)) + "\n")
        return
    rows = table(args.scales, args.repeats)
    sys.stdout.write(report(rows) + "\n")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "measured_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "python": platform.python_version(),
                "versions": {p: version(p) for p in ("dagster", "great_expectations", "pandas")},
                "rows": rows,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
