"""The memory bound of one large drop: peak RSS of ingesting, validating (the blocking GX check)
and publishing one flights day from a drop folder, at 1x, 10x, 100x and 1000x a normal day's
rows.

    .venv/bin/python -m benchmarks.large_drop                     # the table (5 runs per scale)
    .venv/bin/python -m benchmarks.large_drop --scales 1 10 --repeats 3
    .venv/bin/python -m benchmarks.large_drop run --drops FOLDER  # one measure (one JSON line)

A scaled day is a real one (2013-01-02, 943 flights) repeated: copy k of a flight gets a tail
number with k in front (two base-36 characters, so up to 1296 copies), and the flights are
numbered anew within each carrier and scheduled time, so natural keys stay unique and the day
validates as the real one does. The drop is a CSV file, as `tests/conftest.py` writes them
(timestamps in ISO-8601 with a `Z`), beside the dimension tables.

Each measure is a fresh process (`benchmarks.harness.measure`) that loads the dimension tables
into a temporary lake and Dagster home, notes its peak RSS (the floor: Python, Dagster, GX, pandas
imported and warmed), then materializes `raw_flights`, the `flights_contract` check and
`publish_flights` (`validated_flights`, `quarantined_flights`) in process, as `make run` does
(in_process executor, GX Data Docs built), and reports its peak RSS (VmHWM) after.
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

from benchmarks.harness import REPEATS, measure

DAY = "2013-01-02"
SCALES = (1, 10, 100, 1000)
RESULTS = Path(__file__).parent / "results" / "large_drop.json"


def scaled_day(copies: int):
    """The flights of DAY, `copies` times, with distinct natural keys."""
    import pandas as pd

    from assets.contracts import FLIGHTS
    from resources.sources import BundledFlightsSource

    day = BundledFlightsSource().read_day(
        "flights", dt.date.fromisoformat(DAY), timestamp_columns=FLIGHTS.timestamp_columns
    )
    frame = day.frame.reset_index(drop=True)
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
    """A drop folder: the dimension tables and DAY's flights `copies` times, as CSV."""
    import pandas as pd

    from resources.sources import BundledFlightsSource

    root.mkdir(parents=True)
    for table in ("airlines", "airports", "planes"):
        BundledFlightsSource().read_table(table).frame.to_csv(root / f"{table}.csv", index=False)
    frame = scaled_day(copies)
    for column in frame.columns:
        if isinstance(frame[column].dtype, pd.DatetimeTZDtype):
            frame[column] = frame[column].dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    (root / "flights").mkdir()
    frame.to_csv(root / "flights" / f"{DAY}.csv", index=False)
    return root


def run(drops: Path) -> dict:
    """One measure in this process: the floor, then the day; peak RSS of both in MiB."""
    import dagster as dg

    from assets import ingestion, validation
    from resources.expectations import GreatExpectations
    from resources.lake import ParquetLake
    from resources.sources import DropFolderSource

    with tempfile.TemporaryDirectory(prefix="bench-large-drop-") as folder:
        home = Path(folder)
        lake = ParquetLake(root=str(home / "lake"))
        resources = {
            "source": DropFolderSource(root=str(drops)),
            "lake": lake,
            "expectations": GreatExpectations(data_docs_dir=str(home / "data_docs")),
        }
        definitions = [
            *dg.load_assets_from_modules([ingestion, validation]),
            *dg.load_asset_checks_from_modules([validation]),
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

            materialize(("airlines", "airports", "planes"), None)
            floor = _peak_rss_mib()
            seconds = materialize(("raw_flights", "validated_flights", "quarantined_flights"), DAY)
            peak = _peak_rss_mib()
            published = lake.path_for(dg.AssetKey("validated_flights"), DAY)
            checks = instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(dg.AssetKey("raw_flights"), "flights_contract"), limit=1
            )
            assert checks and checks[0].status.value == "SUCCEEDED", "the day did not validate"
            return {
                "floor_rss_mib": floor,
                "peak_rss_mib": peak,
                "seconds": seconds,
                "published_bytes": Path(str(published)).stat().st_size,
            }


def _peak_rss_mib() -> float:
    """This process's peak RSS: VmHWM, the high-water mark of its own memory map. Not
    ru_maxrss, which Linux carries over from the parent through fork and exec (the parent that
    built a 100x drop would set every child's floor)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


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

            rows.append(
                {
                    "scale": copies,
                    "rows": sum(1 for _ in drop.open()) - 1,
                    "drop_bytes": drop.stat().st_size,
                    "published_bytes": samples[0]["published_bytes"],
                    "floor_rss_mib": med("floor_rss_mib"),
                    "peak_rss_mib": med("peak_rss_mib"),
                    "peak_rss_range_mib": [
                        min(s["peak_rss_mib"] for s in samples),
                        max(s["peak_rss_mib"] for s in samples),
                    ],
                    "seconds": med("seconds"),
                    "repeats": repeats,
                }
            )
    return rows


def report(rows: list[dict]) -> str:
    lines = [
        f"{'scale':>5} {'rows':>8} {'drop bytes':>12} {'published':>11} {'floor MiB':>9}"
        f" {'peak MiB':>9} {'day MiB':>8} {'seconds':>8}"
    ]
    for r in rows:
        lines.append(
            f"{r['scale']:>4}x {r['rows']:>8,} {r['drop_bytes']:>12,} {r['published_bytes']:>11,}"
            f" {r['floor_rss_mib']:>9.0f} {r['peak_rss_mib']:>9.0f}"
            f" {r['peak_rss_mib'] - r['floor_rss_mib']:>8.0f} {r['seconds']:>8.1f}"
        )
    first, last = rows[0], rows[-1]
    if last is not first:
        lines.append(
            f"peak RSS {last['scale']}x ÷ {first['scale']}x:"
            f" {last['peak_rss_mib'] / first['peak_rss_mib']:.2f}"
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
