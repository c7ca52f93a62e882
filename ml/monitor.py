"""Monitoring a day: how far the days up to it have moved from what the champion was trained on
(`drift_day`), and how the predictions made for it did once its outcomes are published
(`predicted_day`, then `realized_day`).

Drift covers a trailing window of days (a single day's conditions and calendar are too narrow to
stand for a season), scored by the champion itself, against the drift reference registered with
it: training rows with the served file's scores (`ml.drift`). Realized performance joins each
day's predictions with its outcomes and judges the trailing window's figure against the tested
one of the version that predicted (`ml.realized`). A drift or decay event is recorded in the
outcome's metadata under the keys the retrain sensors read (`ml.monitor_keys`). Each outcome
describes itself (`metadata()`, `checks()`) and gives the JSON document the asset keeps in the
lake (`to_document()`). No Dagster.
"""

import dataclasses
import datetime as dt
import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from declare import DecayPolicy, DriftSettings, Label, UseCase
from ml.drift import SCORE, DriftReport, DriftThresholds, NaturalLines, compare
from ml.metrics import SliceSpec
from ml.monitor_keys import (
    CHAMPION_DATA_THROUGH,
    CHAMPION_VERSION,
    DECAY_EVENT,
    DRIFT_CHECK,
    DRIFT_EVENT,
    REALIZED_CHECK,
)
from ml.predict import CLASS_PROBABILITY
from ml.realized import RealizedReport, realized
from ml.results import CheckOutcome, Markdown, Refused, image
from ml.score import (
    EVENT_TIMESTAMP,
    DayTables,
    FeatureRows,
    ServedVersion,
    entity_frame,
    feature_chunks,
)
from ml.task import MULTICLASS

PREDICTIONS = "batch_predictions"
"""The table of a day's predictions, as the lake names it."""


class MonitorRefused(Refused):
    """The day cannot be monitored as configured or stored; the message says why."""


def drift_settings(declared: DriftSettings, chosen: Mapping[str, Any]) -> DriftSettings:
    """The use case's drift settings with the `chosen` fields replaced; refused by field."""
    settings = dataclasses.replace(declared, **chosen)
    if (problem := settings.problem()) is not None:
        raise MonitorRefused(f"config {problem[0]}: {problem[1]}")
    return settings


def decay_policy(declared: DecayPolicy, chosen: Mapping[str, Any]) -> DecayPolicy:
    """The use case's decay policy with the `chosen` fields replaced; refused if invalid."""
    try:
        return dataclasses.replace(declared, **chosen)
    except ValueError as error:
        raise MonitorRefused(str(error)) from None


def drift_thresholds(settings: DriftSettings, measured: NaturalLines | None) -> DriftThresholds:
    """The lines `settings` judge a window by: the configured ones, and each column's lines
    `measured` on the model's training period when `settings.lines` is "natural"."""
    thresholds = DriftThresholds(
        psi_warn=settings.psi_warn,
        psi_fail=settings.psi_fail,
        ks_warn=settings.ks_warn,
        ks_fail=settings.ks_fail,
        min_rows=settings.min_rows,
        calendar=settings.calendar,
    )
    if measured is not None and settings.lines == "natural":
        thresholds = thresholds.with_columns(measured.columns)
    return thresholds


@dataclass(frozen=True)
class DriftOutcome:
    """A window of days compared with the champion's training reference."""

    partition: str
    window: str
    """The days compared, `[first, day after the last)`."""
    window_days: int
    days_with_rows: int
    served: ServedVersion
    lines: str
    """How the columns' lines were set, in words."""
    report: DriftReport
    warnings: tuple[str, ...] = ()
    """What a person should know that fails nothing (declared calendar columns the model does
    not read)."""

    def to_document(self) -> dict[str, Any]:
        return {
            "partition": self.partition,
            "window": self.window,
            "days_with_rows": self.days_with_rows,
            "model": self.served.label,
            "lines": self.lines,
            **self.report.to_dict(),
        }

    def checks(self) -> list[CheckOutcome]:
        """Warns when features drift past their lines; fails on a drift event."""
        report, level = self.report, self.report.level
        return [
            CheckOutcome(
                DRIFT_CHECK,
                passed=level == "ok",
                description=f"{self.partition}, window {self.window}: {report.summary()}",
                severity="error" if level == "fail" else "warn",
                metadata={
                    "score_psi": report.score.psi if report.score else None,
                    "failed_features": len(report.failed),
                },
            )
        ]

    def metadata(self) -> dict[str, Any]:
        """The event, the version judged, the window's figures, a table and a plot."""
        from ml.plots import drift_bars

        report, score = self.report, self.report.score
        thresholds = report.thresholds
        bars = drift_bars(
            {c.name: c.psi for c in report.columns},
            {c.name: c.level for c in report.columns},
            thresholds.psi_warn,
            thresholds.psi_fail,
        )
        return {
            DRIFT_EVENT: report.drift_event,
            CHAMPION_VERSION: self.served.version,
            CHAMPION_DATA_THROUGH: self.served.data_through,
            "level": report.level,
            "window": self.window,
            "days_with_rows": f"{self.days_with_rows} of {self.window_days}",
            "rows": report.current_rows,
            "reference_rows": report.reference_rows,
            "score_psi": score.psi if score else None,
            "score_ks": score.ks_statistic if score else None,
            "lines": self.lines,
            # Counts, which the Plots tab draws across days; the names are in the table.
            "failed_features": len(report.failed),
            "warned_features": len(report.warned),
            "failed": _names(report.failed),
            "drift_table": Markdown(report.table()),
            "drift_plot": image("PSI per column", bars),
        }


def drift_day(
    case: UseCase,
    partition: str,
    window: tuple[dt.datetime, dt.datetime],
    served: ServedVersion,
    *,
    reference: Path,
    measured: NaturalLines | None,
    store: FeatureRows,
    settings: DriftSettings,
    chunk_rows: int,
) -> DriftOutcome:
    """The drift of the `settings.window_days` days up to the end of the day `partition` (from
    `window[0]` to `window[1]`) from the drift `reference` of `served`: the days' label-view
    rows, as of the prediction instant, with their features (`chunk_rows` at a time) and the
    scores `served` gives them, judged by `settings` and the lines `measured` on the version's
    training period (None: it was registered without them, or `settings` ignore them)."""
    reference_rows = pd.read_parquet(reference)
    day_start, day_end = window
    start = day_end - dt.timedelta(days=settings.window_days)
    service, scorer = served.feature_service, served.scorer
    rows = store.view_rows(case.label.view, start.astimezone(dt.UTC), day_end.astimezone(dt.UTC))
    entities = entity_frame(rows, [*store.join_keys(service), EVENT_TIMESTAMP], case)
    frames = [
        chunk.assign(**{SCORE: scorer.monitored(chunk)})
        for chunk in feature_chunks(store, entities, service, chunk_rows)
    ]
    current = pd.concat(frames, ignore_index=True) if frames else reference_rows.iloc[:0]
    thresholds = drift_thresholds(settings, measured)
    report = compare(
        reference_rows, current, scorer.numeric_features, scorer.categorical_features, thresholds
    )
    days_with_rows = (
        int(current[EVENT_TIMESTAMP].dt.tz_convert(day_start.tzinfo).dt.date.nunique())
        if len(current)
        else 0
    )
    unserved = sorted(set(settings.calendar) - set(scorer.features))
    warnings = [f"calendar column(s) {unserved} (drift.calendar) are no features of {served.label}"]
    return DriftOutcome(
        partition=partition,
        window=f"[{start.date()}, {day_end.date()})",
        window_days=settings.window_days,
        days_with_rows=days_with_rows,
        served=served,
        lines=_lines(settings, measured, served),
        report=report,
        warnings=tuple(warnings) if unserved else (),
    )


def _lines(settings: DriftSettings, measured: NaturalLines | None, served: ServedVersion) -> str:
    if measured is not None and settings.lines == "natural":
        return measured.describe()
    if settings.lines == "natural":
        return f"absolute: {served.label} was registered without measured lines"
    return "absolute, as configured"


def _names(names: list[str], shown: int = 5) -> str:
    """The first `shown` names and how many more: a line, not a list that fills the table."""
    if not names:
        return "none"
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" … and {more} more (drift_table)" if more > 0 else "")


@dataclass(frozen=True)
class PredictedDay:
    """A day's predictions joined with its outcomes, and the one version that made them."""

    day: dt.date
    rows: pd.DataFrame
    version: str


def predicted_day(tables: DayTables, label: Label, day: dt.date) -> PredictedDay | None:
    """`day`'s predictions with their outcomes (`predicted_outcomes`); None when the day was not
    predicted. Refuses a day predicted by more than one version."""
    rows = predicted_outcomes(tables, label, day)
    if rows is None:
        return None
    versions = sorted(set(rows["model_version"].astype(str)))
    if len(versions) != 1:
        raise MonitorRefused(f"predictions by {versions}, expected one")
    return PredictedDay(day, rows, versions[0])


def predicted_outcomes(tables: DayTables, label: Label, day: dt.date) -> pd.DataFrame | None:
    """A day's predictions joined with its published outcomes (labelled rows only); None when
    the day was not predicted. Joined on every key column the two share (a missing key matches
    a missing key); an unpublished outcome day is refused by name."""
    try:
        predictions = _rows(tables, PREDICTIONS, day)
    except FileNotFoundError:
        return None
    try:
        outcomes = _rows(tables, label.table, day)
    except FileNotFoundError:
        raise MonitorRefused(
            f"{label.table} partition {day} has not been materialized; its outcomes are needed"
        ) from None
    keys = [
        c
        for c in predictions.columns
        if c in outcomes.columns and c not in (label.event_timestamp, label.column)
    ]
    missing = "\x00missing"
    left = predictions.assign(
        **{k: predictions[k].astype(object).where(predictions[k].notna(), missing) for k in keys}
    )
    right = outcomes[[*keys, label.column]]
    right = right.assign(
        **{k: right[k].astype(object).where(right[k].notna(), missing) for k in keys}
    )
    joined = left.merge(right, on=keys, how="inner", validate="one_to_one")
    return joined[joined[label.column].notna()].reset_index(drop=True)


def _rows(tables: DayTables, name: str, day: dt.date) -> pd.DataFrame:
    return pd.concat(list(tables.table(name, day.isoformat()).frames()), ignore_index=True)


@dataclass(frozen=True)
class RealizedOutcome:
    """A day's predictions judged by what happened: the day, and its trailing window."""

    partition: dt.date
    model: str
    version: str
    data_through: str
    """The last day of the version's training data; "" when not recorded."""
    metric: str
    tested: float | None
    """The version's test figure of `metric`."""
    min_rows: int
    window: str
    """The days judged, `[first, day after the last)`."""
    of_day: RealizedReport
    of_window: RealizedReport
    history: tuple[Mapping[str, Any], ...] = field(default=(), compare=False, repr=False)
    """The documents of earlier days (`to_document()`), for the plot over time."""

    def to_document(self) -> dict[str, Any]:
        return {
            "partition": self.partition.isoformat(),
            "model": self.model,
            "window": self.window,
            "tested": {self.metric: self.tested},
            "day": self.of_day.to_dict(),
            "trailing_window": self.of_window.to_dict(),
        }

    @property
    def verdict(self) -> str:
        return self.of_window.overall.verdict

    def checks(self) -> list[CheckOutcome]:
        """Warns on a decay beyond the interval; fails on a decay event."""
        return [
            CheckOutcome(
                REALIZED_CHECK,
                passed=self.verdict in ("ok", "not_judged"),
                description=f"{self.partition}, window {self.window}: {self.verdict}:"
                f" {self.of_window.overall.reason}",
                severity="error" if self.verdict == "failed" else "warn",
            )
        ]

    def metadata(self) -> dict[str, Any]:
        """The event, the version judged, the day's and the window's figures, and plots."""
        from ml import plots

        metric, day, window = self.metric, self.of_day.overall, self.of_window.overall
        over_time = plots.realized_over_time(
            [*self.history, self.to_document()], self.tested, metric
        )
        slices = self.of_window.slices
        return {
            DECAY_EVENT: self.verdict == "failed",
            CHAMPION_VERSION: self.version,
            CHAMPION_DATA_THROUGH: self.data_through,
            "model": self.model,
            "metric": metric,
            "tested": self.tested,
            "day_rows": day.measured.rows,
            "min_rows": self.min_rows,  # fewer: the figure is not judged (nor shown)
            f"day_{metric}": day.measured.value,
            f"day_{metric}_interval": _interval(day.measured.low, day.measured.high),
            "window": self.window,
            "window_rows": window.measured.rows,
            f"window_{metric}": window.measured.value,
            f"window_{metric}_interval": _interval(window.measured.low, window.measured.high),
            "verdict": self.verdict,
            "reason": window.reason,
            "over_time_plot": image(f"{metric} over time", over_time),
            "slices": Markdown(slice_table(slices, metric)),
            **(
                {
                    "slices_plot": image(
                        f"{metric} per slice", plots.realized_slices(slices, self.tested, metric)
                    )
                }
                if slices
                else {}
            ),
        }


def realized_day(
    case: UseCase,
    predicted: PredictedDay,
    tables: DayTables,
    *,
    tested: Mapping[str, float],
    data_through: str,
    policy: DecayPolicy,
    history: Sequence[Mapping[str, Any]] = (),
) -> RealizedOutcome:
    """The realized performance of the `predicted` day and of its trailing window (the earlier
    days' predictions by the same version, read from `tables`), judged by `policy` against the
    version's `tested` figures. Fewer days of the window predicted by the version than the
    policy's: the window is reported, not judged. `history`: the documents of earlier days."""
    label, day, version = case.label, predicted.day, predicted.version
    earlier = [day - dt.timedelta(days=n) for n in range(policy.window_days - 1, 0, -1)]
    frames = [f for d in earlier if (f := predicted_outcomes(tables, label, d)) is not None]
    window = pd.concat([*frames, predicted.rows], ignore_index=True)
    window = window[window["model_version"].astype(str) == version]
    covered = 1 + sum(bool((f["model_version"].astype(str) == version).any()) for f in frames)
    # The declared slices whose columns the predictions carry (`batch_predictions` keeps them).
    slices = [
        SliceSpec(s.name, s.column, s.edges, s.labels)
        for s in case.slices
        if s.column in window.columns
    ]
    threshold = tested.get("threshold") if label.task == "binary" else None
    judged = functools.partial(
        _judged, label=label, tested=tested, policy=policy, threshold=threshold
    )
    of_window = judged(window, slices)
    if covered < policy.window_days:
        # A test figure pools several days, and a pooled figure mixes the days' differences
        # in: it is not comparable with fewer days than the window, nor is one day's.
        of_window = _not_judged(
            of_window, f"{covered} of {policy.window_days} days predicted by v{version}"
        )
    metric = policy.metric_for(label.task)
    first = (day - dt.timedelta(days=policy.window_days - 1)).isoformat()
    return RealizedOutcome(
        partition=day,
        model=f"{case.registered_model} v{version}",
        version=version,
        data_through=data_through,
        metric=metric,
        tested=tested.get(metric),
        min_rows=policy.min_rows,
        window=f"[{first}, {day + dt.timedelta(days=1)})",
        of_day=judged(predicted.rows, []),
        of_window=of_window,
        history=tuple(history),
    )


def _judged(
    rows: pd.DataFrame,
    slices: list[SliceSpec],
    *,
    label: Label,
    tested: Mapping[str, float],
    policy: DecayPolicy,
    threshold: float | None,
) -> RealizedReport:
    if label.task == MULTICLASS.name:
        # The scored rows hold each class's probability, in the model's order of the classes.
        columns = [c for c in rows.columns if c.startswith(CLASS_PROBABILITY.format(""))]
        classes = [c.removeprefix(CLASS_PROBABILITY.format("")) for c in columns]
        labels, scores = rows[label.column].to_numpy(dtype=object), rows[columns].to_numpy()
    else:
        output = "probability" if label.task == "binary" else "prediction"
        classes, labels = [], rows[label.column].to_numpy(dtype="float64")
        scores = rows[output].to_numpy(dtype="float64")
    return realized(
        labels,
        scores,
        label.task,
        tested,
        policy,
        threshold=threshold,
        frame=rows.reset_index(drop=True),
        slices=slices,
        classes=classes,
    )


def _not_judged(report: RealizedReport, why: str) -> RealizedReport:
    overall = report.overall
    return dataclasses.replace(
        report,
        overall=dataclasses.replace(
            overall, verdict="not_judged", reason=f"{why}: {overall.reason}"
        ),
    )


def _interval(low: float, high: float) -> list[float | None]:
    """An interval's ends as the metadata shows figures (`assets.figure`, which rounds plain
    numbers but not those inside a list): 4 decimals, None where undefined."""
    return [round(v, 4) if math.isfinite(v) else None for v in (float(low), float(high))]


def slice_table(rows: list[dict], metric: str) -> str:
    """The window's figure per slice value, as a Markdown table (not judged: reported)."""
    if not rows:
        return "no declared slice column in the predictions"
    lines = [f"| slice | value | rows | {metric} | interval |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['slice']} | {row['group']} | {row['rows']} | {_cell(row['value'])} |"
            f" [{_cell(row['low'])}, {_cell(row['high'])}] |"
        )
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}"
