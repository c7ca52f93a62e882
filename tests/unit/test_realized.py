"""Realized performance as plain functions: bootstrap intervals, the verdict against the test
figure, slices."""

import math

import numpy as np
import pandas as pd
import pytest

from declare.policies import DecayPolicy
from ml.metrics import SliceSpec, binary_metrics
from ml.realized import judge, measure, realized

pytestmark = pytest.mark.unit


def scored_day(rows: int = 2000, signal: float = 1.5, seed: int = 3):
    """Labels and a model's probabilities that carry `signal` about them."""
    rng = np.random.default_rng(seed)
    labels = (rng.random(rows) < 0.25).astype("float64")
    logits = signal * (labels - 0.25) + rng.normal(0, 1, rows) - 1
    return labels, 1 / (1 + np.exp(-logits))


POLICY = DecayPolicy().for_task("binary")


def test_the_model_as_tested_passes_and_a_shuffled_one_fails():
    labels, scores = scored_day()
    tested = binary_metrics(labels, scores, 0.3).roc_auc
    same = realized(labels, scores, "binary", {"roc_auc": tested}, POLICY, threshold=0.3)
    assert same.overall.verdict == "ok"
    assert same.overall.measured.low <= tested <= same.overall.measured.high
    assert same.metrics["roc_auc"] == pytest.approx(tested)
    shuffled = np.random.default_rng(0).permutation(scores)  # a model that learned nothing
    broken = realized(labels, shuffled, "binary", {"roc_auc": tested}, POLICY, threshold=0.3)
    assert broken.overall.verdict == "failed"
    assert "worse by more than 10%" in broken.overall.reason


def test_a_decay_the_sample_cannot_explain_warns_before_it_fails():
    labels, scores = scored_day(rows=6000, signal=1.5)
    tested = binary_metrics(labels, scores, 0.3).roc_auc
    weaker_labels, weaker = scored_day(rows=6000, signal=1.2, seed=4)
    report = realized(weaker_labels, weaker, "binary", {"roc_auc": tested}, POLICY, threshold=0.3)
    value = report.overall.measured.value
    assert tested * 0.9 < value < tested  # worse, within the 10% budget
    assert report.overall.measured.high < tested
    assert report.overall.verdict == "decayed"


def test_too_few_rows_or_one_class_are_reported_not_judged():
    labels, scores = scored_day(rows=30)
    few = realized(labels, scores, "binary", {"roc_auc": 0.7}, POLICY, threshold=0.3)
    assert few.overall.verdict == "not_judged" and "30 rows < 50" in few.overall.reason
    one_class = realized(
        np.zeros(200), scores.repeat(7)[:200], "binary", {"roc_auc": 0.7}, POLICY, threshold=0.3
    )
    assert one_class.overall.verdict == "not_judged"
    assert math.isnan(one_class.overall.measured.value)


def test_the_interval_is_seeded_and_narrows_with_rows():
    labels, scores = scored_day(rows=4000)
    a = measure(labels, scores, "roc_auc", "binary", 0.3, samples=200, seed=1)
    b = measure(labels, scores, "roc_auc", "binary", 0.3, samples=200, seed=1)
    assert a == b
    small = measure(labels[:400], scores[:400], "roc_auc", "binary", 0.3, samples=200, seed=1)
    assert small.high - small.low > a.high - a.low > 0


def test_a_regression_is_judged_by_its_rmse_rising():
    rng = np.random.default_rng(0)
    labels = rng.normal(10, 3, 500)
    good = labels + rng.normal(0, 1, 500)
    policy = DecayPolicy().for_task("regression")
    assert policy.metric == "rmse"
    tested = float(np.sqrt(np.mean((good - labels) ** 2)))
    assert realized(labels, good, "regression", {"rmse": tested}, policy).overall.verdict == "ok"
    worse = labels + rng.normal(0, 2, 500)
    assert realized(labels, worse, "regression", {"rmse": tested}, policy).overall.verdict == (
        "failed"
    )


def test_slices_report_their_rows_and_intervals():
    labels, scores = scored_day(rows=1000)
    frame = pd.DataFrame({"carrier": np.where(np.arange(1000) % 4 == 0, "AA", "UA")})
    report = realized(
        labels,
        scores,
        "binary",
        {"roc_auc": 0.7},
        POLICY,
        threshold=0.3,
        frame=frame,
        slices=[SliceSpec("carrier", "carrier")],
    )
    assert [(s["group"], s["rows"]) for s in report.slices] == [("AA", 250), ("UA", 750)]
    assert all(s["low"] <= s["value"] <= s["high"] for s in report.slices)
    assert report.to_dict()["overall"]["verdict"] == report.overall.verdict


def test_a_policy_out_of_range_is_refused():
    with pytest.raises(ValueError, match="max_drop"):
        DecayPolicy("roc_auc", max_drop=1.5)
    with pytest.raises(ValueError, match="metric"):
        DecayPolicy("accuracy_at_k")
    assert (
        judge(
            measure(np.array([]), np.array([]), "rmse", "regression"),
            1.0,
            "rmse",
            DecayPolicy("rmse"),
        ).verdict
        == "not_judged"
    )


def test_the_bootstraps_roc_auc_is_the_metrics_one():
    from ml.metrics import roc_auc

    labels, scores = scored_day(rows=700)
    scores = np.round(scores, 2)  # ties across the classes
    assert roc_auc(labels, scores) == binary_metrics(labels, scores, 0.3).roc_auc
    assert math.isnan(roc_auc(np.ones(20), scores[:20]))


def test_the_plots_draw_days_windows_and_slices_undefined_figures_included():
    import json

    from ml import plots

    labels, scores = scored_day(rows=600)
    frame = pd.DataFrame({"hour": np.arange(600) % 24})
    spec = SliceSpec("hour_band", "hour", edges=(0, 12, 24), labels=("am", "pm"))

    def document(day: str, rows: np.ndarray) -> dict:
        report = realized(
            labels[rows], scores[rows], "binary", {"roc_auc": 0.7}, POLICY, threshold=0.3,
            frame=frame.iloc[rows].reset_index(drop=True), slices=[spec],
        )  # fmt: skip
        # As the asset writes and reads it: JSON, an undefined figure as NaN.
        return json.loads(json.dumps({"partition": day, "day": report.to_dict(),
                                      "trailing_window": report.to_dict()}))  # fmt: skip

    one_class = np.flatnonzero(labels == 0)[:100]
    history = [document("2013-03-01", np.arange(600)), document("2013-03-02", one_class)]
    assert math.isnan(history[1]["day"]["overall"]["value"])  # one class: no ROC AUC
    png = plots.realized_over_time(history, 0.7, "roc_auc")
    assert png.startswith(b"\x89PNG")
    by_slice = plots.realized_slices(history[0]["trailing_window"]["slices"], 0.7, "roc_auc")
    assert by_slice.startswith(b"\x89PNG") and by_slice != png
