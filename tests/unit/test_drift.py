import math

import numpy as np
import pandas as pd
import pytest

from ml.drift import (
    DriftThresholds,
    categorical_counts,
    column_drift,
    compare,
    numeric_counts,
    psi,
    reference_sample,
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
