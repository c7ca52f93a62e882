"""Whether a challenger model may replace the champion: it must clear an absolute bar and not
regress against the champion, overall or on any slice both evaluated.

The rules and each task's policy are declared in `declare.gate`. A binary classifier is judged
by `GatePolicy` (ROC AUC, calibration and the other probability
metrics, with tolerances in the metrics' own units); a regression by `RegressionGatePolicy`
(RMSE, MAE and R², lower error is better, with tolerances as fractions of the champion's error,
so that one policy fits a label of any scale), and optionally against a baseline forecast; a
multiclass classifier by `MulticlassGatePolicy` (macro F1 and ROC AUC, log loss, top-class
calibration, in the metrics' own units), and by a floor on every class's recall. With
`backtest_folds` set, the challenger's catalog entry must also not be worse than the champion's on
the last folds of the rolling backtest (`ml.backtest`, a `FoldComparison`).

Every comparison is written so that NaN fails it (`value >= floor` is False for NaN): a metric
that could not be computed can never let a model through.
"""

import datetime as dt
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from declare.gate import (
    HIGHER_IS_BETTER,
    MULTICLASS_HIGHER_IS_BETTER,
    GatePolicy,
    MulticlassGatePolicy,
    Policy,
    RegressionGatePolicy,
    policy_from_dict,
)
from ml.backtest import FoldResult, latest_by_fold
from ml.metrics import (
    BinaryMetrics,
    Evaluation,
    Metrics,
    MulticlassMetrics,
    RegressionMetrics,
    SliceMetrics,
)


@dataclass(frozen=True)
class RuleResult:
    rule: str
    passed: bool
    summary: str
    """One line with the numbers, e.g. "roc_auc 0.612 < floor 0.650"."""
    failures: list[str] = field(default_factory=list)
    """One line per failing metric or slice."""


@dataclass(frozen=True)
class GateReport:
    passed: bool
    decision: Literal["promote", "reject"]
    rules: list[RuleResult]
    policy: Policy
    challenger: Evaluation
    champion: Evaluation | None
    champion_version: str | None
    subject: str
    """What is judged, e.g. the sha256 of the challenger's weights."""
    created_at: str
    """ISO 8601, UTC."""

    @property
    def reasons(self) -> list[str]:
        """The summaries of the failed rules."""
        return [r.summary for r in self.rules if not r.passed]

    def rule(self, name: str) -> RuleResult:
        for result in self.rules:
            if result.rule == name:
                return result
        raise KeyError(f"no rule {name!r}; the rules are {self.policy.rule_names}")

    def to_json(self) -> str:
        """JSON without NaN (it becomes null and comes back as NaN)."""
        return json.dumps(
            {
                "passed": self.passed,
                "decision": self.decision,
                "rules": [asdict(r) for r in self.rules],
                "policy": self.policy.to_dict(),
                "challenger": self.challenger.to_dict(),
                "champion": None if self.champion is None else self.champion.to_dict(),
                "champion_version": self.champion_version,
                "subject": self.subject,
                "created_at": self.created_at,
            },
            allow_nan=False,
            ensure_ascii=False,
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str) -> "GateReport":
        values = json.loads(text)
        decision = values["decision"]
        if decision not in ("promote", "reject") or values["passed"] != (decision == "promote"):
            raise ValueError(f"decision={decision!r} contradicts passed={values['passed']}")
        return cls(
            passed=values["passed"],
            decision=decision,
            rules=[RuleResult(**r) for r in values["rules"]],
            policy=policy_from_dict(values["policy"]),
            challenger=Evaluation.from_dict(values["challenger"]),
            champion=None
            if values["champion"] is None
            else Evaluation.from_dict(values["champion"]),
            champion_version=values["champion_version"],
            subject=values["subject"],
            created_at=values["created_at"],
        )


@dataclass(frozen=True)
class FoldComparison:
    """The backtest folds `no_fold_regression` judges: those measured for the challenger's catalog
    entry and for the champion's (`ml.backtest.FoldResult`), as the backtest recorded them."""

    challenger_config: str
    """The challenger's catalog entry as its run manifest records it, name@sha256 (the whole
    sha256 of the settings it resolved to); empty: its training recorded none."""
    challenger: list[FoldResult]
    """The folds measured for that entry."""
    champion_config: str | None
    """The champion's entry as its version's `config` tag records it, name@sha256; None: there is
    no champion, or it was registered before versions recorded their entry (`decide` tells the
    two apart by whether there is a champion's evaluation)."""
    champion: list[FoldResult]
    """The folds measured for the champion's entry."""


def decide(
    challenger: Evaluation,
    champion: Evaluation | None,
    policy: Policy,
    *,
    champion_version: str | None = None,
    subject: str = "",
    folds: FoldComparison | None = None,
) -> GateReport:
    """Judge the challenger by every rule of the policy (`policy.rule_names`); it is promoted
    only if all pass. The evaluations, and the backtest `folds` when given, must be of the
    policy's task; `folds` is needed when the policy's `backtest_folds` is above 0 and there is a
    champion."""
    for name, evaluation in (("challenger", challenger), ("champion", champion)):
        if evaluation is not None and evaluation.task != policy.task:
            raise ValueError(
                f"{name}: a {evaluation.task} evaluation cannot be judged by a {policy.task} policy"
            )
    if folds is not None:
        for fold in (*folds.challenger, *folds.champion):
            if fold.task != policy.task:
                raise ValueError(
                    f"fold {fold.fold} of {fold.config}: a {fold.task} fold cannot be judged by a"
                    f" {policy.task} policy"
                )
    judged_folds = _fold_rule(folds, champion, champion_version, policy)
    if isinstance(policy, RegressionGatePolicy):
        rules = [
            finite_metrics(challenger, policy),
            regression_absolute_floor(challenger, policy),
            regression_no_regression(challenger, champion, policy),
            regression_no_slice_regression(challenger, champion, policy),
            judged_folds,
            beats_baseline(challenger, policy),
        ]
    elif isinstance(policy, MulticlassGatePolicy):
        rules = [
            finite_metrics(challenger, policy),
            multiclass_absolute_floor(challenger, policy),
            multiclass_no_regression(challenger, champion, policy),
            multiclass_no_slice_regression(challenger, champion, policy),
            judged_folds,
            class_recall_floor(challenger, policy),
        ]
    else:
        rules = [
            finite_metrics(challenger, policy),
            absolute_floor(challenger, policy),
            no_regression(challenger, champion, policy),
            no_slice_regression(challenger, champion, policy),
            judged_folds,
            beats_baseline(challenger, policy),
        ]
    passed = all(r.passed for r in rules)
    return GateReport(
        passed=passed,
        decision="promote" if passed else "reject",
        rules=rules,
        policy=policy,
        challenger=challenger,
        champion=champion,
        champion_version=champion_version,
        subject=subject,
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )


def _num(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else str(value).replace("nan", "NaN")


def _metric_values(metrics: Metrics) -> dict[str, float]:
    return {k: v for k, v in metrics.as_dict().items() if k != "rows"}


def _eligible(found: SliceMetrics | None, policy: Policy) -> Metrics | None:
    """The slice's metrics when it is judged: evaluated, and with enough rows for the policy."""
    if found is None or found.metrics is None or found.rows < policy.min_slice_rows:
        return None
    return found.metrics


def _binary(metrics: Metrics | None) -> BinaryMetrics:
    assert isinstance(metrics, BinaryMetrics)  # decide checked the evaluations' task
    return metrics


def _regression(metrics: Metrics | None) -> RegressionMetrics:
    assert isinstance(metrics, RegressionMetrics)  # decide checked the evaluations' task
    return metrics


def _multiclass(metrics: Metrics | None) -> MulticlassMetrics:
    assert isinstance(metrics, MulticlassMetrics)  # decide checked the evaluations' task
    return metrics


def finite_metrics(challenger: Evaluation, policy: Policy) -> RuleResult:
    """Every overall metric, and every metric of every judged slice, is a finite number."""
    judged = [(s.label, m) for s in challenger.slices if (m := _eligible(s, policy)) is not None]
    failures = [
        f"{where}: {name} is {_num(value)}"
        for where, metrics in [("overall", challenger.overall), *judged]
        for name, value in _metric_values(metrics).items()
        if not math.isfinite(value)
    ]
    if failures:
        summary = f"{len(failures)} metrics not finite, first {failures[0]}"
    else:
        summary = f"all metrics finite, overall and in {len(judged)} judged slices"
    return RuleResult("finite_metrics", not failures, summary, failures)


def _within(
    name: str, value: float, limit: float, kind: Literal["floor", "ceiling"]
) -> tuple[bool, str]:
    """(passed, e.g. "roc_auc 0.612 < floor 0.650"); NaN and infinities never pass."""
    if kind == "floor":
        ok, holds, breaks = value >= limit, "≥", "<"
    else:
        ok, holds, breaks = value <= limit, "≤", ">"
    ok = ok and math.isfinite(value)
    relation = holds if ok else breaks if math.isfinite(value) else f"not {holds}"
    return ok, f"{name} {_num(value)} {relation} {kind} {limit:.3f}"


def absolute_floor(challenger: Evaluation, policy: GatePolicy) -> RuleResult:
    """Overall ROC AUC at least `min_roc_auc`, calibration error at most `max_calibration_error`."""
    overall = _binary(challenger.overall)
    checks = [
        _within("roc_auc", overall.roc_auc, policy.min_roc_auc, "floor"),
        _within(
            "calibration_error", overall.calibration_error, policy.max_calibration_error, "ceiling"
        ),
    ]
    failures = [line for ok, line in checks if not ok]
    summary = "; ".join(failures) if failures else "; ".join(line for _, line in checks)
    return RuleResult("absolute_floor", not failures, summary, failures)


def _no_worse(challenger: float, champion: float, higher_is_better: bool, tolerance: float) -> bool:
    """False when either value is NaN."""
    if higher_is_better:
        return challenger >= champion - tolerance
    return challenger <= champion + tolerance


def _change(champion: float, challenger: float, higher_is_better: bool, tolerance: float) -> str:
    """E.g. "0.701 → 0.655 (-0.046 > 0.030)"."""
    if not (math.isfinite(challenger) and math.isfinite(champion)):
        return f"{_num(champion)} → {_num(challenger)} (not comparable)"
    worse = champion - challenger if higher_is_better else challenger - champion
    sign = "-" if higher_is_better else "+"
    return f"{_num(champion)} → {_num(challenger)} ({sign}{_num(worse)} > {tolerance:.3f})"


def no_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: GatePolicy
) -> RuleResult:
    """Each compared overall metric no worse than the champion's beyond its tolerance.

    A metric the champion has as NaN cannot be compared and fails the rule: skipping it would let
    a challenger through unjudged on that metric. Evaluations of different test sets (row or
    positive counts differ) cannot be compared either."""
    if champion is None:
        return RuleResult("no_regression", True, "no champion yet: only the absolute floor applies")
    ours, theirs = _binary(challenger.overall), _binary(champion.overall)
    if ours.rows != theirs.rows or ours.positive_rate != theirs.positive_rate:
        line = (
            f"evaluated on different test sets: {ours.rows:,} rows at positive rate "
            f"{_num(ours.positive_rate)} vs the champion's {theirs.rows:,} at "
            f"{_num(theirs.positive_rate)}"
        )
        return RuleResult("no_regression", False, line, [line])
    return _against_champion(ours, theirs, policy.compared_metrics, HIGHER_IS_BETTER, policy)


def _against_champion(
    ours: Any,
    theirs: Any,
    names: Sequence[str],
    higher_is_better: Mapping[str, bool],
    policy: Any,
) -> RuleResult:
    """`no_regression` of a classifier's metrics `names` (binary or multiclass): each no worse
    than the champion's within `policy.tolerance(name)`; a champion's NaN cannot be compared."""
    failures = []
    for name in names:
        mine, best = getattr(ours, name), getattr(theirs, name)
        higher, tolerance = higher_is_better[name], policy.tolerance(name)
        if not math.isfinite(best):
            failures.append(f"{name}: the champion's is {_num(best)}, cannot compare")
        elif not _no_worse(mine, best, higher, tolerance):
            failures.append(f"{name} {_change(best, mine, higher, tolerance)}")
    if failures:
        summary = f"worse than champion: {'; '.join(failures)}"
    else:
        summary = "no worse than champion within tolerance: " + ", ".join(
            f"{name} {_num(getattr(theirs, name))} → {_num(getattr(ours, name))}" for name in names
        )
    return RuleResult("no_regression", not failures, summary, failures)


def no_slice_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: GatePolicy
) -> RuleResult:
    """In every slice value judged in both evaluations, the ROC AUC drops by at most
    `max_slice_roc_auc_drop`; values judged in only one (or neither) are counted as skipped."""
    if champion is None:
        return RuleResult(
            "no_slice_regression", True, "no champion yet: only the absolute floor applies"
        )
    failures = []
    tolerance = policy.max_slice_roc_auc_drop
    pairs, compared, skipped = _slice_pairs(challenger, champion, policy)
    for ours, judged, reference in pairs:
        mine, best = _binary(judged), _binary(reference)
        if not _no_worse(mine.roc_auc, best.roc_auc, True, tolerance):
            failures.append(
                f"{ours.label}: roc_auc {_change(best.roc_auc, mine.roc_auc, True, tolerance)}, "
                f"{ours.rows:,} rows"
            )
    counts = f"{compared} slices compared, {skipped} skipped (too few rows or one class)"
    if failures:
        summary = f"{len(failures)} slices lost more than {tolerance:.3f} roc_auc: " + counts
    else:
        summary = f"no slice lost more than {tolerance:.3f} roc_auc; " + counts
    return RuleResult("no_slice_regression", not failures, summary, failures)


def _slice_pairs(
    challenger: Evaluation, champion: Evaluation, policy: Policy
) -> tuple[list[tuple[SliceMetrics, Metrics, Metrics]], int, int]:
    """The slice values judged in both evaluations, each as (the challenger's slice, its
    metrics, the champion's metrics); and how many were compared and skipped."""
    theirs = {(s.slice, s.value): s for s in champion.slices}
    pairs = []
    for ours in challenger.slices:
        judged = _eligible(ours, policy)
        reference = _eligible(theirs.get((ours.slice, ours.value)), policy)
        if judged is not None and reference is not None:
            pairs.append((ours, judged, reference))
    return pairs, len(pairs), len(challenger.slices) - len(pairs)


def _amount(value: float) -> str:
    """A value in the label's units, whatever their scale: four significant digits."""
    return f"{value:.4g}" if math.isfinite(value) else str(value).replace("nan", "NaN")


def _bar(
    name: str, value: float, limit: float, kind: Literal["floor", "ceiling"]
) -> tuple[bool, str]:
    """(passed, e.g. "rmse 12.31 > ceiling 10"); NaN and infinities never pass."""
    if kind == "floor":
        ok, holds, breaks = value >= limit, "≥", "<"
    else:
        ok, holds, breaks = value <= limit, "≤", ">"
    ok = ok and math.isfinite(value)
    relation = holds if ok else breaks if math.isfinite(value) else f"not {holds}"
    return ok, f"{name} {_amount(value)} {relation} {kind} {_amount(limit)}"


def regression_absolute_floor(challenger: Evaluation, policy: RegressionGatePolicy) -> RuleResult:
    """Overall RMSE and MAE at most `max_rmse` and `max_mae`, R² at least `min_r2`; a bar the
    policy leaves at None is not judged."""
    overall = _regression(challenger.overall)
    bars: list[tuple[str, float, float | None, Literal["floor", "ceiling"]]] = [
        ("rmse", overall.rmse, policy.max_rmse, "ceiling"),
        ("mae", overall.mae, policy.max_mae, "ceiling"),
        ("r2", overall.r2, policy.min_r2, "floor"),
    ]
    checks = [
        _bar(name, value, limit, kind) for name, value, limit, kind in bars if limit is not None
    ]
    if not checks:
        return RuleResult("absolute_floor", True, "no absolute bar in the policy")
    failures = [line for ok, line in checks if not ok]
    summary = "; ".join(failures) if failures else "; ".join(line for _, line in checks)
    return RuleResult("absolute_floor", not failures, summary, failures)


def _rise(champion: float, challenger: float, tolerance: float) -> str:
    """E.g. "10.2 → 10.9 (+6.9% > 2.0%)"."""
    if not (math.isfinite(challenger) and math.isfinite(champion)):
        return f"{_amount(champion)} → {_amount(challenger)} (not comparable)"
    if champion == 0:
        return f"0 → {_amount(challenger)} (any rise of a perfect champion's error)"
    return (
        f"{_amount(champion)} → {_amount(challenger)}"
        f" ({(challenger - champion) / champion:+.1%} > {tolerance:.1%})"
    )


def _error_no_worse(challenger: float, champion: float, tolerance: float) -> bool:
    """The challenger's error at most the champion's times (1 + tolerance); False for NaN."""
    return challenger <= champion * (1 + tolerance)


def regression_no_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: RegressionGatePolicy
) -> RuleResult:
    """Each compared overall error at most the champion's times (1 + its tolerance).

    A NaN error of the champion cannot be compared and fails the rule; so do evaluations of
    different test sets (row counts or label means differ)."""
    if champion is None:
        return RuleResult("no_regression", True, "no champion yet: only the absolute floor applies")
    ours, theirs = _regression(challenger.overall), _regression(champion.overall)
    if ours.rows != theirs.rows or ours.label_mean != theirs.label_mean:
        line = (
            f"evaluated on different test sets: {ours.rows:,} rows of mean label"
            f" {_amount(ours.label_mean)} vs the champion's {theirs.rows:,} of mean label"
            f" {_amount(theirs.label_mean)}"
        )
        return RuleResult("no_regression", False, line, [line])
    failures = []
    for name in policy.compared_metrics:
        mine, best = getattr(ours, name), getattr(theirs, name)
        tolerance = policy.tolerance(name)
        if not math.isfinite(best):
            failures.append(f"{name}: the champion's is {_amount(best)}, cannot compare")
        elif not _error_no_worse(mine, best, tolerance):
            failures.append(f"{name} {_rise(best, mine, tolerance)}")
    if failures:
        summary = f"worse than champion: {'; '.join(failures)}"
    else:
        summary = "no worse than champion within tolerance: " + ", ".join(
            f"{name} {_amount(getattr(theirs, name))} → {_amount(getattr(ours, name))}"
            for name in policy.compared_metrics
        )
    return RuleResult("no_regression", not failures, summary, failures)


def regression_no_slice_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: RegressionGatePolicy
) -> RuleResult:
    """In every slice value judged in both evaluations, the RMSE rises by at most
    `max_slice_rmse_rise_fraction` of the champion's; values judged in only one (or neither)
    are counted as skipped."""
    if champion is None:
        return RuleResult(
            "no_slice_regression", True, "no champion yet: only the absolute floor applies"
        )
    failures = []
    tolerance = policy.max_slice_rmse_rise_fraction
    pairs, compared, skipped = _slice_pairs(challenger, champion, policy)
    for ours, judged, reference in pairs:
        mine, best = _regression(judged), _regression(reference)
        if not _error_no_worse(mine.rmse, best.rmse, tolerance):
            failures.append(
                f"{ours.label}: rmse {_rise(best.rmse, mine.rmse, tolerance)}, {ours.rows:,} rows"
            )
    counts = f"{compared} slices compared, {skipped} skipped (too few rows or one label value)"
    if failures:
        summary = f"{len(failures)} slices' rmse rose more than {tolerance:.1%}: " + counts
    else:
        summary = f"no slice's rmse rose more than {tolerance:.1%}; " + counts
    return RuleResult("no_slice_regression", not failures, summary, failures)


def beats_baseline(challenger: Evaluation, policy: GatePolicy | RegressionGatePolicy) -> RuleResult:
    """When the policy requires it, the challenger beats the baseline forecast on the rows the
    forecast covers: a higher ROC AUC (binary), a lower RMSE (regression); an evaluation without
    a baseline fails."""
    comparison = challenger.baseline
    if comparison is None:
        if not policy.require_baseline:
            return RuleResult("beats_baseline", True, "not required by the policy")
        line = "the evaluation has no baseline to compare with"
        return RuleResult("beats_baseline", False, line, [line])
    if isinstance(policy, RegressionGatePolicy):
        ours, theirs = _regression(comparison.model), _regression(comparison.baseline)
        ok = ours.rmse < theirs.rmse  # False for NaN
        mine, best, rows = ours.rmse, theirs.rmse, theirs.rows
        line = f"rmse {_amount(mine)} {'<' if ok else 'not <'} the baseline's {_amount(best)}"
    else:
        ours_b, theirs_b = _binary(comparison.model), _binary(comparison.baseline)
        ok = ours_b.roc_auc > theirs_b.roc_auc  # False for NaN
        mine, best, rows = ours_b.roc_auc, theirs_b.roc_auc, theirs_b.rows
        line = f"roc_auc {mine:.3f} {'>' if ok else 'not >'} the baseline's {best:.3f}"
    line += f" on the {rows:,} rows it covers"
    if not policy.require_baseline:
        return RuleResult("beats_baseline", True, f"not required by the policy; {line}")
    return RuleResult("beats_baseline", ok, line, [] if ok else [line])


def multiclass_absolute_floor(challenger: Evaluation, policy: MulticlassGatePolicy) -> RuleResult:
    """Overall macro ROC AUC and macro F1 at least their floors, top-class calibration error at
    most `max_calibration_error`."""
    overall = _multiclass(challenger.overall)
    checks = [
        _within("macro_roc_auc", overall.macro_roc_auc, policy.min_macro_roc_auc, "floor"),
        _within("macro_f1", overall.macro_f1, policy.min_macro_f1, "floor"),
        _within(
            "calibration_error", overall.calibration_error, policy.max_calibration_error, "ceiling"
        ),
    ]
    failures = [line for ok, line in checks if not ok]
    summary = "; ".join(failures) if failures else "; ".join(line for _, line in checks)
    return RuleResult("absolute_floor", not failures, summary, failures)


def _supports(metrics: MulticlassMetrics) -> dict[str, int]:
    return {c.name: c.support for c in metrics.per_class}


def multiclass_no_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: MulticlassGatePolicy
) -> RuleResult:
    """Each compared overall metric no worse than the champion's beyond its tolerance.

    A metric the champion has as NaN cannot be compared and fails the rule; so do evaluations of
    different test sets (row counts or rows per class differ, the classes included)."""
    if champion is None:
        return RuleResult("no_regression", True, "no champion yet: only the absolute floor applies")
    ours, theirs = _multiclass(challenger.overall), _multiclass(champion.overall)
    if ours.rows != theirs.rows or _supports(ours) != _supports(theirs):
        line = (
            f"evaluated on different test sets: {ours.rows:,} rows of classes {_supports(ours)}"
            f" vs the champion's {theirs.rows:,} of {_supports(theirs)}"
        )
        return RuleResult("no_regression", False, line, [line])
    return _against_champion(
        ours, theirs, policy.compared_metrics, MULTICLASS_HIGHER_IS_BETTER, policy
    )


def multiclass_no_slice_regression(
    challenger: Evaluation, champion: Evaluation | None, policy: MulticlassGatePolicy
) -> RuleResult:
    """In every slice value judged in both evaluations, the macro F1 drops by at most
    `max_slice_macro_f1_drop`; values judged in only one (or neither) are counted as skipped."""
    if champion is None:
        return RuleResult(
            "no_slice_regression", True, "no champion yet: only the absolute floor applies"
        )
    failures = []
    tolerance = policy.max_slice_macro_f1_drop
    pairs, compared, skipped = _slice_pairs(challenger, champion, policy)
    for ours, judged, reference in pairs:
        mine, best = _multiclass(judged).macro_f1, _multiclass(reference).macro_f1
        if not _no_worse(mine, best, True, tolerance):
            failures.append(
                f"{ours.label}: macro_f1 {_change(best, mine, True, tolerance)}, {ours.rows:,} rows"
            )
    counts = f"{compared} slices compared, {skipped} skipped (too few rows or one class)"
    if failures:
        summary = f"{len(failures)} slices lost more than {tolerance:.3f} macro_f1: " + counts
    else:
        summary = f"no slice lost more than {tolerance:.3f} macro_f1; " + counts
    return RuleResult("no_slice_regression", not failures, summary, failures)


def class_recall_floor(challenger: Evaluation, policy: MulticlassGatePolicy) -> RuleResult:
    """Every class with rows in the test split has a recall of at least `min_class_recall`; a
    class without rows cannot be judged and is named in the summary."""
    overall = _multiclass(challenger.overall)
    floor = policy.min_class_recall
    judged = [c for c in overall.per_class if c.support]
    absent = [c.name for c in overall.per_class if not c.support]
    failures = [
        f"{c.name}: recall {_num(c.recall)} < floor {floor:.3f} ({c.support:,} rows)"
        for c in judged
        if not c.recall >= floor  # NaN fails
    ]
    unjudged = f"; no test rows of {absent}" if absent else ""
    if failures:
        summary = f"{len(failures)} of {len(judged)} classes under the recall floor{unjudged}"
    else:
        lowest = min(judged, key=lambda c: c.recall).name if judged else None
        summary = (
            f"every class's recall ≥ {floor:.3f}; lowest {lowest}"
            f" {_num(overall.min_recall)}{unjudged}"
        )
    return RuleResult("class_recall_floor", not failures, summary, failures)


def _fold_rule(
    folds: FoldComparison | None,
    champion: Evaluation | None,
    champion_version: str | None,
    policy: Policy,
) -> RuleResult:
    """`no_fold_regression` as `decide` judges it: a champion with no folds given fails when the
    policy asks for folds."""
    if folds is None:
        if policy.backtest_folds and champion is not None:
            line = (
                f"backtest_folds is {policy.backtest_folds}, but the gate was given no backtest"
                " folds to judge"
            )
            return RuleResult("no_fold_regression", False, line, [line])
        folds = FoldComparison("", [], None, [])
    return no_fold_regression(
        folds.challenger,
        None if champion is None else folds.champion,
        policy,
        challenger_config=folds.challenger_config,
        champion_config=folds.champion_config,
        champion_version=champion_version,
    )


def no_fold_regression(
    challenger: Sequence[FoldResult],
    champion: Sequence[FoldResult] | None,
    policy: Policy,
    *,
    challenger_config: str,
    champion_config: str | None,
    champion_version: str | None = None,
) -> RuleResult:
    """On each of the latest `policy.backtest_folds` folds of the challenger's catalog entry
    (`challenger_config`, name@sha256; one result per fold, the last given), the entry's metric is
    no worse than that of the champion's entry (`champion_config`) on the same fold, within the
    task's no_regression tolerance of the metric: a drop of ROC AUC or macro F1, a rise of RMSE
    as a fraction of the champion's.

    `champion` None: there is no champion, and the rule passes. A champion without a recorded
    entry (`champion_config` None), a challenger without one, fewer folds of the challenger's
    entry than judged, and a judged fold the champion's entry lacks all fail, naming the folds
    and the command that runs them. The champion's own entry and settings pass: the folds are
    the same ones. Folds are compared by entry and settings (sha256), not by weights."""
    rule, wanted = "no_fold_regression", policy.backtest_folds
    if wanted == 0:
        return RuleResult(rule, True, "not judged: backtest_folds is 0")
    if champion is None:
        return RuleResult(rule, True, "no champion yet")

    def failed(line: str) -> RuleResult:
        return RuleResult(rule, False, line, [line])

    if champion_config is None:
        named = f"the champion v{champion_version}" if champion_version else "the champion"
        return failed(
            f"{named} records no catalog entry (it was registered before versions recorded their"
            " `config` tag), so its backtest folds cannot be found; run model_evaluation once"
            " with backtest_folds=0: the model it promotes records its entry"
        )
    if not challenger_config:
        return failed(
            "the challenger's training records no catalog entry, so its backtest folds cannot be"
            " found; train it from an entry of the use case's catalog"
        )
    if challenger_config == champion_config:
        return RuleResult(
            rule, True, f"the champion's entry {_config(champion_config)}: the same folds"
        )
    ours_name, ours_sha = _entry(challenger_config)
    theirs_name, theirs_sha = _entry(champion_config)
    ours = latest_by_fold([r for r in challenger if r.entry_sha256 == ours_sha])[-wanted:]
    theirs = {r.fold: r for r in champion if r.entry_sha256 == theirs_sha}
    if len(ours) < wanted:
        latest = sorted(theirs)[-wanted:]
        months = (
            f" FOLDS={_span(latest, '...')}"
            if len(latest) == wanted
            else f" FOLDS=FIRST...LAST (the last {wanted} months)"
        )
        return failed(
            f"the challenger's entry {_config(challenger_config)} has {len(ours)} of the"
            f" {wanted} backtest folds judged; run them: make backtest CONFIG={ours_name}{months}"
        )
    missing = [r.fold for r in ours if r.fold not in theirs]
    if missing:
        rerun = f"run them: make backtest CONFIG={theirs_name} FOLDS={_span(missing, '...')}"
        if theirs_name == ours_name:  # the entry's settings changed since the champion trained
            rerun = (
                f"make backtest CONFIG={theirs_name} runs the entry's settings as they are now,"
                " not the champion's, so run model_evaluation once with backtest_folds=0 to judge"
                " without folds"
            )
        return failed(
            f"the champion's entry {_config(champion_config)} lacks {len(missing)} of the last"
            f" {wanted} folds of the challenger's ({', '.join(missing)}); {rerun}"
        )
    worse = [mine for mine in ours if not _fold_no_worse(mine, theirs[mine.fold], policy)]
    failures = [_fold_line(mine, theirs[mine.fold], policy) for mine in worse]
    against = f"the champion's entry {_config(champion_config)}"
    if failures:
        summary = (
            f"worse than {against} on {len(worse)} of the last {wanted} folds"
            f" ({', '.join(mine.fold for mine in worse)})"
        )
    else:
        summary = (
            f"not worse than {against} on any of the last {wanted} folds"
            f" ({_span([r.fold for r in ours], ' … ')})"
        )
    return RuleResult(rule, not failures, summary, failures)


def _entry(config: str) -> tuple[str, str]:
    """(name, sha256) of an entry recorded as name@sha256."""
    name, _, sha256 = config.rpartition("@")
    return name, sha256


def _config(config: str) -> str:
    """An entry as a person reads it: name@sha256[:12], as a training's `config` tag."""
    name, sha256 = _entry(config)
    return f"{name}@{sha256[:12]}"


def _span(folds: Sequence[str], between: str) -> str:
    return folds[0] if len(folds) == 1 else f"{folds[0]}{between}{folds[-1]}"


def _fold_no_worse(mine: FoldResult, theirs: FoldResult, policy: Policy) -> bool:
    """The challenger's fold metric within the tolerance of the champion's; False for NaN."""
    tolerance = policy.tolerance(mine.metric)
    if isinstance(policy, RegressionGatePolicy):
        return _error_no_worse(mine.value, theirs.value, tolerance)
    return _no_worse(mine.value, theirs.value, True, tolerance)


def _fold_line(mine: FoldResult, theirs: FoldResult, policy: Policy) -> str:
    """E.g. "2013-05-01: roc_auc 0.701 [0.690, 0.712] < champion's 0.720 [0.709, 0.731] -
    0.005"; a regression's tolerance is a fraction: "rmse 12.9 [...] > champion's 12 [...] +
    2.0%"."""
    tolerance = policy.tolerance(mine.metric)
    regression = isinstance(policy, RegressionGatePolicy)
    shown = _amount if regression else _num

    def figure(fold: FoldResult) -> str:
        return f"{shown(fold.value)} [{shown(fold.low)}, {shown(fold.high)}]"

    if not (math.isfinite(mine.value) and math.isfinite(theirs.value)):
        relation, allowed = "cannot be compared with", ""
    elif regression:
        relation, allowed = ">", f" + {tolerance:.1%}"
    else:
        relation, allowed = "<", f" - {tolerance:.3f}"
    return (
        f"{mine.fold}: {mine.metric} {figure(mine)} {relation} champion's {figure(theirs)}{allowed}"
    )
