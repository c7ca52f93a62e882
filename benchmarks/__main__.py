"""`make bench`: measure every ratio, print one table, write benchmarks/results/latest.json."""

import datetime as dt
import json
import platform
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
    return Ratio(
        "P1",
        "code-location load ÷ `import dagster`",
        location,
        dagster,
        "s",
        "<= 1.5",
        value,
        value <= 1.5,
    )


def p3_validation(rows: int) -> Ratio:
    argv = ["-m", "benchmarks.validation_speed"]
    gx = median(measure([*argv, "gx", "--rows", str(rows)]), "seconds")
    pandas = median(measure([*argv, "pandas", "--rows", str(rows)]), "seconds")
    value = pandas / gx  # rows/s of GX ÷ rows/s of pandas, same rows
    return Ratio(
        "P3",
        f"GX rows/s ÷ hand-written pandas rows/s ({rows:,} rows)",
        gx,
        pandas,
        "s",
        ">= 0.5",
        value,
        value >= 0.5,
    )


def main() -> None:
    ratios = [p1_load_time(), *(p3_validation(rows) for rows in VALIDATION_SIZES)]
    print("id   ratio" + " " * 56 + "value   target          (numerator / denominator)")
    for ratio in ratios:
        print(ratio.row())
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
                "versions": {p: version(p) for p in ("dagster", "great-expectations", "pandas")},
                "ratios": as_json(ratios),
            },
            indent=2,
        )
    )
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
