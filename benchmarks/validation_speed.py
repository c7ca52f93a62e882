"""P3: GX validation rows/s ÷ hand-written vectorized pandas checks of the same rules.

Both sides evaluate every rule of the flights contract and collect, per rule, the count and the
positions of the offending rows (what quarantining needs). The data is the real year of flights;
larger sizes stack copies of it shifted by whole years, so keys stay unique and the shape stays
real.
"""

import argparse
import json
import time

import numpy as np
import pandas as pd

from declare.contracts import TableContract
from resources.expectations import GreatExpectations
from usecases.flights.contracts import FLIGHTS
from usecases.flights.features import DATA_TIMEZONE
from usecases.flights.source import BundledFlightsSource

YEAR_ROWS = 336_776


def flights(rows: int) -> tuple[pd.DataFrame, tuple[pd.Timestamp, pd.Timestamp], dict]:
    source = BundledFlightsSource()
    year = source.read_table("flights").frame.reset_index(drop=True)
    year["time_hour"] = pd.to_datetime(year["time_hour"], utc=True)
    copies = []
    for k in range(-(-rows // len(year))):
        copy = year.copy()
        copy["year"] += k
        copy["time_hour"] += pd.DateOffset(years=k)
        copies.append(copy)
    frame = pd.concat(copies, ignore_index=True).iloc[:rows].reset_index(drop=True)
    window = (frame["time_hour"].min(), frame["time_hour"].max() + pd.Timedelta(hours=1))
    references = {"airlines.carrier": source.read_table("airlines").frame["carrier"].tolist()}
    return frame, window, references


def pandas_rules(
    contract: TableContract, frame: pd.DataFrame, window: tuple, references: dict
) -> dict[str, np.ndarray]:
    """The same rules as the GX suite, hand-written: rule → positions of offending rows."""
    empty = np.empty(0, dtype=np.int64)
    out: dict[str, np.ndarray] = {
        "columns.match_contract": empty
        if set(frame) == set(contract.column_names)
        else np.zeros(1),
        "rows.at_least_min_rows": empty if len(frame) >= contract.min_rows else np.zeros(1),
    }
    for rule in contract.columns:
        values = frame[rule.column]
        present = values.notna().to_numpy()
        if rule.kind == "number":
            ok = pd.api.types.is_numeric_dtype(values)
            out[f"{rule.column}.is_number"] = empty if ok else np.zeros(1)
        elif rule.kind == "text" and not (rule.allowed or rule.allowed_from or rule.pattern):
            ok = pd.api.types.infer_dtype(values, skipna=True) in {"string", "empty"}
            out[f"{rule.column}.is_text"] = empty if ok else np.zeros(1)
        if rule.required:
            out[f"{rule.column}.not_null"] = np.flatnonzero(~present)
        for other in rule.required_when_present:
            with_other = frame[other].notna().to_numpy()
            out[f"{rule.column}.required_when_{other}_present"] = np.flatnonzero(
                with_other & ~present
            )
        if rule.min_value is not None or rule.max_value is not None:
            inside = values.between(rule.min_value, rule.max_value).to_numpy()
            out[f"{rule.column}.in_range"] = np.flatnonzero(present & ~inside)
        for name, allowed in (
            ("in_contract_set", rule.allowed),
            ("known", references.get(rule.allowed_from or "")),
        ):
            if allowed is not None:
                known = values.isin(set(allowed)).to_numpy()
                out[f"{rule.column}.{name}"] = np.flatnonzero(present & ~known)
        if rule.pattern:
            matches = values.str.fullmatch(rule.pattern).fillna(True).to_numpy(dtype=bool)
            out[f"{rule.column}.matches_pattern"] = np.flatnonzero(present & ~matches)
    out["natural_key.unique"] = np.flatnonzero(
        frame.duplicated(list(contract.natural_key), keep=False).to_numpy()
    )
    ts = frame[contract.event_time]
    inside = ((ts >= window[0]) & (ts < window[1])).to_numpy()
    out["event_time.within"] = np.flatnonzero(ts.notna().to_numpy() & ~inside)
    local = ts.dt.tz_convert(DATA_TIMEZONE)
    for rule in contract.columns:
        if rule.event_time_part:
            values = frame[rule.column]
            differ = (values != getattr(local.dt, rule.event_time_part)).to_numpy()
            out[f"{rule.column}.equals_local_part"] = np.flatnonzero(differ)
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("impl", choices=["gx", "pandas"])
    parser.add_argument("--rows", type=int, default=YEAR_ROWS)
    args = parser.parse_args()
    frame, window, references = flights(args.rows)
    gx = GreatExpectations(data_docs_dir="/tmp/ml-lifecycle-bench-docs", build_data_docs=False)

    def run() -> int:
        if args.impl == "pandas":
            return sum(len(v) for v in pandas_rules(FLIGHTS, frame, window, references).values())
        report = gx.validate_partition(
            FLIGHTS,
            frame,
            partition="bench",
            window=window,
            timezone=DATA_TIMEZONE,
            references=references,
        )
        return sum(r.unexpected_count for r in report.rules)

    warm = run()  # warm-up: imports, suite registration, caches
    began = time.perf_counter()
    bad = run()
    seconds = time.perf_counter() - began
    assert bad == warm
    print(json.dumps({"seconds": seconds, "rows": len(frame), "unexpected": bad}))


if __name__ == "__main__":
    main()
