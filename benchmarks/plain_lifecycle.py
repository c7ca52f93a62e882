"""P2's denominator: the compute of `make run` (flights, the default 59 days) as one plain
script, without Dagster runs, Feast, Great Expectations or MLflow.

    python -m benchmarks.plain_lifecycle                         # the bundled data
    python -m benchmarks.plain_lifecycle --drops FOLDER --out DIR
    python -m benchmarks.plain_lifecycle --histories once        # trailing tables in one call

The same stages on the same data, with the project's own functions where `make run` has them:

- read: each day's flights and weather (the bundled data, or the drop folder's CSV files read
  by `DropFolderSource` as `make run` reads them) and the dimension tables;
- checks: the contract's rules as vectorized pandas (`benchmarks.validation_speed.pandas_rules`,
  the hand-written side of P3); a table rule refuses the day, rows broken by row rules are
  quarantined while their share stays within the contract's budget; the published flights get
  the use case's `publish` flags;
- features: the use case's declared feature builders, day by day over the training window, each
  with the inputs the assets hand it (the day, its 28 trailing days, the dimension tables). The
  two trailing tables take most of that time, because each day reads its 28 days again (as the
  assets do); `--histories once` builds them with one `delay_history` call over the window,
  the same rows (the fingerprint says so) in a tenth of the time: what a plain script would do;
- training set: the labelled rows of the label table (`ml.dataset.labelled_rows`), a pandas
  point-in-time join (`merge_asof` per view of the FeatureService, its TTL as the tolerance) and
  `ml.dataset.assemble`, whose fingerprint must equal the one `make run` prints;
- train: `ml.train.train` in this process, one process with the global batch of `make run`'s
  two torchrun workers (2 x 512 rows), on every core;
- evaluate: the decision threshold on the validation split and the test metrics and slices
  (`ml.metrics`);
- export and parity: `ml.export.export` and `ml.export.parity` on the test split, then the drift
  reference (a seeded sample of the train split scored by the ONNX file);
- score: each test day's rows scored by onnxruntime into Parquet (`ml.predict.score_to_parquet`);
- drift: each test day's trailing week scored and compared with the reference (`ml.drift`, by
  the lines `ml.monitor.drift_thresholds` sets).

It prints one JSON line: `seconds` (wall time from the interpreter's start, as `make run`'s is
measured), `peak_rss_mib` (VmHWM), `fingerprint` (12 hex digits), `stages` (seconds each) and
`rows` (counts, for comparing with `make run`'s summary).

The FeatureService's views are restated below (VIEWS): reading them from `feature_repo/` would
import Feast. The fingerprint check catches a restatement that drifts from the declarations.
"""

import argparse
import contextlib
import datetime as dt
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from declare import UseCase
    from declare.contracts import TableContract
    from resources.sources import RawSource

EVENT_TIMESTAMP = "event_timestamp"
TRAIN_PROCESSES = 2
"""`make run`'s torchrun workers: one process here trains with their global batch."""


@dataclass(frozen=True)
class View:
    """A feature view of the FeatureService, as the point-in-time join reads it."""

    name: str
    table: str
    """The feature table (in the lake: its batch source)."""
    keys: tuple[str, ...]
    ttl: dt.timedelta
    features: tuple[str, ...]


_HISTORY = tuple(
    f"{what}_{days}d"
    for days in (7, 28)
    for what in ("flights", "arrivals", "delay_rate", "mean_arr_delay", "cancel_rate")
)
VIEWS = (
    View(
        "flight_schedule",
        "flight_features",
        ("flight_id",),
        dt.timedelta(days=1),
        (
            *("carrier_code", "origin_code", "dest_code", "distance_mi", "dep_hour"),
            *("day_of_week", "month", "days_to_holiday", "days_since_holiday"),
        ),
    ),
    View(
        "origin_weather",
        "weather_features",
        ("origin",),
        dt.timedelta(hours=2),
        (
            *("temp_f", "dewpoint_f", "humidity_pct", "wind_dir_deg", "wind_speed_mph"),
            *("wind_gust_mph", "precip_in", "pressure_mb", "visibility_mi"),
        ),
    ),
    View(
        "aircraft_profile",
        "aircraft_features",
        ("tailnum",),
        dt.timedelta(days=1),
        ("aircraft_age_years", "seats", "engines", "aircraft_type", "engine_type"),
    ),
    View("carrier_history", "carrier_history", ("carrier",), dt.timedelta(days=1), _HISTORY),
    View("route_history", "route_history", ("origin", "dest"), dt.timedelta(days=1), _HISTORY),
)
"""`flight_delay_v1` of feature_repo/flights/flights.py: its views in order, with their TTLs."""


HISTORIES = {"carrier_history": ("carrier",), "route_history": ("origin", "dest")}
"""The flights' trailing tables and their keys, for `--histories once`: one
`features.delay_history` call over the whole window instead of one per day."""


class DayRefused(RuntimeError):
    """A day broke a table rule, or more rows than its budget broke row rules."""


class Stages:
    """Wall time of each stage, in order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        yield
        seconds = time.perf_counter() - began
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        sys.stderr.write(f"{name}: {seconds:.1f} s\n")


def days_of(first: dt.date, last: dt.date) -> list[dt.date]:
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def day_window(day: dt.date, timezone: str) -> tuple["pd.Timestamp", "pd.Timestamp"]:
    """The partition's [start, end) in UTC: the local calendar day."""
    import pandas as pd

    start = pd.Timestamp(day).tz_localize(timezone).tz_convert("UTC")
    end = pd.Timestamp(day + dt.timedelta(days=1)).tz_localize(timezone).tz_convert("UTC")
    return start, end


TABLE_RULES = ("columns.match_contract", "rows.at_least_min_rows")
TABLE_RULE_SUFFIXES = (".is_number", ".is_text")


def checked(
    contract: "TableContract",
    frame: "pd.DataFrame",
    day: dt.date,
    timezone: str,
    references: dict[str, list],
) -> tuple["pd.DataFrame", dict[str, int]]:
    """The day's publishable rows and, per broken row rule, how many rows broke it; raises
    DayRefused as the GX contract refuses a day: a broken table rule, or a quarantined share
    above `max_rejected_share`."""
    import numpy as np
    import pandas as pd

    from benchmarks.validation_speed import pandas_rules

    frame = frame.reset_index(drop=True)
    if set(contract.column_names) - set(frame.columns):  # pandas_rules reads every column
        missing = sorted(set(contract.column_names) - set(frame.columns))
        raise DayRefused(f"{contract.table} {day}: rule columns.match_contract: lacks {missing}")
    # A number column read as text refuses the day before any range is compared with it.
    mistyped = [
        f"{rule.column}.is_number"
        for rule in contract.columns
        if rule.kind == "number" and not pd.api.types.is_numeric_dtype(frame[rule.column])
    ]
    if mistyped:
        raise DayRefused(f"{contract.table} {day}: table rule(s) {mistyped} failed")
    rules = pandas_rules(contract, frame, day_window(day, timezone), references)
    table = [r for r, rows in rules.items() if len(rows) and _table_rule(r)]
    if table:
        raise DayRefused(f"{contract.table} {day}: table rule(s) {table} failed")
    broken = {r: rows for r, rows in rules.items() if len(rows)}
    positions = [np.asarray(v, dtype=np.int64) for v in broken.values()]
    rejected = np.unique(np.concatenate(positions)) if positions else np.empty(0, dtype=np.int64)
    share = len(rejected) / len(frame) if len(frame) else 0.0
    if share > contract.max_rejected_share:
        raise DayRefused(
            f"{contract.table} {day}: {len(rejected)} of {len(frame)} rows broke row rules"
            f" {sorted(broken)} ({share:.2%} > {contract.max_rejected_share:.2%})"
        )
    keep = np.ones(len(frame), dtype=bool)
    keep[rejected] = False
    return frame.loc[keep].reset_index(drop=True), {r: len(v) for r, v in broken.items()}


def _table_rule(rule: str) -> bool:
    return rule in TABLE_RULES or rule.endswith(TABLE_RULE_SUFFIXES)


def as_read_back(frame: "pd.DataFrame") -> "pd.DataFrame":
    """`frame` as the lake's Parquet file read back by DuckDB comes out: through Arrow, without
    pandas' own metadata (text becomes object, a nullable integer int64 or float64)."""
    import pyarrow as pa

    table = pa.Table.from_pandas(frame, preserve_index=False)
    return table.replace_schema_metadata(None).to_pandas()


def point_in_time(
    entities: "pd.DataFrame", tables: dict[str, "pd.DataFrame"], views=VIEWS
) -> "pd.DataFrame":
    """Each entity row with every view's features (`<view>__<feature>`) as of its event
    timestamp: the view's latest row with the same keys at or before it, no older than the
    view's TTL; in the entity rows' order, as the offline store returns them."""
    import numpy as np
    import pandas as pd

    left = entities.reset_index(drop=True)
    order = np.argsort(left[EVENT_TIMESTAMP].to_numpy(), kind="stable")
    ordered = left.iloc[order].reset_index(drop=True)
    out = {}
    for view in views:
        rows = tables[view.table]
        right = rows[[*view.keys, EVENT_TIMESTAMP, *view.features]].rename(
            columns={f: f"{view.name}__{f}" for f in view.features}
        )
        right = right.dropna(subset=list(view.keys)).sort_values(EVENT_TIMESTAMP, kind="stable")
        # Compared as instants in microseconds, as the offline store casts every timestamp.
        right[EVENT_TIMESTAMP] = right[EVENT_TIMESTAMP].dt.as_unit("us")
        keys = ordered[[*view.keys, EVENT_TIMESTAMP]].copy()
        keys[EVENT_TIMESTAMP] = keys[EVENT_TIMESTAMP].dt.floor("us").dt.as_unit("us")
        # A missing key finds nothing (SQL's NULL = NULL is not true): a value no row has.
        for key in view.keys:
            keys[key] = keys[key].astype(object).where(keys[key].notna(), "\x00missing")
        joined = pd.merge_asof(
            keys,
            right,
            on=EVENT_TIMESTAMP,
            by=list(view.keys),
            direction="backward",
            tolerance=pd.Timedelta(view.ttl),
        )
        for feature in view.features:
            out[f"{view.name}__{feature}"] = joined[f"{view.name}__{feature}"].to_numpy()
    features = pd.DataFrame(out)
    features.index = order  # back to the entity rows' order
    features = features.sort_index()
    # As DuckDB hands them over: integers with a gap are floats, text is object with None.
    return pd.concat([left, as_read_back(features)], axis=1)


def read_days(
    source: "RawSource", contract: "TableContract", days: list[dt.date]
) -> dict[dt.date, "pd.DataFrame"]:
    """Each day's drop, as `make run` reads it (`resources.publishing.read_drop`)."""
    frames = {}
    for day in days:
        drop = source.read_day_chunks(
            contract.table,
            day,
            timestamp_columns=contract.timestamp_columns,
            missing_values=contract.missing_values_by_column,
        )
        frames[day] = drop.whole().frame
    return frames


def build_features(
    case: "UseCase",
    window: list[dt.date],
    published: dict[str, dict[dt.date, "pd.DataFrame"]],
    dimensions: dict[str, "pd.DataFrame"],
    seconds: dict[str, float],
    histories_once: bool = False,
) -> dict[str, "pd.DataFrame"]:
    """Each declared feature table over the window, day by day, as the assets build it;
    `seconds` gets each table's build time. With `histories_once`, the trailing tables
    (HISTORIES) are built by one call over the window instead: the same rows, without reading
    every day's 28 days again."""
    import pandas as pd

    from declare import Day, Lookup, Trailing
    from ml.features import FeatureTable, whole

    tables: dict[str, list[pd.DataFrame]] = {spec.name: [] for spec in case.feature_tables}
    once = set(HISTORIES) if histories_once else set()
    for name in once:
        from usecases.flights import HISTORY_DAYS, HISTORY_INPUT_COLUMNS, features

        began = time.perf_counter()
        flights = published["flights"]
        first = window[0] - dt.timedelta(days=HISTORY_DAYS)
        chunks = (
            f[list(HISTORY_INPUT_COLUMNS)] for d, f in flights.items() if first <= d < window[-1]
        )
        built = features.delay_history(chunks, dimensions["airports"], window, HISTORIES[name])
        tables[name].append(built.frame)
        seconds[name] = time.perf_counter() - began
    for day in window:
        for spec in case.feature_tables:
            if spec.name in once:
                continue
            inputs: dict[str, Any] = {}
            for name, source in spec.inputs.items():
                if isinstance(source, Lookup):
                    inputs[name] = dimensions[source.table]
                elif isinstance(source, Day):
                    inputs[name] = iter([published[source.table][day]])
                elif isinstance(source, Trailing):
                    before = [day - dt.timedelta(days=i) for i in range(source.days, 0, -1)]
                    days = published[source.table]
                    columns = list(source.columns)
                    inputs[name] = iter([days[d][columns] for d in before if d in days])
            began = time.perf_counter()
            built = spec.build(day, **inputs)
            table = built if isinstance(built, FeatureTable) else whole(built)
            tables[spec.name].append(table.frame)
            seconds[spec.name] = seconds.get(spec.name, 0.0) + time.perf_counter() - began
    return {
        name: as_read_back(pd.concat(parts, ignore_index=True)) for name, parts in tables.items()
    }


def run(
    drops: Path | None,
    out: Path,
    threads: int,
    histories_once: bool = False,
    bounds: tuple[dt.date, dt.date] | None = None,
) -> dict:
    """The whole plain lifecycle over the training window `bounds` (its first and last day;
    default: `make run`'s); what `main` prints."""
    stages = Stages()
    with stages("read"):
        import pandas as pd

        from cli.run import default_window, history_days, training_split
        from resources.sources import DropFolderSource
        from usecases.flights import USE_CASE as case

        source = DropFolderSource(root=str(drops)) if drops else case.source()
        start, last = bounds or default_window(case)
        lead_in = start - dt.timedelta(days=history_days(case))
        every_day = days_of(max(lead_in, dt.date.fromisoformat(case.partitions.start)), last)
        window = days_of(start, last)
        dimensions = {d.name: source.read_table(d.name).frame for d in case.dimensions}
        raw = {t.name: read_days(source, t.contract, every_day) for t in case.event_tables}

    rows: dict[str, Any] = {}
    with stages("checks"):
        published: dict[str, dict[dt.date, pd.DataFrame]] = {}
        for table in case.event_tables:
            contract = table.contract
            references = {
                r: dimensions[r.split(".")[0]][r.split(".")[1]].dropna().tolist()
                for r in contract.references
            }
            published[table.name] = {}
            counts = {"received": 0, "published": 0, "quarantined": 0}
            for day, frame in raw[table.name].items():
                kept, _ = checked(contract, frame, day, case.timezone, references)
                if table.publish is not None:
                    kept = table.publish(kept)
                published[table.name][day] = kept
                counts["received"] += len(frame)
                counts["published"] += len(kept)
                counts["quarantined"] += len(frame) - len(kept)
            rows[table.name] = counts
        del raw

    with stages("features"):
        built: dict[str, float] = {}
        tables = build_features(case, window, published, dimensions, built, histories_once)
        rows["features"] = {name: len(frame) for name, frame in tables.items()}
        rows["feature_seconds"] = {name: round(s, 2) for name, s in built.items()}

    with stages("training set"):
        from ml.dataset import LabelSpec, TimeSplit, as_predicted, assemble, labelled_rows

        # The split `make run` trains on: the declared one, or the given days split by shares.
        config, _ = training_split(case, *(bounds or (None, None)))
        split = TimeSplit(
            **{k: dt.date.fromisoformat(v) for k, v in config.items()}, timezone=case.timezone
        )
        label = case.label
        spec = LabelSpec(view=label.view, label=label.column, task=label.task)
        join_keys = list(dict.fromkeys(k for view in VIEWS for k in view.keys))
        outcomes = tables[label.table]
        in_window = outcomes[
            (outcomes[EVENT_TIMESTAMP] >= split.instant(split.start))
            & (outcomes[EVENT_TIMESTAMP] < split.instant(split.end))
        ]
        entity_rows, unlabelled = labelled_rows(
            as_predicted(in_window, case.prediction.at, case.timezone), spec, join_keys
        )
        joined = point_in_time(entity_rows, tables)
        feature_columns = [f"{v.name}__{f}" for v in VIEWS for f in v.features]
        training_set, summary = assemble(joined, spec, split, feature_columns, unlabelled)
        out.mkdir(parents=True, exist_ok=True)
        training_file = out / "training_set.parquet"
        training_set.to_parquet(training_file, index=False)
        rows["training_set"] = {**summary.rows, "unlabelled_left_out": summary.unlabelled_rows}
        sys.stderr.write(f"training set: {summary.rows}, fingerprint {summary.fingerprint[:12]}\n")

    with stages("train"):
        import torch

        from ml.catalog import entry_settings
        from ml.config import TrainConfig
        from ml.train import Ranks, train

        torch.set_num_threads(threads)
        defaults = entry_settings(case.configs.entry(case.config))  # what make run trains
        settings = TrainConfig.from_dict(
            {
                **defaults.to_dict(),
                "data": {
                    **defaults.to_dict()["data"],
                    "training_set": str(training_file),
                    "label": label.column,
                    "task": label.task,
                    "feature_service": case.feature_service,
                },
                "optim": {
                    **defaults.to_dict()["optim"],
                    "batch_size": defaults.optim.batch_size * TRAIN_PROCESSES,
                },
                "output_dir": str(out / "model"),
            }
        )
        (out / "model").mkdir(exist_ok=True)
        result = train(settings, Ranks(0, 1, torch.device("cpu")))
        rows["train"] = {"best_epoch": result.best_epoch, "epochs": result.epochs}

    with stages("evaluate"):
        from ml.metrics import SliceSpec, best_threshold, evaluate
        from ml.train import load_trained, predictions

        trained = load_trained(out / "model")
        parts = {s: training_set[training_set["split"] == s] for s in ("train", "validation")}
        test = training_set[training_set["split"] == "test"].reset_index(drop=True)
        validation = parts["validation"]
        threshold = best_threshold(
            validation[label.column].to_numpy(),
            predictions(trained.model, trained.preprocessor, validation),
        )
        scores = predictions(trained.model, trained.preprocessor, test)
        evaluation = evaluate(
            test[label.column].to_numpy(),
            scores,
            frame=test,
            slices=[SliceSpec(s.name, s.column, s.edges, s.labels) for s in case.slices],
            threshold=threshold,
            min_slice_rows=200,
            task=label.task,
        )
        rows["test_roc_auc"] = round(float(evaluation.overall.as_dict()["roc_auc"]), 4)

    with stages("export"):
        from ml.export import export

        exported = export(
            trained.model,
            trained.preprocessor,
            out / "model" / "model.onnx",
            {
                "model_name": case.registered_model,
                "feature_service": case.feature_service,
                "threshold": repr(threshold),
                "data_fingerprint": summary.fingerprint,
            },
        )

    with stages("parity"):
        from ml.drift import SCORE, declared_lines, reference_sample
        from ml.export import parity
        from ml.predict import Scorer

        report = parity(exported.path, trained.model, trained.preprocessor, test)
        if not report.passed:
            raise AssertionError(f"ONNX parity failed: {report.as_dict()}")
        scorer = Scorer.load(exported.path)
        # The training window's rows, every split, as `onnx_model` keeps them.
        features = training_set[scorer.features]
        sample = reference_sample(features)
        reference = sample.assign(**{SCORE: scorer.predict(sample)})
        declared = case.drift
        lines = declared_lines(
            features.assign(**{SCORE: scorer.predict(features)}),
            training_set[EVENT_TIMESTAMP].dt.tz_convert(case.timezone).dt.date,
            scorer.numeric_features,
            scorer.categorical_features,
            declared,
        )

    test_days = [d for d in window if d >= split.test_start]
    keys = [*join_keys, EVENT_TIMESTAMP]

    def entities_of(first: dt.date, last_day: dt.date) -> pd.DataFrame:
        begin, _ = day_window(first, case.timezone)
        _, end = day_window(last_day, case.timezone)
        chosen = outcomes[(outcomes[EVENT_TIMESTAMP] >= begin) & (outcomes[EVENT_TIMESTAMP] < end)]
        return (
            as_predicted(chosen[keys], case.prediction.at, case.timezone)
            .sort_values(keys)
            .reset_index(drop=True)
        )

    with stages("score"):
        from ml.predict import score_to_parquet

        scored = 0
        for day in test_days:
            summary_day = score_to_parquet(
                scorer,
                [point_in_time(entities_of(day, day), tables)],
                out / "predictions" / f"{day}.parquet",
                keep=keys,
                constants={
                    "model_name": case.registered_model,
                    "predicted_at": dt.datetime.now(dt.UTC),
                },
                threshold=threshold,
            )
            scored += summary_day.rows
        rows["scored"] = scored

    with stages("drift"):
        from ml.drift import compare
        from ml.monitor import drift_thresholds

        declared = case.drift
        thresholds = drift_thresholds(declared, lines)
        psi = {}
        for day in test_days:
            current = point_in_time(
                entities_of(day - dt.timedelta(days=declared.window_days - 1), day), tables
            )
            current = current.assign(**{SCORE: scorer.predict(current)})
            drift = compare(
                reference,
                current,
                scorer.numeric_features,
                scorer.categorical_features,
                thresholds,
            )
            psi[str(day)] = round(drift.score.psi, 4) if drift.score else None
        rows["score_psi"] = psi
    return {
        "seconds": _since_process_start(),
        "peak_rss_mib": _peak_rss_mib(),
        "fingerprint": summary.fingerprint[:12],
        "stages": {name: round(s, 3) for name, s in stages.seconds.items()},
        "rows": rows,
        "drops": str(drops) if drops else "bundled",
        "histories": "once" if histories_once else "per day",
    }


def _since_process_start() -> float:
    """Wall seconds since this process started (interpreter start and imports included)."""
    import psutil

    return time.time() - psutil.Process().create_time()


def _peak_rss_mib() -> float:
    from benchmarks.large_drop import _peak_rss_mib as peak

    return peak()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--drops", type=Path, help="a drop folder (default: the bundled data)")
    parser.add_argument("--out", type=Path, help="where the files go (default: a temporary one)")
    parser.add_argument(
        "--threads",
        type=int,
        default=len(os.sched_getaffinity(0)),
        help="torch threads of the training process (default: every core)",
    )
    parser.add_argument(
        "--histories",
        choices=["per-day", "once"],
        default="per-day",
        help="the trailing tables day by day as the assets build them (each day reads its 28"
        " days again), or in one call over the window",
    )
    parser.add_argument("--start", type=dt.date.fromisoformat, help="first day of the window")
    parser.add_argument("--end", type=dt.date.fromisoformat, help="last day of the window")
    args = parser.parse_args()
    once = args.histories == "once"
    window = (args.start, args.end) if args.start and args.end else None
    if args.out is not None:
        result = run(args.drops, args.out, args.threads, once, window)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-plain-") as folder:
            result = run(args.drops, Path(folder), args.threads, once, window)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
