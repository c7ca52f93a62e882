"""The promotion gate: each rule passes and fails, NaN never passes, the report survives JSON."""

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from declare.gate import (
    GATE_RULES,
    POLICIES,
    TASKS,
    GatePolicy,
    MulticlassGatePolicy,
    RegressionGatePolicy,
    policy_from_dict,
    rule_names,
    rules_table,
)
from ml.backtest import FoldResult
from ml.gate import FoldComparison, GateReport, decide, no_fold_regression
from ml.metrics import (
    BaselineComparison,
    BinaryMetrics,
    Evaluation,
    RegressionMetrics,
    SliceMetrics,
    SliceSpec,
    evaluate,
)

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]

POLICY = GatePolicy()


def metrics(**changes: float) -> BinaryMetrics:
    good = BinaryMetrics(
        rows=10_000,
        positive_rate=0.2,
        log_loss=0.42,
        roc_auc=0.72,
        average_precision=0.41,
        brier=0.14,
        calibration_error=0.02,
        threshold=0.3,
        accuracy=0.78,
        f1=0.45,
    )
    return dataclasses.replace(good, **changes)


def carrier(value: str, rows: int = 1_204, **changes: float) -> SliceMetrics:
    return SliceMetrics("carrier", value, rows, rows // 5, metrics(rows=rows, **changes))


def skipped(value: str, rows: int = 37) -> SliceMetrics:
    return SliceMetrics("carrier", value, rows, 5, None, f"{rows} rows < 200")


def evaluation(overall: BinaryMetrics | None = None, slices=()) -> Evaluation:
    return Evaluation(overall or metrics(), list(slices), [])


def test_a_good_challenger_without_a_champion_is_promoted_on_the_floor_alone():
    report = decide(evaluation(slices=[carrier("EV")]), None, POLICY, subject="sha256:abc")
    assert report.passed and report.decision == "promote" and report.reasons == []
    assert [r.rule for r in report.rules] == list(rule_names("binary"))
    for rule in ("no_regression", "no_slice_regression"):
        assert report.rule(rule).passed
        assert report.rule(rule).summary == "no champion yet: only the absolute floor applies"
    assert report.rule("absolute_floor").summary == (
        "roc_auc 0.720 ≥ floor 0.650; calibration_error 0.020 ≤ ceiling 0.100"
    )
    assert report.subject == "sha256:abc" and report.champion is None


def test_without_a_champion_a_challenger_under_the_floor_is_still_rejected():
    report = decide(evaluation(metrics(roc_auc=0.612)), None, POLICY)
    assert report.decision == "reject" and not report.passed
    assert report.reasons == ["roc_auc 0.612 < floor 0.650"]


def test_a_badly_calibrated_challenger_fails_the_ceiling():
    report = decide(evaluation(metrics(calibration_error=0.15)), None, POLICY)
    assert report.reasons == ["calibration_error 0.150 > ceiling 0.100"]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_a_non_finite_overall_metric_rejects(bad):
    report = decide(evaluation(metrics(roc_auc=bad)), None, POLICY)
    assert report.decision == "reject"
    shown = "NaN" if math.isnan(bad) else "inf"
    finite = report.rule("finite_metrics")
    assert not finite.passed and finite.failures == [f"overall: roc_auc is {shown}"]
    floor = report.rule("absolute_floor")
    assert not floor.passed and floor.summary == f"roc_auc {shown} not ≥ floor 0.650"


def test_a_nan_metric_the_floor_does_not_look_at_still_rejects():
    report = decide(evaluation(metrics(brier=math.nan)), None, POLICY)
    assert report.rule("absolute_floor").passed
    assert report.reasons == ["1 metrics not finite, first overall: brier is NaN"]


def test_a_nan_in_a_judged_slice_fails_but_one_in_a_too_small_slice_is_not_judged():
    nan_slice = carrier("EV", calibration_error=math.nan)
    report = decide(evaluation(slices=[nan_slice]), None, POLICY)
    assert report.rule("finite_metrics").failures == ["carrier=EV: calibration_error is NaN"]
    small = carrier("OO", rows=150, calibration_error=math.nan)
    assert decide(evaluation(slices=[small]), None, POLICY).passed


def test_a_nan_challenger_roc_auc_never_passes_against_a_real_champion():
    report = decide(evaluation(metrics(roc_auc=math.nan)), evaluation(), POLICY)
    regression = report.rule("no_regression")
    assert not regression.passed
    assert regression.failures == ["roc_auc 0.720 → NaN (not comparable)"]
    assert report.decision == "reject"


def test_a_nan_champion_metric_cannot_be_compared_and_fails():
    report = decide(evaluation(), evaluation(metrics(average_precision=math.nan)), POLICY)
    regression = report.rule("no_regression")
    assert not regression.passed
    assert regression.failures == ["average_precision: the champion's is NaN, cannot compare"]


def test_small_changes_within_tolerance_pass_the_regression_rule():
    champion = evaluation(metrics(roc_auc=0.724, log_loss=0.418, brier=0.1415))
    report = decide(evaluation(), champion, POLICY, champion_version="3")
    assert report.passed and report.champion_version == "3"
    assert report.rule("no_regression").summary.startswith("no worse than champion")


def test_regressions_beyond_tolerance_fail_in_each_direction():
    champion = evaluation(metrics(roc_auc=0.73, log_loss=0.40))
    regression = decide(evaluation(), champion, POLICY).rule("no_regression")
    assert not regression.passed
    assert regression.failures == [
        "roc_auc 0.730 → 0.720 (-0.010 > 0.005)",
        "log_loss 0.400 → 0.420 (+0.020 > 0.005)",
    ]
    # Better in both directions is never a regression.
    better = evaluation(metrics(roc_auc=0.75, log_loss=0.38, brier=0.12, average_precision=0.5))
    assert decide(better, evaluation(), POLICY).passed


def test_only_the_compared_metrics_count():
    champion = evaluation(metrics(log_loss=0.30))
    policy = GatePolicy(compared_metrics=("roc_auc",))
    assert decide(evaluation(), champion, policy).rule("no_regression").passed
    assert not decide(evaluation(), champion, POLICY).rule("no_regression").passed


def test_evaluations_of_different_test_sets_cannot_be_compared():
    report = decide(evaluation(), evaluation(metrics(rows=9_000)), POLICY)
    assert not report.passed
    assert report.rule("no_regression").summary.startswith("evaluated on different test sets")


def test_a_slice_regression_fails_naming_the_slice_while_the_overall_passes():
    champion = evaluation(slices=[carrier("EV", roc_auc=0.701), carrier("UA", roc_auc=0.70)])
    challenger = evaluation(slices=[carrier("EV", roc_auc=0.655), carrier("UA", roc_auc=0.69)])
    report = decide(challenger, champion, POLICY)
    assert report.rule("no_regression").passed and report.rule("absolute_floor").passed
    slices = report.rule("no_slice_regression")
    assert not slices.passed and report.decision == "reject"
    assert slices.failures == ["carrier=EV: roc_auc 0.701 → 0.655 (-0.046 > 0.030), 1,204 rows"]
    assert slices.summary == (
        "1 slices lost more than 0.030 roc_auc: 2 slices compared, 0 skipped "
        "(too few rows or one class)"
    )


def test_small_slices_are_skipped_not_failed():
    champion = evaluation(
        slices=[carrier("EV"), carrier("OO", rows=150, roc_auc=0.9), skipped("HA"), carrier("9E")]
    )
    challenger = evaluation(
        slices=[
            carrier("EV"),
            carrier("OO", rows=150, roc_auc=0.5),  # evaluated, but under the policy's 200 rows
            carrier("HA", roc_auc=0.5),  # skipped in the champion's evaluation
            skipped("9E"),  # skipped in the challenger's
            carrier("YV", roc_auc=0.5),  # absent from the champion's
        ]
    )
    report = decide(challenger, champion, POLICY)
    assert report.passed
    assert report.rule("no_slice_regression").summary == (
        "no slice lost more than 0.030 roc_auc; 1 slices compared, 4 skipped "
        "(too few rows or one class)"
    )


def test_the_report_survives_json_with_nan_and_its_decision():
    champion = evaluation(metrics(average_precision=math.nan), slices=[carrier("EV")])
    challenger = evaluation(metrics(roc_auc=math.nan), slices=[carrier("EV"), skipped("OO")])
    report = decide(challenger, champion, POLICY, champion_version="7", subject="sha256:f00")
    text = report.to_json()
    json.loads(text, parse_constant=pytest.fail)  # no NaN literal: it is null in the JSON
    back = GateReport.from_json(text)
    assert back.to_json() == text
    assert back.decision == "reject" and not back.passed
    assert back.reasons == report.reasons and back.rules == report.rules
    assert back.policy == report.policy and back.created_at == report.created_at
    assert math.isnan(back.challenger.overall.roc_auc)
    assert back.champion is not None and math.isnan(back.champion.overall.average_precision)
    assert back.challenger.slices[1] == skipped("OO")
    assert (back.champion_version, back.subject) == ("7", "sha256:f00")
    with pytest.raises(ValueError, match="contradicts"):
        GateReport.from_json(text.replace('"decision": "reject"', '"decision": "promote"'))


def test_the_gate_judges_real_evaluations_end_to_end():
    rng = np.random.default_rng(0)
    probabilities = rng.beta(2, 5, 3000)
    labels = (rng.random(3000) < probabilities).astype("float64")
    frame = pd.DataFrame({"carrier": rng.choice(["UA", "EV", "OO"], 3000, p=[0.5, 0.47, 0.03])})
    spec = [SliceSpec("carrier", "carrier")]
    good = evaluate(labels, probabilities, frame, spec, 0.3, POLICY.min_slice_rows)
    noisy = np.clip(probabilities + rng.normal(0, 0.15, 3000), 0, 1)
    worse = evaluate(labels, noisy, frame, spec, 0.3, POLICY.min_slice_rows)
    assert good.slice("carrier", "OO").metrics is None  # ~90 rows
    assert decide(good, good, POLICY).passed
    assert decide(good, worse, POLICY).passed
    rejected = decide(worse, good, POLICY)
    assert not rejected.rule("no_regression").passed
    assert not rejected.rule("no_slice_regression").passed


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"min_roc_auc": 1.5}, "min_roc_auc"),
        ({"min_roc_auc": math.nan}, "min_roc_auc"),
        ({"max_calibration_error": -0.1}, "max_calibration_error"),
        ({"max_roc_auc_drop": -0.01}, "max_roc_auc_drop"),
        ({"max_brier_rise": math.inf}, "max_brier_rise"),
        ({"max_slice_roc_auc_drop": math.nan}, "max_slice_roc_auc_drop"),
        ({"min_slice_rows": 0}, "min_slice_rows"),
        ({"compared_metrics": ("accuracy",)}, "compared_metrics"),
        ({"compared_metrics": ()}, "compared_metrics"),
        ({"compared_metrics": ("brier", "brier")}, "compared_metrics"),
    ],
)
def test_a_bad_policy_is_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        GatePolicy(**changes)


def test_each_compared_metric_has_its_tolerance_and_the_policy_round_trips():
    policy = GatePolicy(compared_metrics=["roc_auc", "log_loss"], max_log_loss_rise=0.01)  # type: ignore[arg-type]
    assert policy.compared_metrics == ("roc_auc", "log_loss")
    assert policy.tolerance("roc_auc") == 0.005 and policy.tolerance("log_loss") == 0.01
    assert GatePolicy.from_dict(policy.to_dict()) == policy


# Regression: errors in the label's units (minutes), lower is better.
REGRESSION = RegressionGatePolicy()


def errors(**changes: float) -> RegressionMetrics:
    good = RegressionMetrics(
        rows=10_000, label_mean=42.0, rmse=12.0, mae=8.0, r2=0.55, mean_error=0.4
    )
    return dataclasses.replace(good, **changes)


def line(value: str, rows: int = 1_204, **changes: float) -> SliceMetrics:
    return SliceMetrics("line", value, rows, None, errors(rows=rows, **changes))


def judged(overall: RegressionMetrics | None = None, slices=(), baseline=None) -> Evaluation:
    """An evaluation; with the `baseline` forecast's metrics, on rows the model scores as
    overall."""
    overall = overall or errors()
    versus = None if baseline is None else BaselineComparison(baseline=baseline, model=overall)
    return Evaluation(overall, list(slices), [], versus)


def test_a_good_regression_without_a_champion_is_promoted_on_its_floor_alone():
    report = decide(judged(slices=[line("red")]), None, REGRESSION, subject="sha256:abc")
    assert report.passed and [r.rule for r in report.rules] == list(rule_names("regression"))
    assert report.rule("absolute_floor").summary == "r2 0.55 ≥ floor 0"
    assert report.rule("beats_baseline").summary == "not required by the policy"


def test_regression_ceilings_and_floor_fail_and_none_is_not_judged():
    strict = RegressionGatePolicy(max_rmse=10.0, max_mae=9.0, min_r2=0.6)
    report = decide(judged(), None, strict)
    assert report.reasons == ["rmse 12 > ceiling 10; r2 0.55 < floor 0.6"]
    assert report.rule("absolute_floor").failures == ["rmse 12 > ceiling 10", "r2 0.55 < floor 0.6"]
    unjudged = RegressionGatePolicy(min_r2=None)
    assert decide(judged(errors(r2=-3.0)), None, unjudged).passed
    assert decide(judged(errors(r2=-3.0)), None, unjudged).rule("absolute_floor").summary == (
        "no absolute bar in the policy"
    )


@pytest.mark.parametrize("field", ["rmse", "mae", "r2", "mean_error", "label_mean"])
def test_a_nan_regression_metric_rejects(field):
    report = decide(judged(errors(**{field: math.nan})), judged(), REGRESSION)
    assert report.decision == "reject"
    assert f"overall: {field} is NaN" in report.rule("finite_metrics").failures


def test_a_nan_regression_error_never_passes_the_ceiling_nor_the_champion():
    nan = judged(errors(rmse=math.nan))
    report = decide(nan, judged(), RegressionGatePolicy(max_rmse=20.0))
    assert report.rule("absolute_floor").summary == "rmse NaN not ≤ ceiling 20"
    assert report.rule("no_regression").failures == ["rmse 12 → NaN (not comparable)"]
    champion = decide(judged(), judged(errors(mae=math.nan)), REGRESSION).rule("no_regression")
    assert champion.failures == ["mae: the champion's is NaN, cannot compare"]


def test_regression_tolerances_are_fractions_of_the_champions_error():
    champion = judged(errors(rmse=11.9, mae=7.9))  # challenger 0.8% and 1.3% worse: within 2%
    assert decide(judged(), champion, REGRESSION).rule("no_regression").passed
    worse = decide(judged(errors(rmse=12.5, mae=8.1)), judged(), REGRESSION).rule("no_regression")
    assert not worse.passed
    assert worse.failures == ["rmse 12 → 12.5 (+4.2% > 2.0%)"]
    only_mae = RegressionGatePolicy(compared_metrics=("mae",))
    assert decide(judged(errors(rmse=12.5, mae=8.1)), judged(), only_mae).passed
    better = judged(errors(rmse=6.0, mae=4.0, r2=0.9))
    assert decide(better, judged(), REGRESSION).passed


def test_regressions_of_different_test_rows_cannot_be_compared():
    report = decide(judged(), judged(errors(label_mean=41.0)), REGRESSION)
    assert report.rule("no_regression").summary.startswith("evaluated on different test sets")


def test_a_regressing_slice_fails_naming_it_and_small_slices_are_skipped():
    champion = judged(slices=[line("red", rmse=10.0), line("blue"), line("green", rows=90)])
    challenger = judged(
        slices=[line("red", rmse=11.5), line("blue", rmse=12.9), line("green", rows=90, rmse=99)]
    )
    slices = decide(challenger, champion, REGRESSION).rule("no_slice_regression")
    assert not slices.passed
    assert slices.failures == ["line=red: rmse 10 → 11.5 (+15.0% > 10.0%), 1,204 rows"]
    assert slices.summary == (
        "1 slices' rmse rose more than 10.0%: 2 slices compared, 1 skipped"
        " (too few rows or one label value)"
    )
    assert decide(champion, challenger, REGRESSION).rule("no_slice_regression").passed


def test_beats_baseline_when_required_needs_a_lower_rmse_than_the_baseline():
    policy = RegressionGatePolicy(require_baseline=True)
    naive = errors(rmse=15.0, mae=10.0, r2=0.1)
    passed = decide(judged(baseline=naive), None, policy).rule("beats_baseline")
    assert passed.summary == "rmse 12 < the baseline's 15 on the 10,000 rows it covers"
    assert passed.passed
    for baseline in (errors(rmse=12.0), errors(rmse=math.nan)):
        failed = decide(judged(baseline=baseline), None, policy).rule("beats_baseline")
        assert not failed.passed and failed.failures == [failed.summary]
    missing = decide(judged(), None, policy)
    assert missing.reasons == ["the evaluation has no baseline to compare with"]
    shown = decide(judged(baseline=naive), None, REGRESSION).rule("beats_baseline")
    assert shown.passed and shown.summary == (
        "not required by the policy; rmse 12 < the baseline's 15 on the 10,000 rows it covers"
    )


def test_a_binary_model_must_rank_better_than_the_naive_forecast_when_required():
    policy = GatePolicy(require_baseline=True)

    def versus(naive: BinaryMetrics) -> Evaluation:
        ours = metrics(rows=9_000)
        return Evaluation(metrics(), [], [], BaselineComparison(baseline=naive, model=ours))

    passed = decide(versus(metrics(rows=9_000, roc_auc=0.63)), None, policy)
    assert passed.passed and passed.rule("beats_baseline").summary == (
        "roc_auc 0.720 > the baseline's 0.630 on the 9,000 rows it covers"
    )
    for naive in (metrics(roc_auc=0.72), metrics(roc_auc=0.75), metrics(roc_auc=math.nan)):
        failed = decide(versus(naive), None, policy)
        assert not failed.passed and failed.decision == "reject"
        assert failed.reasons == [failed.rule("beats_baseline").summary]
    assert "not >" in decide(versus(metrics(roc_auc=0.75)), None, policy).reasons[0]
    assert decide(evaluation(), None, policy).reasons == [
        "the evaluation has no baseline to compare with"
    ]
    shown = decide(versus(metrics(roc_auc=0.75)), None, POLICY).rule("beats_baseline")
    assert shown.passed and shown.summary.startswith("not required by the policy; roc_auc 0.720")


def test_a_regression_report_survives_json_with_its_policy():
    champion = judged(errors(mae=math.nan), slices=[line("red")], baseline=errors(rmse=20.0))
    challenger = judged(errors(r2=math.nan), slices=[line("red"), line("blue", rows=12)])
    policy = RegressionGatePolicy(max_rmse=30.0, min_r2=None, require_baseline=True)
    report = decide(challenger, champion, policy, champion_version="2", subject="sha256:b0b")
    text = report.to_json()
    json.loads(text, parse_constant=pytest.fail)
    back = GateReport.from_json(text)
    assert back.to_json() == text and back.policy == policy and back.rules == report.rules
    assert back.challenger.task == "regression" and math.isnan(back.challenger.overall.r2)
    assert back.champion is not None and back.champion.baseline is not None
    assert back.champion.baseline.baseline == errors(rmse=20.0)
    assert json.loads(text)["policy"]["task"] == "regression"
    assert policy_from_dict(POLICY.to_dict()) == POLICY and "task" not in POLICY.to_dict()
    with pytest.raises(KeyError, match="beats_baseline"):
        report.rule("calibration")


def test_the_regression_gate_judges_real_evaluations_end_to_end():
    rng = np.random.default_rng(0)
    labels = rng.normal(40, 15, 3000)
    frame = pd.DataFrame({"line": rng.choice(["red", "blue", "green"], 3000, p=[0.5, 0.47, 0.03])})
    spec = [SliceSpec("line", "line")]
    good_predictions = labels + rng.normal(0, 5, 3000)
    naive = np.full(3000, labels.mean())
    good = evaluate(
        labels, good_predictions, frame, spec, None, 200, task="regression", baseline=naive
    )
    noisy = good_predictions + rng.normal(0, 5, 3000)
    worse = evaluate(labels, noisy, frame, spec, None, 200, task="regression", baseline=naive)
    policy = RegressionGatePolicy(require_baseline=True)
    assert decide(good, None, policy).passed and decide(good, worse, policy).passed
    rejected = decide(worse, good, policy)
    assert not rejected.rule("no_regression").passed
    assert not rejected.rule("no_slice_regression").passed
    assert rejected.rule("beats_baseline").passed  # still far better than the mean


def test_evaluations_of_another_task_are_refused():
    with pytest.raises(ValueError, match="challenger: a regression evaluation cannot be judged"):
        decide(judged(), None, POLICY)
    with pytest.raises(ValueError, match="champion: a binary evaluation cannot be judged"):
        decide(judged(), evaluation(), REGRESSION)


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"max_rmse": 0.0}, "max_rmse"),
        ({"max_mae": math.inf}, "max_mae"),
        ({"min_r2": 1.5}, "min_r2"),
        ({"min_r2": math.nan}, "min_r2"),
        ({"max_rmse_rise_fraction": -0.1}, "max_rmse_rise_fraction"),
        ({"max_mae_rise_fraction": math.nan}, "max_mae_rise_fraction"),
        ({"max_slice_rmse_rise_fraction": math.inf}, "max_slice_rmse_rise_fraction"),
        ({"min_slice_rows": 0}, "min_slice_rows"),
        ({"compared_metrics": ("r2",)}, "compared_metrics"),
        ({"compared_metrics": ()}, "compared_metrics"),
        ({"compared_metrics": ("rmse", "rmse")}, "compared_metrics"),
    ],
)
def test_a_bad_regression_policy_is_refused_naming_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        RegressionGatePolicy(**changes)


def test_every_policy_field_is_read_by_a_rule_of_its_task_and_a_rule_reads_only_fields():
    assert tuple(policy.task for policy in POLICIES) == TASKS
    for policy in POLICIES:
        names = {spec.name for spec in dataclasses.fields(policy)}
        read = {name for r in GATE_RULES if policy.task in r.tasks for name in r.policy_fields}
        assert names <= read, f"{policy.__name__}: no rule names {sorted(names - read)}"
    for rule in GATE_RULES:
        policies = [policy for policy in POLICIES if policy.task in rule.tasks]
        for name in rule.policy_fields:
            assert any(name in policy.__dataclass_fields__ for policy in policies), (rule, name)


def test_the_docs_hold_the_rules_table_as_the_registry_makes_it():
    text = (REPO / "docs" / "serving.md").read_text()
    begin, end = "<!-- gate-rules:", "<!-- end of gate-rules -->"
    assert text.count(begin) == 1 and text.count(end) == 1, "the table's markers"
    held = text.split(begin)[1].split("\n", 1)[1].split(end)[0]
    assert held == rules_table() + "\n", "python -m cli.gate_rules prints the table"


def test_the_rules_table_names_every_rule_with_its_tasks_and_defaults():
    rows = {row.split(" | ")[0].strip("| `"): row for row in rules_table().splitlines()[2:]}
    assert list(rows) == [rule.name for rule in GATE_RULES]
    assert "| `beats_baseline` | binary, regression |" in rows["beats_baseline"]
    assert "`require_baseline` = False" in rows["beats_baseline"]
    floor = rows["absolute_floor"]
    assert "binary: `min_roc_auc` = 0.65, `max_calibration_error` = 0.1;" in floor
    assert "regression: `max_rmse` = None, `max_mae` = None, `min_r2` = 0.0" in floor
    assert rows["finite_metrics"].endswith("| `min_slice_rows` = 200 |")


# Backtest folds: the challenger's catalog entry against the champion's, month by month.
TUNED, BASELINE = "tuned@" + "b" * 64, "baseline@" + "a" * 64
MONTHS = ("2013-02-01", "2013-03-01", "2013-04-01", "2013-05-01")
FOLD_METRIC = {"binary": "roc_auc", "regression": "rmse", "multiclass": "macro_f1"}


def fold(config: str, month: str, value: float, task: str = "binary") -> FoldResult:
    """What the backtest measured for `config` (name@sha256) on `month`: `value`, ± 0.011."""
    name, _, sha256 = config.partition("@")
    metric = FOLD_METRIC[task]
    return FoldResult(
        fold=month,
        window={"start": "2013-01-01", "validation_start": "2013-01-22", "test_start": month},
        entry=name,
        entry_sha256=sha256,
        task=task,
        metric=metric,
        higher_is_better=metric != "rmse",
        value=value,
        low=value - 0.011,
        high=value + 0.011,
        rows=28_000,
        baseline=None,
        baseline_rows=0,
        data_fingerprint="f" * 64,
        weights_sha256="e" * 64,
        mlflow_run_id="run-1",
    )


def folds(config: str, values: Sequence[float], task: str = "binary") -> list[FoldResult]:
    """`config`'s folds of the last `len(values)` months, oldest first."""
    months = MONTHS[len(MONTHS) - len(values) :]
    return [fold(config, m, v, task) for m, v in zip(months, values, strict=True)]


def comparison(ours: Sequence[float], theirs: Sequence[float], **changes) -> FoldComparison:
    """The tuned challenger's folds against the baseline champion's."""
    compared = FoldComparison(TUNED, folds(TUNED, ours), BASELINE, folds(BASELINE, theirs))
    return dataclasses.replace(compared, **changes)


THREE_FOLDS = GatePolicy(backtest_folds=3)


def fold_rule(compared: FoldComparison | None, policy=THREE_FOLDS, champion=True):
    """The gate's report with a binary champion (v4) as good as the challenger, unless there is
    none, and its no_fold_regression rule."""
    report = decide(
        evaluation(),
        evaluation() if champion else None,
        policy,
        champion_version="4" if champion else None,
        folds=compared,
    )
    return report, report.rule("no_fold_regression")


def test_the_last_k_folds_gate_rule_blocks_a_challenger_worse_on_one_fold():
    # February is far worse but not among the last 3 folds; May is worse by 0.015 > 0.005.
    report, rule = fold_rule(comparison([0.60, 0.73, 0.72, 0.705], [0.70, 0.72, 0.72, 0.72]))
    assert report.decision == "reject" and report.reasons == [rule.summary]
    assert rule.summary == (
        "worse than the champion's entry baseline@aaaaaaaaaaaa on 1 of the last 3 folds"
        " (2013-05-01)"
    )
    assert rule.failures == [
        "2013-05-01: roc_auc 0.705 [0.694, 0.716] < champion's 0.720 [0.709, 0.731] - 0.005"
    ]
    assert [r.rule for r in report.rules] == list(rule_names("binary"))


def test_the_last_k_folds_rule_passes_a_challenger_no_worse_on_any_of_them():
    report, rule = fold_rule(comparison([0.60, 0.73, 0.716, 0.72], [0.70, 0.72, 0.72, 0.72]))
    assert report.passed and rule.failures == []
    assert rule.summary == (
        "not worse than the champion's entry baseline@aaaaaaaaaaaa on any of the last 3 folds"
        " (2013-03-01 … 2013-05-01)"
    )


def test_the_fold_rule_is_not_judged_at_zero_folds_nor_without_a_champion():
    worse = comparison([0.5, 0.5, 0.5], [0.7, 0.7, 0.7])
    report, rule = fold_rule(worse, policy=GatePolicy())
    assert report.passed and rule.summary == "not judged: backtest_folds is 0"
    assert fold_rule(None, policy=GatePolicy())[1].passed
    report, rule = fold_rule(worse, champion=False)
    assert report.passed and rule.summary == "no champion yet"
    assert fold_rule(None, champion=False)[1].passed


def test_a_challenger_of_the_champions_own_entry_and_settings_passes_on_the_same_folds():
    report, rule = fold_rule(
        comparison([math.nan], [math.nan], challenger_config=BASELINE, challenger=[])
    )
    assert report.passed
    assert rule.summary == "the champion's entry baseline@aaaaaaaaaaaa: the same folds"


def test_the_fold_rule_fails_when_the_challengers_entry_lacks_folds_naming_the_command():
    report, rule = fold_rule(comparison([0.73, 0.73], [0.72, 0.72, 0.72, 0.72]))
    assert report.decision == "reject"
    assert rule.failures == [
        "the challenger's entry tuned@bbbbbbbbbbbb has 2 of the 3 backtest folds judged; run"
        " them: make backtest CONFIG=tuned FOLDS=2013-03-01...2013-05-01"
    ]


def test_the_fold_rule_fails_when_the_champions_entry_lacks_one_of_the_folds():
    compared = comparison([0.73, 0.73, 0.73], [0.72, 0.72, 0.72])
    compared = dataclasses.replace(
        compared, champion=[f for f in compared.champion if f.fold != "2013-04-01"]
    )
    report, rule = fold_rule(compared)
    assert report.decision == "reject"
    assert rule.failures == [
        "the champion's entry baseline@aaaaaaaaaaaa lacks 1 of the last 3 folds of the"
        " challenger's (2013-04-01); run them: make backtest CONFIG=baseline FOLDS=2013-04-01"
    ]


def test_folds_of_other_settings_of_the_champions_entry_do_not_count():
    # The champion's entry ran May only with settings other than the champion's.
    stale = fold("baseline@" + "c" * 64, "2013-05-01", 0.5)
    theirs = [fold(BASELINE, "2013-03-01", 0.72), fold(BASELINE, "2013-04-01", 0.72), stale]
    rule = fold_rule(comparison([0.73] * 3, [], champion=theirs))[1]
    assert not rule.passed
    assert "lacks 1 of the last 3 folds of the challenger's (2013-05-01)" in rule.summary


def test_a_champion_of_the_entry_before_its_settings_changed_is_judged_without_folds():
    changed = "baseline@" + "d" * 64
    compared = comparison([0.73] * 3, [0.72], challenger_config=changed)
    rule = fold_rule(
        dataclasses.replace(compared, challenger=folds(changed, [0.73] * 3)),
    )[1]
    assert rule.summary == (
        "the champion's entry baseline@aaaaaaaaaaaa lacks 2 of the last 3 folds of the"
        " challenger's (2013-03-01, 2013-04-01); make backtest CONFIG=baseline runs the entry's"
        " settings as they are now, not the champion's, so run model_evaluation once with"
        " backtest_folds=0 to judge without folds"
    )


def test_a_champion_without_a_recorded_entry_fails_saying_how_to_proceed():
    report, rule = fold_rule(comparison([0.73] * 3, [0.72] * 3, champion_config=None))
    assert report.decision == "reject"
    assert rule.summary.startswith("the champion v4 records no catalog entry")
    assert "run model_evaluation once with backtest_folds=0" in rule.summary


def test_a_champion_and_no_folds_given_fails_when_the_policy_asks_for_folds():
    report, rule = fold_rule(None)
    assert report.decision == "reject"
    assert rule.summary == "backtest_folds is 3, but the gate was given no backtest folds to judge"


@pytest.mark.parametrize(("ours", "theirs"), [(math.nan, 0.72), (0.72, math.nan)])
def test_a_nan_fold_value_fails_the_fold_rule(ours, theirs):
    report, rule = fold_rule(comparison([0.72, 0.72, ours], [0.72, 0.72, theirs]))
    assert report.decision == "reject"
    assert rule.failures[0].startswith("2013-05-01: roc_auc ")
    assert "cannot be compared with champion's" in rule.failures[0]


@pytest.mark.parametrize(
    ("policy", "worse", "not_worse"),
    [
        # A drop of ROC AUC or macro F1 beyond the tolerance is worse; a rise of RMSE beyond the
        # tolerance's fraction of the champion's (12 * 2% = 0.24) is worse, a fall never.
        (GatePolicy(backtest_folds=2), 0.714, 0.716),
        (MulticlassGatePolicy(backtest_folds=2), 0.709, 0.711),
        (RegressionGatePolicy(backtest_folds=2), 12.25, 12.23),
    ],
)
def test_each_tasks_fold_metric_is_judged_in_its_direction_with_its_tolerance(
    policy, worse, not_worse
):
    task = policy.task
    best = 12.0 if task == "regression" else 0.72
    champion = folds(BASELINE, [best, best], task)

    def judged(value: float):
        ours = folds(TUNED, [best, value], task)
        return no_fold_regression(
            ours, champion, policy, challenger_config=TUNED, champion_config=BASELINE
        )

    assert not judged(worse).passed and judged(not_worse).passed
    better = 9.0 if task == "regression" else 0.9
    assert judged(better).passed
    if task == "regression":
        assert judged(worse).failures == [
            "2013-05-01: rmse 12.25 [12.24, 12.26] > champion's 12 [11.99, 12.01] + 2.0%"
        ]


def test_folds_of_another_task_are_refused():
    with pytest.raises(ValueError, match="fold 2013-05-01 of tuned@bbbbbbbbbbbb: a regression"):
        compared = FoldComparison(TUNED, folds(TUNED, [10.0], "regression"), BASELINE, [])
        decide(evaluation(), evaluation(), GatePolicy(backtest_folds=1), folds=compared)


@pytest.mark.parametrize("policy", POLICIES)
def test_backtest_folds_is_zero_by_default_refused_below_and_read_from_older_dicts(policy):
    assert policy().backtest_folds == 0
    with pytest.raises(ValueError, match="backtest_folds=-1"):
        policy(backtest_folds=-1)
    asked = policy(backtest_folds=3)
    assert policy_from_dict(asked.to_dict()) == asked
    older = {k: v for k, v in asked.to_dict().items() if k != "backtest_folds"}
    assert policy_from_dict(older) == policy()
