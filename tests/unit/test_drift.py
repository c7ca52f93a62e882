import math

import numpy as np
import pandas as pd
import pytest

from declare.policies import LineRule
from ml.drift import (
    ColumnLines,
    DriftThresholds,
    NaturalLines,
    _ks_statistic,
    categorical_counts,
    column_drift,
    compare,
    natural_lines,
    numeric_counts,
    psi,
    reference_sample,
    rule_lines,
)

pytestmark = pytest.mark.unit
rng = np.random.default_rng(0)


def frame(n: int, shift: float = 0.0, score_shift: float = 0.0) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "temp": rng.normal(30 + shift, 10, n),
            "carrier": rng.choice(["AA", "B6", "UA"], n),
            "probability": np.clip(rng.beta(2, 6, n) + score_shift, 0, 1),
        }
    )


def test_psi_is_zero_for_identical_histograms_and_grows_with_the_shift():
    same = np.array([10, 20, 30, 40])
    assert psi(same, same) == pytest.approx(0.0)
    reference = rng.normal(0, 1, 5000)
    shifts = [psi(*numeric_counts(reference, rng.normal(s, 1, 2000))) for s in (0, 0.5, 1, 2)]
    assert shifts[0] < 0.05 < shifts[1] < shifts[2] < shifts[3]


def test_an_empty_bin_costs_a_finite_amount():
    assert math.isfinite(psi(np.array([100, 100]), np.array([200, 0])))


def test_missing_values_are_a_bin_of_their_own():
    reference = np.arange(100.0)
    current = np.where(np.arange(100) < 50, np.nan, np.arange(100.0))
    ref_counts, cur_counts = numeric_counts(reference, current)
    assert ref_counts[-1] == 0 and cur_counts[-1] == 50
    assert psi(ref_counts, cur_counts) > 0.25


def test_unseen_categories_are_counted_and_reported():
    ref = pd.Series(["AA", "B6", "UA"] * 100)
    cur = pd.Series(["AA", "ZZ", None, ""] * 25)
    ref_counts, cur_counts, unseen = categorical_counts(ref, cur)
    assert unseen == pytest.approx(0.25)
    assert cur_counts[-2] == 25 and cur_counts[-1] == 50  # unseen bin, then missing ("" too)
    assert ref_counts.sum() == 300


def test_levels_follow_the_thresholds_and_nan_fails():
    t = DriftThresholds(psi_warn=0.1, psi_fail=0.25, ks_warn=0.1, ks_fail=0.2)
    assert t.level(0.05, 0.05) == "ok"
    assert t.level(0.15, 0.05) == "warn"
    assert t.level(0.05, 0.25) == "fail"
    assert t.level(float("nan"), None) == "fail"
    with pytest.raises(ValueError, match="psi_warn <= psi_fail"):
        DriftThresholds(psi_warn=0.3, psi_fail=0.2)


def test_a_drift_event_is_the_score_failing_not_a_feature():
    reference = frame(5000)
    features_only = compare(reference, frame(2000, shift=15), ["temp"], ["carrier"])
    assert features_only.failed == ["temp"]
    assert not features_only.drift_event and features_only.level == "warn"

    scores = compare(reference, frame(2000, score_shift=0.3), ["temp"], ["carrier"])
    assert scores.score is not None and scores.score.level == "fail"
    assert scores.drift_event and scores.level == "fail"
    assert "score PSI" in scores.summary()
    assert scores.table().splitlines()[2].startswith("| probability | score | fail |")

    quiet = compare(reference, frame(2000), ["temp"], ["carrier"])
    assert quiet.level == "ok" and not quiet.drift_event


def test_too_few_rows_are_reported_but_never_an_event():
    report = compare(frame(5000), frame(20, score_shift=0.5), ["temp"], ["carrier"])
    assert report.too_few_rows and not report.drift_event
    assert "not judged" in report.summary()


def test_a_missing_column_is_refused_by_name():
    with pytest.raises(ValueError, match="'wind'"):
        compare(frame(10), frame(10), ["temp", "wind"], [])


def test_ks_is_reported_for_numbers_only():
    data = frame(500)
    numeric = column_drift("temp", "numeric", data["temp"], data["temp"], DriftThresholds())
    assert numeric.ks_statistic == pytest.approx(0.0) and numeric.ks_pvalue == pytest.approx(1.0)
    categorical = column_drift(
        "carrier", "categorical", data["carrier"], data["carrier"], DriftThresholds()
    )
    assert categorical.ks_statistic is None


def test_the_reference_sample_is_seeded_and_bounded():
    data = frame(1000)
    first = reference_sample(data, rows=100, seed=1)
    assert len(first) == 100
    pd.testing.assert_frame_equal(first, reference_sample(data, rows=100, seed=1))
    assert not first.equals(reference_sample(data, rows=100, seed=2))
    assert len(reference_sample(data, rows=5000)) == 1000


def test_a_regressions_predictions_drift_like_any_number_whatever_their_range():
    def day(n: int, shift: float = 0.0) -> pd.DataFrame:
        # Predicted minutes: unbounded, negative as well as in the thousands.
        return pd.DataFrame(
            {"temp": rng.normal(30, 10, n), "prediction": rng.normal(-400 + shift, 900, n)}
        )

    reference = day(5000)
    quiet = compare(reference, day(2000), ["temp"], [], score="prediction")
    assert quiet.score is not None and quiet.score.kind == "score"
    assert quiet.level == "ok" and not quiet.drift_event
    moved = compare(reference, day(2000, shift=900), ["temp"], [], score="prediction")
    assert moved.score is not None and moved.score.psi > 0.25 and moved.drift_event
    assert moved.score.ks_statistic is not None and moved.score.ks_statistic > 0.2


def training_period(days: int = 28, rows_per_day: int = 400) -> tuple[pd.DataFrame, pd.Series]:
    """A steady column, one whose level wanders from week to week, a category and a score."""
    day = np.repeat(np.arange(days), rows_per_day)
    local = np.random.default_rng(1)
    weekly = np.sin(day / 7 * np.pi) * 10  # a seasonal swing within the period
    frame = pd.DataFrame(
        {
            "steady": local.normal(0, 1, day.size),
            "wandering": local.normal(0, 5, day.size) + weekly,
            "carrier": local.choice(["AA", "B6", "UA"], day.size),
            "probability": local.beta(2, 6, day.size),
        }
    )
    dates = pd.Series(pd.Timestamp("2013-01-01") + pd.to_timedelta(day, unit="D")).dt.date
    return frame, dates


def test_a_column_that_moves_inside_the_training_period_gets_lines_above_its_movement():
    frame, days = training_period()
    floor = ColumnLines()
    measured = natural_lines(frame, days, ["steady", "wandering"], ["carrier"], 7, floor)
    assert measured is not None and measured.windows == 28 - 7 + 1
    lines = measured.columns
    assert lines["steady"] == floor  # it never moved past the configured lines
    assert lines["carrier"].psi_fail == floor.psi_fail
    assert lines["wandering"].psi_fail > 1.0 > floor.psi_fail  # its weeks differ a lot
    assert lines["wandering"].psi_warn <= lines["wandering"].psi_fail
    assert set(lines) == {"steady", "wandering", "carrier", "probability"}
    # A week like the training period's own is judged by them: no failure.
    thresholds = DriftThresholds().with_columns(lines)
    week = frame[days.isin(sorted(set(days))[7:14])]
    report = compare(frame, week, ["steady", "wandering"], ["carrier"], thresholds)
    assert "wandering" in compare(frame, week, ["steady", "wandering"], ["carrier"]).failed
    assert report.failed == [] and not report.drift_event
    # A move past anything seen in training still fails.
    moved = week.assign(wandering=week["wandering"] + 40)
    assert compare(frame, moved, ["steady", "wandering"], ["carrier"], thresholds).failed == [
        "wandering"
    ]
    assert NaturalLines.from_dict(measured.to_dict()) == measured


def test_a_period_shorter_than_two_windows_measures_no_lines_and_rules_are_checked():
    frame, days = training_period(days=13)
    assert natural_lines(frame, days, ["steady"], [], 7, ColumnLines()) is None
    with pytest.raises(ValueError, match=r"warn <= fail <= 1 with 'quantiles', got 0.9, 1.5"):
        LineRule("quantiles", 0.9, 1.5)
    with pytest.raises(ValueError, match=r"warn <= fail with 'deviations', got 3, 2"):
        LineRule("deviations", 3, 2)


def test_the_rule_sets_lines_from_the_windows_spread():
    values = np.array([0.4, 0.5, 0.6, 0.5, 0.5])  # mean 0.5, standard deviation 0.0632
    deviation = values.std()
    assert rule_lines(LineRule(), values, (0.1, 0.25)) == pytest.approx(
        (0.5 + 2 * deviation, 0.5 + 3 * deviation)
    )
    assert rule_lines(LineRule("quantiles", 0.5, 1.0), values, (0.1, 0.25)) == (0.5, 0.6)
    assert rule_lines(LineRule(), values / 100, (0.1, 0.25)) == (0.1, 0.25)  # never below the floor
    assert rule_lines(LineRule(), np.array([]), (0.1, 0.25)) == (0.1, 0.25)
    # Past the most a column moved in a few windows, but within its spread: not a failure.
    frame, days = training_period()
    columns = (["steady", "wandering"], ["carrier"])
    deviations = natural_lines(frame, days, *columns, 7, ColumnLines())
    most = natural_lines(frame, days, *columns, 7, ColumnLines(), LineRule("quantiles", 0.9, 1))
    assert deviations is not None and most is not None
    assert deviations.columns["wandering"].psi_fail > most.columns["wandering"].psi_fail
    assert "mean + 3 standard deviations" in deviations.describe()
    assert "fail at their 1 quantile" in most.describe()


def test_lines_registered_before_the_rule_was_a_choice_are_read_as_quantiles():
    document = {"window_days": 7, "windows": 15, "warn_quantile": 0.9, "fail_quantile": 1.0,
                "columns": {"temp": {"psi_warn": 0.2, "psi_fail": 0.3, "ks_warn": 0.1,
                                     "ks_fail": 0.2}}}  # fmt: skip
    lines = NaturalLines.from_dict(document)
    assert lines.rule == LineRule("quantiles", 0.9, 1.0)
    assert lines.columns["temp"] == ColumnLines(0.2, 0.3, 0.1, 0.2)


def test_the_ks_statistic_of_the_lines_is_scipys():
    from scipy.stats import ks_2samp

    a, b = rng.normal(0, 1, 3000), rng.normal(0.2, 1.3, 1700)
    b[:50] = a[:50]  # ties across the samples
    assert _ks_statistic(a, b) == pytest.approx(ks_2samp(a, b).statistic, abs=1e-12)  # type: ignore[attr-defined]
    assert _ks_statistic(a, np.array([])) is None


def test_a_calendar_column_is_measured_and_shown_but_never_flagged():
    reference = frame(3000).assign(month=2)
    march = frame(1000).assign(month=3)  # every day after training is a month never seen
    columns = (["temp", "month"], ["carrier"])
    assert compare(reference, march, *columns).failed == ["month"]
    report = compare(reference, march, *columns, DriftThresholds(calendar=("month",)))
    month = next(c for c in report.columns if c.name == "month")
    assert month.psi > 5 and month.ks_statistic == 1.0 and month.level == "ok"
    assert report.failed == report.warned == [] and report.level == "ok"
    assert "| month | numeric | calendar: not judged |" in report.table()
    # A calendar declaration silences that column, no other.
    hot = march.assign(temp=march["temp"] + 40)
    assert compare(reference, hot, *columns, DriftThresholds(calendar=("month",))).failed == [
        "temp"
    ]
