"""Metrics overall, per slice and per calibration bin, and the figures drawn from them."""

import json
import math

import numpy as np
import pandas as pd
import pytest
from sklearn import metrics as sk

from ml.metrics import (
    MISSING,
    OUT_OF_RANGE,
    BaselineComparison,
    BinaryMetrics,
    Evaluation,
    RegressionMetrics,
    SliceSpec,
    best_threshold,
    binary_metrics,
    calibration_bins,
    evaluate,
    regression_metrics,
    roc_curve,
)
from ml.plots import (
    calibration_plot,
    loss_curve,
    predicted_vs_actual,
    residuals,
    roc_curves,
    slice_bars,
    warm_up,
)

pytestmark = pytest.mark.unit

HOUR_BAND = SliceSpec(
    "hour_band",
    "flight_schedule__dep_hour",
    (0, 6, 12, 18, 24),
    ("night", "morning", "afternoon", "evening"),
)
CARRIER = SliceSpec("carrier", "flight_schedule__carrier_code")


def scored(rows: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Labels drawn from the probabilities themselves: calibrated, and informative."""
    rng = np.random.default_rng(seed)
    probabilities = rng.beta(2, 5, rows)
    labels = (rng.random(rows) < probabilities).astype("float64")
    return labels, probabilities


def test_metrics_agree_with_scikit_learn_at_the_chosen_threshold():
    labels, probabilities = scored()
    got = binary_metrics(labels, probabilities, threshold=0.3)
    predicted = (probabilities >= 0.3).astype(int)
    assert got.rows == 2000
    assert got.positive_rate == pytest.approx(labels.mean())
    assert got.log_loss == pytest.approx(sk.log_loss(labels, probabilities))
    assert got.roc_auc == pytest.approx(sk.roc_auc_score(labels, probabilities))
    assert got.average_precision == pytest.approx(sk.average_precision_score(labels, probabilities))
    assert got.brier == pytest.approx(sk.brier_score_loss(labels, probabilities))
    assert got.threshold == 0.3
    assert got.accuracy == pytest.approx(sk.accuracy_score(labels, predicted))
    assert got.f1 == pytest.approx(sk.f1_score(labels, predicted))
    assert binary_metrics(labels, probabilities).threshold == 0.5


def tied(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores on a coarse grid (many ties) or continuous, float32 or float64, and labels drawn
    from them."""
    rng = np.random.default_rng(seed)
    rows = int(rng.integers(2, 3000))
    levels = int(rng.integers(1, 40))
    probabilities = rng.integers(0, levels + 1, rows) / levels if seed % 2 else rng.random(rows)
    probabilities = probabilities.astype("float32" if seed % 3 == 0 else "float64")
    labels = (rng.random(rows) < probabilities).astype("float64")
    # Both classes, and two confident mistakes: log loss clips them.
    labels[:2], probabilities[:2] = [0, 1], [1, 0]
    return labels, probabilities


@pytest.mark.parametrize("seed", range(40))
def test_metrics_are_scikit_learns_to_rounding_on_tied_and_extreme_scores(seed):
    labels, probabilities = tied(seed)
    got = binary_metrics(labels, probabilities)
    as_float64 = probabilities.astype("float64")  # what binary_metrics measures
    expected = {
        "log_loss": sk.log_loss(labels, as_float64, labels=[0, 1]),
        "roc_auc": sk.roc_auc_score(labels, as_float64),
        "average_precision": sk.average_precision_score(labels, as_float64),
        "brier": sk.brier_score_loss(labels, as_float64),
    }
    assert {k: getattr(got, k) for k in expected} == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert {type(v) for v in got.as_dict().values()} == {int, float}  # plain, serializable


@pytest.mark.parametrize("seed", range(20))
def test_the_roc_curve_has_scikit_learns_points(seed):
    labels, probabilities = tied(seed)
    fpr, tpr = roc_curve(labels, probabilities)
    expected_fpr, expected_tpr, _ = sk.roc_curve(labels, probabilities.astype("float64"))
    np.testing.assert_array_equal(fpr, expected_fpr)
    np.testing.assert_array_equal(tpr, expected_tpr)


def test_a_roc_curve_needs_both_classes():
    with pytest.raises(ValueError, match="both classes"):
        roc_curve(np.zeros(3), np.array([0.1, 0.2, 0.3]))


def test_all_scores_equal_give_the_chance_diagonal():
    labels, probabilities = np.array([0, 1, 1, 0, 1]), np.full(5, 0.4)
    assert binary_metrics(labels, probabilities).roc_auc == 0.5
    assert [a.tolist() for a in roc_curve(labels, probabilities)] == [[0, 1], [0, 1]]
    assert binary_metrics(labels, probabilities).average_precision == pytest.approx(0.6)


def test_one_class_leaves_the_ranking_metrics_undefined_and_f1_without_positives_too():
    got = binary_metrics(np.zeros(4), np.array([0.1, 0.2, 0.3, 0.4]))
    assert math.isnan(got.roc_auc) and math.isnan(got.average_precision)
    assert math.isnan(got.f1)  # no positive labels, no positive predictions
    assert got.accuracy == 1.0


@pytest.mark.parametrize(
    ("labels", "probabilities", "threshold", "message"),
    [
        ([], [], 0.5, "0 labels"),
        ([0, 1], [0.5], 0.5, "2 labels for 1"),
        ([0, 1], [0.5, math.nan], 0.5, "1 probabilities are NaN"),
        ([0, 1], [-0.1, 1.2], 0.5, "2 probabilities"),
        ([0, 2], [0.1, 0.2], 0.5, "1 labels are neither"),
        ([0, 1], [0.1, 0.2], math.nan, "threshold=nan"),
        ([0, 1], [0.1, 0.2], 1.5, "threshold=1.5"),
    ],
)
def test_bad_inputs_are_refused(labels, probabilities, threshold, message):
    with pytest.raises(ValueError, match=message):
        binary_metrics(np.array(labels), np.array(probabilities), threshold)


def test_the_best_threshold_maximises_f1_over_every_candidate():
    labels, probabilities = scored(500, seed=3)
    chosen = best_threshold(labels, probabilities)
    f1 = {  # every candidate by brute force; sklearn's f1_score is too slow for 500 of them
        t: 2 * (labels * (probabilities >= t)).sum() / ((probabilities >= t).sum() + labels.sum())
        for t in np.unique(probabilities)
    }
    assert chosen in f1
    assert f1[chosen] == pytest.approx(max(f1.values()))
    assert binary_metrics(labels, probabilities, chosen).f1 == pytest.approx(max(f1.values()))


def test_the_best_threshold_on_a_small_example_breaks_ties_toward_fewer_positives():
    # F1 at 0.9: 2*1/(1+2) = 2/3; at 0.3: 2*2/(4+2) = 2/3 too; at 0.7 and 0.5 less. The tie goes
    # to the higher threshold.
    labels = np.array([1, 0, 0, 1, 0])
    probabilities = np.array([0.9, 0.7, 0.5, 0.3, 0.1])
    assert best_threshold(labels, probabilities) == 0.9
    assert best_threshold(labels[::-1], probabilities[::-1]) == 0.9  # row order does not matter
    assert best_threshold(np.array([0, 1, 1, 0]), np.array([0.8, 0.6, 0.4, 0.2])) == 0.4
    # Equal probabilities are one candidate: all rows at 0.5 are predicted alike.
    assert best_threshold(np.array([1, 0, 1]), np.array([0.5, 0.5, 0.2])) == 0.2


def test_without_positives_the_best_threshold_is_the_default():
    assert best_threshold(np.zeros(3), np.array([0.1, 0.5, 0.9])) == 0.5


def test_a_perfectly_calibrated_model_has_no_calibration_error():
    # In each bin the observed rate equals the probability: 1 of 4 at 0.25, 3 of 4 at 0.75.
    labels = np.array([1, 0, 0, 0, 1, 1, 1, 0])
    probabilities = np.array([0.25] * 4 + [0.75] * 4)
    assert binary_metrics(labels, probabilities).calibration_error == pytest.approx(0.0)


def test_a_badly_calibrated_model_has_its_gap_weighted_by_rows():
    # 8 rows at 0.9 never positive (gap 0.9), 2 rows at 0.05 always positive (gap 0.95).
    labels = np.array([0] * 8 + [1] * 2)
    probabilities = np.array([0.9] * 8 + [0.05] * 2)
    got = binary_metrics(labels, probabilities).calibration_error
    assert got == pytest.approx(0.8 * 0.9 + 0.2 * 0.95)


def test_calibration_bins_omit_empty_bins_and_put_one_in_the_last():
    labels = np.array([0, 1, 1, 0, 1])
    probabilities = np.array([0.05, 0.07, 1.0, 0.95, 0.55])
    bins = calibration_bins(labels, probabilities)
    assert [(b.lower, b.upper, b.rows) for b in bins] == [
        (0.0, 0.1, 2),
        (0.5, 0.6, 1),
        (0.9, 1.0, 2),
    ]
    assert bins[0].mean_probability == pytest.approx(0.06) and bins[0].observed_rate == 0.5
    assert bins[2].observed_rate == 0.5
    assert [b.rows for b in calibration_bins(labels, probabilities, bins=2)] == [2, 3]


def test_binned_slices_follow_their_edges_and_name_missing_and_out_of_range_rows():
    hours = pd.Series([0, 5, 6, 11.5, 12, 23, None, 24, -1], dtype="Float64")
    assert HOUR_BAND.values(hours).tolist() == [
        "night",
        "night",
        "morning",
        "morning",
        "afternoon",
        "evening",
        MISSING,
        OUT_OF_RANGE,
        OUT_OF_RANGE,
    ]


def test_unbinned_slices_take_each_distinct_value():
    carriers = pd.Series(["UA", None, "EV"], dtype="string")
    assert CARRIER.values(carriers).tolist() == ["UA", MISSING, "EV"]
    assert SliceSpec("n", "n").values(pd.Series([7.0, None])).tolist() == ["7", MISSING]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [
        (("", "c"), "name"),
        (("s", ""), "column"),
        (("s", "c", (0, 6, 12), ("night",)), "labels"),
        (("s", "c", (), ("night",)), "labels"),
        (("s", "c", (6, 0), ("x",)), "edges"),
        (("s", "c", (0,), ()), "edges"),
        (("s", "c", (0, 1, 2), ("x", "x")), "labels"),
    ],
)
def test_a_malformed_slice_spec_is_refused_naming_the_field(arguments, field):
    with pytest.raises(ValueError, match=field):
        SliceSpec(*arguments)


def flights(labels: np.ndarray, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    carriers = np.where(np.arange(len(labels)) < 20, "OO", rng.choice(["UA", "EV"], len(labels)))
    return pd.DataFrame(
        {
            "flight_schedule__carrier_code": pd.array(carriers, dtype="string"),
            "flight_schedule__dep_hour": rng.integers(0, 24, len(labels)),
        },
        index=np.arange(len(labels)) + 1000,  # positions, not the index, align rows
    )


def test_evaluate_scores_each_slice_and_skips_small_or_single_class_ones():
    labels, probabilities = scored()
    frame = flights(labels)
    labels[frame["flight_schedule__dep_hour"].to_numpy() < 6] = 0  # night: one class only
    got = evaluate(labels, probabilities, frame, [CARRIER, HOUR_BAND], 0.4, min_slice_rows=50)

    assert got.overall == binary_metrics(labels, probabilities, 0.4)
    assert [(s.slice, s.value) for s in got.slices] == [
        ("carrier", "EV"),
        ("carrier", "OO"),
        ("carrier", "UA"),
        ("hour_band", "night"),
        ("hour_band", "morning"),
        ("hour_band", "afternoon"),
        ("hour_band", "evening"),
    ]
    assert sum(s.rows for s in got.slices if s.slice == "carrier") == 2000
    oo, night = got.slice("carrier", "OO"), got.slice("hour_band", "night")
    assert oo.metrics is None and oo.skipped == "20 rows < 50"
    assert night.metrics is None and night.skipped is not None
    assert night.skipped.startswith("one class only (0 positives")
    ua = got.slice("carrier", "UA")
    inside = (frame["flight_schedule__carrier_code"] == "UA").to_numpy()
    assert ua.metrics == binary_metrics(labels[inside], probabilities[inside], 0.4)
    assert ua.positives == int(labels[inside].sum()) and ua.skipped is None
    assert sum(b.rows for b in got.calibration) == 2000
    with pytest.raises(KeyError, match="carrier=AA"):
        got.slice("carrier", "AA")


def test_evaluate_refuses_a_missing_slice_column_naming_it():
    labels, probabilities = scored(100)
    with pytest.raises(ValueError, match="flight_schedule__dep_hour"):
        evaluate(labels, probabilities, flights(labels).iloc[:, :1], [HOUR_BAND], 0.5, 10)
    with pytest.raises(ValueError, match="min_slice_rows"):
        evaluate(labels, probabilities, flights(labels), [HOUR_BAND], 0.5, 0)


def test_an_evaluation_survives_json_and_a_missing_metric_comes_back_as_nan():
    labels, probabilities = scored(400)
    labels[:] = 0  # one class: roc_auc and average_precision are NaN overall
    got = evaluate(labels, probabilities, flights(labels), [CARRIER], 0.5, 10)
    text = json.dumps(got.to_dict(), allow_nan=False)
    back = Evaluation.from_dict(json.loads(text))
    assert math.isnan(back.overall.roc_auc) and math.isnan(back.overall.average_precision)
    assert back.to_dict() == got.to_dict()
    assert back.slices == got.slices  # skipped slices hold no NaN
    assert back.calibration == got.calibration
    partial = {k: v for k, v in got.overall.as_dict().items() if k != "f1"}
    assert math.isnan(BinaryMetrics.from_dict(partial).f1)


def test_the_figures_are_png_images():
    warm_up()  # what trained_model runs in a thread while it waits: harmless before any figure
    labels, probabilities = scored(300)
    other = np.clip(probabilities + 0.1, 0, 1)
    frame = flights(labels)
    challenger = evaluate(labels, probabilities, frame, [CARRIER, HOUR_BAND], 0.5, 30)
    champion = evaluate(labels, other, frame, [CARRIER, HOUR_BAND], 0.5, 30)
    figures = [
        roc_curves({"challenger": (labels, probabilities), "one class": (np.zeros(3), other[:3])}),
        calibration_plot(
            {"challenger": challenger.calibration, "champion v3": champion.calibration}
        ),
        slice_bars(challenger, champion),
        slice_bars(challenger, None, metric="log_loss"),
        slice_bars(Evaluation(challenger.overall), None),
    ]
    assert all(f.startswith(b"\x89PNG") for f in figures)
    with pytest.raises(ValueError, match="metric='auc'"):
        slice_bars(challenger, None, metric="auc")


def test_each_evaluated_slice_value_gets_an_interval_around_its_bar_wider_when_smaller():
    from ml.realized import slice_intervals

    labels, probabilities = scored()
    frame = flights(labels)
    got = evaluate(labels, probabilities, frame, [CARRIER, HOUR_BAND], 0.4, min_slice_rows=50)
    slices = [CARRIER, HOUR_BAND]
    intervals = slice_intervals(got, frame, slices, labels, probabilities, 0.4)

    judged = {(s.slice, s.value) for s in got.slices if s.metrics is not None}
    assert set(intervals) == judged  # the skipped OO (20 rows) gets none
    for key, (low, high) in intervals.items():
        value = got.slice(*key).metrics.roc_auc  # type: ignore[union-attr]
        assert low <= value <= high, key
    widths = {key: high - low for key, (low, high) in intervals.items()}
    sizes = {key: got.slice(*key).rows for key in intervals}
    smallest, largest = min(sizes, key=sizes.__getitem__), max(sizes, key=sizes.__getitem__)
    assert widths[smallest] > widths[largest]
    assert slice_bars(got, None, intervals=intervals).startswith(b"\x89PNG")
    # Seeded: the same rows give the same intervals.
    assert intervals == slice_intervals(
        got, frame, [CARRIER, HOUR_BAND], labels, probabilities, 0.4
    )


def test_regression_metrics_match_the_hand_computed_values():
    got = regression_metrics(np.array([1.0, 2.0, 3.0, 4.0]), np.array([1.5, 2.0, 2.5, 5.0]))
    # Errors 0.5, 0, -0.5, 1: squared, 1.5 in all; the labels' squared deviation is 5.
    assert (got.rows, got.label_mean, got.mae, got.mean_error) == (4, 2.5, 0.5, 0.25)
    assert got.rmse == pytest.approx(math.sqrt(1.5 / 4))
    assert got.r2 == pytest.approx(1 - 1.5 / 5)
    assert math.isnan(regression_metrics(np.array([3.0, 3.0]), np.array([2.0, 4.0])).r2)


@pytest.mark.parametrize(
    ("labels", "predictions", "message"),
    [
        ([], [], "0 labels for 0 predictions"),
        ([1.0, 2.0], [1.0], "2 labels for 1 predictions"),
        ([1.0, math.nan], [1.0, 2.0], "1 labels are NaN or infinite"),
        ([1.0, 2.0], [math.inf, 2.0], "1 predictions are NaN or infinite"),
    ],
)
def test_bad_regression_inputs_are_refused(labels, predictions, message):
    with pytest.raises(ValueError, match=message):
        regression_metrics(np.array(labels), np.array(predictions))


def predicted(rows: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.normal(300, 50, rows)
    return labels, labels + rng.normal(5, 20, rows)


def test_evaluate_a_regression_per_slice_skipping_small_or_constant_ones():
    labels, predictions = predicted()
    frame = flights(labels)
    night = frame["flight_schedule__dep_hour"].to_numpy() < 6
    labels[night] = 120.0  # one label value only
    got = evaluate(labels, predictions, frame, [CARRIER, HOUR_BAND], None, 50, task="regression")
    assert got.task == "regression" and got.calibration == [] and got.baseline is None
    assert got.overall == regression_metrics(labels, predictions)
    oo, ev = got.slice("carrier", "OO"), got.slice("carrier", "EV")
    assert oo.metrics is None and oo.skipped == "20 rows < 50" and oo.positives is None
    inside = (frame["flight_schedule__carrier_code"] == "EV").to_numpy()
    assert ev.metrics == regression_metrics(labels[inside], predictions[inside])
    night_band = got.slice("hour_band", "night")
    assert night_band.metrics is None
    assert night_band.skipped == f"one label value only (120 in {int(night.sum()):,} rows)"


def test_evaluate_takes_a_threshold_for_binary_only_and_a_baseline_of_the_same_rows():
    labels, predictions = predicted(100)
    frame = flights(labels)
    with pytest.raises(ValueError, match=r"threshold=0\.5: a regression evaluation has none"):
        evaluate(labels, predictions, frame, [], 0.5, 10, task="regression")
    with pytest.raises(ValueError, match="threshold: a binary evaluation needs one"):
        evaluate(*scored(100), frame, [], None, 10)
    with pytest.raises(ValueError, match="task='ranking'"):
        evaluate(labels, predictions, frame, [], None, 10, task="ranking")
    with pytest.raises(ValueError, match="baseline has 99 rows for 100 labels"):
        evaluate(labels, predictions, frame, [], task="regression", baseline=labels[1:])
    with pytest.raises(ValueError, match="baseline: no row has a finite value"):
        evaluate(labels, predictions, frame, [], task="regression", baseline=labels * np.nan)
    naive = np.full(100, labels.mean())
    naive[:10] = np.nan  # e.g. no week before to repeat
    got = evaluate(labels, predictions, frame, [], task="regression", baseline=naive)
    assert got.baseline == BaselineComparison(
        baseline=regression_metrics(labels[10:], naive[10:]),
        model=regression_metrics(labels[10:], predictions[10:]),
    )
    assert got.overall == regression_metrics(labels, predictions)  # every row


def test_a_regression_evaluation_survives_json_with_its_baseline_and_skipped_slices():
    labels, predictions = predicted(400)
    frame = flights(labels)
    got = evaluate(
        labels, predictions, frame, [CARRIER], None, 30, task="regression", baseline=labels + 9
    )
    text = json.dumps(got.to_dict(), allow_nan=False)
    back = Evaluation.from_dict(json.loads(text))
    assert back == got and back.to_dict() == got.to_dict()
    assert json.loads(text)["task"] == "regression"
    constant = evaluate(np.ones(4), np.ones(4), frame.head(4), [], task="regression")
    assert math.isnan(Evaluation.from_dict(constant.to_dict()).overall.r2)  # None in the JSON
    partial = {k: v for k, v in got.overall.as_dict().items() if k != "mae"}
    assert math.isnan(RegressionMetrics.from_dict(partial).mae)


def test_a_binary_evaluation_keeps_its_json_shape():
    labels, probabilities = scored(300)
    document = evaluate(labels, probabilities, flights(labels), [CARRIER], 0.5, 30).to_dict()
    assert list(document) == ["overall", "slices", "calibration"]
    assert list(document["overall"]) == list(BinaryMetrics.__dataclass_fields__)
    assert all(isinstance(s["positives"], int) for s in document["slices"])


def test_the_regression_figures_are_png_images():
    labels, predictions = predicted(8_000)
    frame = flights(labels)
    challenger = evaluate(labels, predictions, frame, [CARRIER], task="regression")
    champion = evaluate(labels, predictions + 3, frame, [CARRIER], task="regression")
    figures = [
        predicted_vs_actual(
            {"challenger": (labels, predictions), "empty": (labels[:0], labels[:0])}
        ),
        residuals({"challenger": (labels, predictions), "champion": (labels, predictions + 3)}),
        slice_bars(challenger, champion),  # RMSE by default
        slice_bars(challenger, None, metric="mae"),
        loss_curve([1.0, 0.5], [1.1, 0.6], 2, "mean squared error of the standardized label"),
    ]
    assert all(f.startswith(b"\x89PNG") for f in figures)
    with pytest.raises(ValueError, match="metric='roc_auc': not a field of RegressionMetrics"):
        slice_bars(challenger, None, metric="roc_auc")
