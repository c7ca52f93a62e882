"""Monitoring a day without Dagster (`ml.monitor`): a day's predictions joined with what
happened, a trailing window judged only when the version predicted all of it, the drift of a
window scored by the champion, and what each outcome records for the retrain sensors."""

import dataclasses
import datetime as dt
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from declare import DecayPolicy
from ml.drift import SCORE, ColumnLines, NaturalLines
from ml.monitor import (
    MonitorRefused,
    decay_policy,
    drift_day,
    drift_settings,
    drift_thresholds,
    predicted_day,
    predicted_outcomes,
    realized_day,
    slice_table,
)
from ml.monitor_keys import (
    CHAMPION_DATA_THROUGH,
    CHAMPION_VERSION,
    DECAY_EVENT,
    DRIFT_CHECK,
    DRIFT_EVENT,
    REALIZED_CHECK,
)
from tests.unit.served import FEATURE, NEW_YORK, SERVED, Tables
from usecases.flights import USE_CASE

pytestmark = pytest.mark.unit

CARRIER = USE_CASE.slices[0].column
CASE = dataclasses.replace(USE_CASE, slices=USE_CASE.slices[:1], registered_model="delays")
LABEL = CASE.label
WEEK = [dt.date(2013, 2, 2) + dt.timedelta(days=n) for n in range(7)]
TESTED = {"roc_auc": 0.75, "threshold": 0.3}


def day_of(day: dt.date, version: str = "3", rows: int = 400, signal: float = 2.0, seed=0):
    """A day's predictions by `version` and its outcomes: `signal` says how much the
    probabilities know of the label; one flight without a tail number, two without a label."""
    rng = np.random.default_rng(seed + day.toordinal())
    labels = (rng.random(rows) < 0.25).astype("float64")
    logits = signal * (labels - 0.25) + rng.normal(0, 1, rows) - 1
    ids = np.arange(rows) + 1000 * day.toordinal()
    stamps = pd.Timestamp(day.isoformat(), tz=NEW_YORK).tz_convert("UTC")
    keys = pd.DataFrame({"flight_id": ids, "tail": ["N1"] * (rows - 1) + [None]})
    predictions = keys.assign(
        event_timestamp=stamps,
        **{CARRIER: np.where(ids % 2, "AA", "UA")},
        probability=(1 / (1 + np.exp(-logits))).astype("float32"),
        model_version=version,
    )
    outcomes = keys.assign(event_timestamp=stamps + pd.Timedelta(hours=9), arrival_delayed=labels)
    outcomes.loc[:1, "arrival_delayed"] = np.nan
    return {
        ("batch_predictions", day.isoformat()): predictions,
        (LABEL.table, day.isoformat()): outcomes,
    }


def days_of(days: list[dt.date], **how) -> Tables:
    stored = {}
    for day in days:
        stored |= day_of(day, **how)
    return Tables(stored)


def test_a_days_predictions_join_its_labelled_outcomes_on_every_shared_key():
    day = WEEK[0]
    joined = predicted_outcomes(days_of([day]), LABEL, day)
    assert joined is not None
    assert len(joined) == 398  # two outcomes without a label are left out
    untailed = 399 + 1000 * day.toordinal()  # the flight without a tail number
    assert untailed in set(joined["flight_id"])  # a missing key matches a missing key
    assert {"probability", "arrival_delayed", CARRIER} <= set(joined.columns)


def test_a_day_not_predicted_is_none_and_one_without_outcomes_is_refused_by_name():
    day = WEEK[0]
    assert predicted_outcomes(Tables({}), LABEL, day) is None
    unpublished = Tables({("batch_predictions", day.isoformat()): day_of(day)[
        ("batch_predictions", day.isoformat())
    ]})  # fmt: skip
    with pytest.raises(
        MonitorRefused,
        match="flight_outcomes partition 2013-02-02 has not been materialized; its outcomes are",
    ):
        predicted_outcomes(unpublished, LABEL, day)


def test_a_day_predicted_by_two_versions_is_refused():
    day = WEEK[0]
    tables = days_of([day])
    both = tables.stored[("batch_predictions", day.isoformat())]
    both.loc[:9, "model_version"] = "2"
    with pytest.raises(MonitorRefused, match=r"predictions by \['2', '3'\], expected one"):
        predicted_day(tables, LABEL, day)


def realized_week(tables: Tables, policy: DecayPolicy = CASE.realized):
    predicted = predicted_day(tables, LABEL, WEEK[-1])
    assert predicted is not None and predicted.version == "3"
    return realized_day(
        CASE, predicted, tables, tested=TESTED, data_through="2013-01-31", policy=policy
    )


def test_a_week_the_version_predicted_is_judged_and_records_no_decay():
    outcome = realized_week(days_of(WEEK))
    assert outcome.verdict == "ok", outcome.of_window.overall.reason
    assert outcome.of_window.overall.measured.rows == 7 * 398
    assert outcome.of_day.overall.measured.rows == 398
    (check,) = outcome.checks()
    assert check.name == REALIZED_CHECK and check.passed
    assert check.description.startswith("2013-02-08, window [2013-02-02, 2013-02-09): ok: ")
    metadata = outcome.metadata()
    assert metadata[DECAY_EVENT] is False
    assert metadata[CHAMPION_VERSION] == "3" and metadata[CHAMPION_DATA_THROUGH] == "2013-01-31"
    assert metadata["model"] == "delays v3" and metadata["metric"] == "roc_auc"
    low, high = metadata["window_roc_auc_interval"]
    assert low == round(low, 4) and low < metadata["window_roc_auc"] < high
    assert metadata["slices"].startswith("| slice | value | rows | roc_auc | interval |")
    assert "| carrier | AA | " in metadata["slices"] and "slices_plot" in metadata
    assert metadata["over_time_plot"].startswith("![roc_auc over time](data:image/png;base64,")
    document = outcome.to_document()
    assert document["tested"] == {"roc_auc": 0.75} and document["partition"] == "2013-02-08"
    assert set(document) == {"partition", "model", "window", "tested", "day", "trailing_window"}


def test_a_window_the_version_did_not_predict_whole_is_reported_not_judged():
    # Three days by v3; the four before by v2, whose rows are not v3's to answer for.
    tables = days_of(WEEK[4:])
    tables.stored |= days_of(WEEK[:4], version="2").stored
    outcome = realized_week(tables)
    assert outcome.verdict == "not_judged"
    assert outcome.of_window.overall.reason.startswith("3 of 7 days predicted by v3: ")
    assert outcome.of_window.overall.measured.rows == 3 * 398
    assert outcome.checks()[0].passed


def test_a_week_of_worthless_predictions_fails_and_records_a_decay_event():
    outcome = realized_week(days_of(WEEK, signal=0.0))
    assert outcome.verdict == "failed"
    (check,) = outcome.checks()
    assert not check.passed and check.severity == "error"
    assert outcome.metadata()[DECAY_EVENT] is True


def test_a_policy_or_drift_setting_the_launchpad_breaks_is_refused_by_field():
    with pytest.raises(MonitorRefused, match=r"max_drop=1\.5: must lie in"):
        decay_policy(CASE.realized, {"max_drop": 1.5})
    assert decay_policy(CASE.realized, {"window_days": 3}).window_days == 3
    with pytest.raises(MonitorRefused, match=r"^config drift.psi_warn: need 0 <= psi_warn"):
        drift_settings(CASE.drift, {"psi_warn": 0.5, "psi_fail": 0.2})


MEASURED = NaturalLines(
    window_days=7,
    windows=9,
    rule=CASE.drift.line_rule(),
    columns={FEATURE: ColumnLines(0.3, 0.6, 0.3, 0.5)},
)


def test_measured_lines_judge_a_column_only_when_the_settings_say_natural():
    natural = drift_thresholds(CASE.drift, MEASURED)
    assert natural.lines(FEATURE).psi_fail == 0.6 and natural.lines("other").psi_fail == 0.25
    assert natural.calendar == CASE.drift.calendar
    absolute = drift_thresholds(dataclasses.replace(CASE.drift, lines="absolute"), MEASURED)
    assert absolute.lines(FEATURE).psi_fail == 0.25


class WindowStore:
    """The label view's rows of a window, one flight an hour, and the feature `x` of each:
    standard normal, shifted by `shift`."""

    def __init__(self, shift: float):
        self.shift = shift

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        stamps = pd.date_range(start, end, freq="h", inclusive="left")
        return pd.DataFrame({"flight_id": range(len(stamps)), "event_timestamp": stamps})

    def join_keys(self, service: str) -> list[str]:
        return ["flight_id"]

    def historical_features(self, entity_rows: pd.DataFrame, service: str) -> pd.DataFrame:
        rng = np.random.default_rng(int(entity_rows["flight_id"].iloc[0]))
        x = rng.normal(self.shift, 1, len(entity_rows))
        return entity_rows.assign(**{FEATURE: x})


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training rows' feature and the served scores for them."""
    x = np.random.default_rng(7).normal(0, 1, 5000)
    path = tmp_path_factory.mktemp("reference") / "drift_reference.parquet"
    pd.DataFrame({FEATURE: x, SCORE: 1 / (1 + np.exp(-x))}).to_parquet(path)
    return path


def drift_of(reference: Path, shift: float, measured: NaturalLines | None = None):
    window = (
        pd.Timestamp("2013-07-10", tz=NEW_YORK).to_pydatetime(),
        pd.Timestamp("2013-07-11", tz=NEW_YORK).to_pydatetime(),
    )
    return drift_day(
        CASE,
        "2013-07-10",
        window,
        SERVED,
        reference=reference,
        measured=measured,
        store=WindowStore(shift),
        settings=CASE.drift,
        chunk_rows=50,
    )


def test_a_window_like_the_reference_does_not_drift(reference: Path):
    outcome = drift_of(reference, shift=0.0)
    assert outcome.window == "[2013-07-04, 2013-07-11)" and outcome.days_with_rows == 7
    assert outcome.report.current_rows == 7 * 24 and not outcome.report.drift_event
    assert outcome.lines == "absolute: delays v3 was registered without measured lines"
    # The use case's calendar columns are no features of this model: said, not failed.
    (warning,) = outcome.warnings
    assert (
        warning.startswith("calendar column(s) ['flight_schedule__day") and "delays v3" in warning
    )
    metadata = outcome.metadata()
    assert metadata[DRIFT_EVENT] is False and metadata["days_with_rows"] == "7 of 7"
    assert metadata[CHAMPION_VERSION] == "3" and metadata[CHAMPION_DATA_THROUGH] == "2013-02-07"
    assert metadata["failed"] == "none" and "| probability | score |" in metadata["drift_table"]
    (check,) = outcome.checks()
    assert check.name == DRIFT_CHECK and check.description.startswith("2013-07-10, window [")
    document = outcome.to_document()
    assert document["model"] == "delays v3" and document["current_rows"] == 7 * 24


def test_a_shifted_window_moves_the_score_a_drift_event_that_fails_the_check(reference: Path):
    outcome = drift_of(reference, shift=1.5, measured=MEASURED)
    assert outcome.report.drift_event
    assert outcome.lines.startswith("measured on the training period: 9 windows of 7 days")
    metadata = outcome.metadata()
    assert metadata[DRIFT_EVENT] is True and metadata["level"] == "fail"
    assert metadata["score_psi"] > 0.25 and metadata["failed"].startswith(FEATURE)
    (check,) = outcome.checks()
    assert not check.passed and check.severity == "error"
    assert math.isclose(check.metadata["score_psi"], metadata["score_psi"])


def test_the_slice_table_says_when_the_predictions_carry_no_declared_slice():
    assert slice_table([], "rmse") == "no declared slice column in the predictions"
    row = {"slice": "s", "group": "a", "rows": 3, "value": 1.0, "low": math.nan, "high": 2.0}
    assert slice_table([row], "rmse").splitlines()[-1] == "| s | a | 3 | 1.000 | [—, 2.000] |"
