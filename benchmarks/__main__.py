"""`make bench`: measure every ratio, print one table, write benchmarks/results/latest.json."""

import datetime as dt
import json
import platform
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from benchmarks.harness import Ratio, as_json, measure, median

RESULTS = Path(__file__).parent / "results" / "latest.json"
VALIDATION_SIZES = (336_776, 1_000_000)


def p1_load_time() -> Ratio:
    measure(["-m", "benchmarks.load_time", "code_location"], repeats=1)  # warm the file cache
    location = median(measure(["-m", "benchmarks.load_time", "code_location"]), "seconds")
    dagster = median(measure(["-m", "benchmarks.load_time", "dagster"]), "seconds")
    value = location / dagster
    return Ratio.judged(
        "P1", "code-location load ÷ `import dagster`", location, dagster, value, "<= 1.5"
    )


def p3_validation(rows: int) -> Ratio:
    argv = ["-m", "benchmarks.validation_speed"]
    gx = median(measure([*argv, "gx", "--rows", str(rows)]), "seconds")
    pandas = median(measure([*argv, "pandas", "--rows", str(rows)]), "seconds")
    value = pandas / gx  # rows/s of GX ÷ rows/s of pandas, same rows
    return Ratio.judged(
        "P3", f"GX rows/s ÷ hand-written pandas rows/s ({rows:,} rows)", gx, pandas, value, ">= 0.5"
    )


def p4_retrieval(home: Path) -> Ratio:
    argv = ["-m", "benchmarks.feast_retrieval"]
    feast = median(measure([*argv, "feast", "--home", str(home)]), "seconds")
    native = median(measure([*argv, "duckdb", "--home", str(home)]), "seconds")
    value = native / feast  # rows/s through Feast ÷ rows/s of the native query, same rows
    return Ratio.judged(
        "P4", "Feast retrieval ÷ native DuckDB ASOF JOIN (the year)", feast, native, value, ">= 0.5"
    )


def p5_materialization(home: Path) -> Ratio:
    argv = ["-m", "benchmarks.feast_materialize"]
    feast = measure([*argv, "feast", "--home", str(home)])
    floor = measure([*argv, "sqlite", "--home", str(home)])
    values = feast[0]["values"]
    assert all(s["values"] == values for s in feast + floor), "both sides write the same rows"
    value = median(floor, "seconds") / median(feast, "seconds")  # values/s ÷ values/s
    return Ratio.judged(
        "P5",
        f"Feast materialize ÷ SQLite upserts ({values / 1e6:.2f}M values)",
        median(feast, "seconds"),
        median(floor, "seconds"),
        value,
        ">= 0.5",
    )


def main() -> None:
    ratios = [p1_load_time(), *(p3_validation(rows) for rows in VALIDATION_SIZES)]
    with tempfile.TemporaryDirectory(prefix="bench-features-") as home:
        # The year's feature tables, built once by the functions the assets call.
        subprocess.run(
            [sys.executable, "-m", "benchmarks.feature_data", str(Path(home) / "lake")],
            check=True,
            capture_output=True,
        )
        ratios.append(p4_retrieval(Path(home)))
        ratios.append(p5_materialization(Path(home)))
    print("id   ratio" + " " * 56 + "value   target          (numerator / denominator)")
    for ratio in ratios:
        print(ratio.row())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
                "versions": {
                    p: version(p)
                    for p in ("dagster", "great-expectations", "pandas", "feast", "duckdb")
                },
                "ratios": as_json(ratios),
            },
            indent=2,
        )
    )
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
