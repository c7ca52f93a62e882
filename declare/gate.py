"""The gate a challenger model must pass to replace the champion, declared: its rules, in one
registry, and each task's policy (floors, ceilings and tolerances), defined once.

The rules are judged by `ml.gate.decide`; each is a blocking check of `model_evaluation` whose
description in the UI is the rule's `checks` below. A use case declares its policy
(`UseCase.gate`); the launchpad's `model_evaluation` config is derived from these fields, and
docs/serving.md's table of the rules from the registry and the policies' defaults (`rules_table`).
"""

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

TASKS = ("binary", "regression", "multiclass")
"""What a use case's label can be: a binary outcome, a number, or one of a few classes."""


@dataclass(frozen=True)
class GateRule:
    """One rule of the gate."""

    name: str
    """The check's name on `model_evaluation`, and the rule's in the gate report and MLflow."""
    checks: str
    """What passes, one sentence: the check's description in the UI."""
    reads: str
    """What the rule compares."""
    tasks: tuple[str, ...] = TASKS
    """The tasks whose gate has this rule."""
    policy_fields: tuple[str, ...] = ()
    """The fields of its tasks' policies the rule reads (each policy has those of its task)."""


GATE_RULES = (
    GateRule(
        "finite_metrics",
        "No metric of the challenger, overall or on a slice, is NaN or infinite.",
        "the challenger's metrics, overall and on every judged slice value",
        policy_fields=("min_slice_rows",),
    ),
    GateRule(
        "absolute_floor",
        "The challenger clears the absolute bar (binary: ROC AUC floor, calibration error"
        " ceiling; regression: RMSE/MAE ceilings, R² floor; multiclass: macro ROC AUC and macro"
        " F1 floors, top-class calibration error ceiling).",
        "the challenger's overall metrics against the policy's floors and ceilings",
        policy_fields=(
            *("min_roc_auc", "max_calibration_error", "max_rmse", "max_mae", "min_r2"),
            *("min_macro_roc_auc", "min_macro_f1"),
        ),
    ),
    GateRule(
        "no_regression",
        "The challenger is not worse than the champion beyond the tolerance.",
        "the compared overall metrics of the challenger and the champion, on the same rows",
        policy_fields=(
            "compared_metrics",
            *("max_roc_auc_drop", "max_average_precision_drop"),
            *("max_log_loss_rise", "max_brier_rise"),
            *("max_rmse_rise_fraction", "max_mae_rise_fraction"),
            *("max_macro_f1_drop", "max_macro_roc_auc_drop", "max_accuracy_drop"),
        ),
    ),
    GateRule(
        "no_slice_regression",
        "No slice with enough rows regresses against the champion.",
        "the ROC AUC (binary), RMSE (regression) or macro F1 (multiclass) of every slice value"
        " both evaluated",
        policy_fields=(
            *("max_slice_roc_auc_drop", "max_slice_rmse_rise_fraction", "max_slice_macro_f1_drop"),
            "min_slice_rows",
        ),
    ),
    GateRule(
        "no_fold_regression",
        "On each of the last `backtest_folds` backtest folds of the challenger's catalog entry,"
        " which the champion's entry must have run too, the challenger's entry is not worse than"
        " the champion's beyond the no_regression tolerance of the fold metric (0: not judged).",
        "the ROC AUC (binary), RMSE (regression) or macro F1 (multiclass) that the backtest"
        " measured on each of those folds for the two models' catalog entries",
        policy_fields=("backtest_folds",),
    ),
    GateRule(
        "beats_baseline",
        "The challenger beats the declared naive baseline forecast on the rows it covers.",
        "the ROC AUC (binary) or RMSE (regression) of the challenger and of the baseline forecast"
        " on the rows it covers",
        tasks=("binary", "regression"),
        policy_fields=("require_baseline",),
    ),
    GateRule(
        "class_recall_floor",
        "Every class with test rows is recalled at least as often as the floor.",
        "the recall of each class of the challenger with rows in the test split",
        tasks=("multiclass",),
        policy_fields=("min_class_recall",),
    ),
)
"""Every rule of the gate, in the order it is judged."""


def rule_names(task: str) -> tuple[str, ...]:
    """The names of the rules a model of `task` is judged by, in order."""
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {TASKS}")
    return tuple(rule.name for rule in GATE_RULES if task in rule.tasks)


HIGHER_IS_BETTER = {"roc_auc": True, "average_precision": True, "log_loss": False, "brier": False}
"""The metrics the no_regression rule can compare, and which way is better for each."""


@dataclass(frozen=True)
class GatePolicy:
    """The gate of a binary classifier."""

    task: ClassVar[str] = "binary"
    rule_names: ClassVar[tuple[str, ...]] = rule_names("binary")

    min_roc_auc: float = 0.65
    """Absolute floor of the challenger's overall ROC AUC."""
    max_calibration_error: float = 0.1
    """Absolute ceiling of the challenger's overall expected calibration error."""
    compared_metrics: tuple[str, ...] = ("roc_auc", "average_precision", "log_loss", "brier")
    """Overall metrics that must not be worse than the champion's beyond their tolerance; each
    one's direction is in `HIGHER_IS_BETTER` and its tolerance in the field below."""
    max_roc_auc_drop: float = 0.005
    """How far the overall ROC AUC may fall below the champion's."""
    max_average_precision_drop: float = 0.01
    """How far the overall average precision may fall below the champion's."""
    max_log_loss_rise: float = 0.005
    """How far the overall log loss may rise above the champion's."""
    max_brier_rise: float = 0.002
    """How far the overall Brier score may rise above the champion's."""
    max_slice_roc_auc_drop: float = 0.03
    """How far the ROC AUC of any slice value evaluated for both models may fall."""
    min_slice_rows: int = 200
    """Slice values with fewer rows (in either evaluation) are skipped, not judged."""
    require_baseline: bool = False
    """Whether beats_baseline is judged: the challenger's ROC AUC must be above the baseline
    forecast's (a probability, e.g. the route's recent delay rate) on the rows the forecast
    covers, and an evaluation without a baseline fails."""
    backtest_folds: int = 0
    """How many of the latest backtest folds of the challenger's catalog entry no_fold_regression
    judges against the champion's entry, with the no_regression tolerance of the fold metric
    (`max_roc_auc_drop`); 0: the rule is not judged and passes saying so."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compared_metrics", tuple(self.compared_metrics))
        for name in ("min_roc_auc", "max_calibration_error"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name}={value}: must lie in [0, 1]")
        for name in (
            "max_roc_auc_drop",
            "max_average_precision_drop",
            "max_log_loss_rise",
            "max_brier_rise",
            "max_slice_roc_auc_drop",
        ):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name}={value}: must be finite and not negative")
        if self.min_slice_rows < 1:
            raise ValueError(f"min_slice_rows={self.min_slice_rows}: must be at least 1")
        if self.backtest_folds < 0:
            raise ValueError(f"backtest_folds={self.backtest_folds}: must be 0 or more")
        unknown = [m for m in self.compared_metrics if m not in HIGHER_IS_BETTER]
        if unknown or not self.compared_metrics:
            raise ValueError(
                f"compared_metrics={self.compared_metrics}: "
                f"must be some of {tuple(HIGHER_IS_BETTER)}"
            )
        if len(set(self.compared_metrics)) != len(self.compared_metrics):
            raise ValueError(f"compared_metrics={self.compared_metrics}: repeats a metric")

    def tolerance(self, metric: str) -> float:
        """How much worse than the champion's `metric` may be, in its own units."""
        suffix = "drop" if HIGHER_IS_BETTER[metric] else "rise"
        return getattr(self, f"max_{metric}_{suffix}")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "compared_metrics": list(self.compared_metrics)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GatePolicy":
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


LOWER_IS_BETTER = ("rmse", "mae")
"""The regression metrics the no_regression rule can compare: errors, lower is better."""


@dataclass(frozen=True)
class RegressionGatePolicy:
    """The gate of a regression. Ceilings and floors are in the label's units (R² has none);
    the tolerances against the champion are fractions of the champion's error."""

    task: ClassVar[str] = "regression"
    rule_names: ClassVar[tuple[str, ...]] = rule_names("regression")

    max_rmse: float | None = None
    """Absolute ceiling of the challenger's overall RMSE; None: not judged."""
    max_mae: float | None = None
    """Absolute ceiling of the challenger's overall MAE; None: not judged."""
    min_r2: float | None = 0.0
    """Absolute floor of the challenger's overall R² (0 is as good as predicting the test rows'
    mean); None: not judged."""
    compared_metrics: tuple[str, ...] = LOWER_IS_BETTER
    """Overall errors that must not rise above the champion's beyond their tolerance."""
    max_rmse_rise_fraction: float = 0.02
    """How far the overall RMSE may rise above the champion's, as a fraction of the champion's."""
    max_mae_rise_fraction: float = 0.02
    """How far the overall MAE may rise above the champion's, as a fraction of the champion's."""
    max_slice_rmse_rise_fraction: float = 0.1
    """How far the RMSE of any slice value judged for both models may rise, as a fraction of
    the champion's RMSE on that slice value."""
    min_slice_rows: int = 200
    """Slice values with fewer rows (in either evaluation) are skipped, not judged."""
    require_baseline: bool = False
    """Whether beats_baseline is judged: the challenger's RMSE must be below the baseline
    forecast's on the rows the forecast covers, and an evaluation without a baseline fails."""
    backtest_folds: int = 0
    """How many of the latest backtest folds of the challenger's catalog entry no_fold_regression
    judges against the champion's entry, with the no_regression tolerance of the fold metric
    (`max_rmse_rise_fraction`); 0: the rule is not judged and passes saying so."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compared_metrics", tuple(self.compared_metrics))
        for name in ("max_rmse", "max_mae"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name}={value}: must be finite and positive, or None")
        if self.min_r2 is not None and not -math.inf < self.min_r2 <= 1:
            raise ValueError(f"min_r2={self.min_r2}: must be finite and at most 1, or None")
        for name in (
            "max_rmse_rise_fraction",
            "max_mae_rise_fraction",
            "max_slice_rmse_rise_fraction",
        ):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name}={value}: must be finite and not negative")
        if self.min_slice_rows < 1:
            raise ValueError(f"min_slice_rows={self.min_slice_rows}: must be at least 1")
        if self.backtest_folds < 0:
            raise ValueError(f"backtest_folds={self.backtest_folds}: must be 0 or more")
        unknown = [m for m in self.compared_metrics if m not in LOWER_IS_BETTER]
        if unknown or not self.compared_metrics:
            raise ValueError(
                f"compared_metrics={self.compared_metrics}: must be some of {LOWER_IS_BETTER}"
            )
        if len(set(self.compared_metrics)) != len(self.compared_metrics):
            raise ValueError(f"compared_metrics={self.compared_metrics}: repeats a metric")

    def tolerance(self, metric: str) -> float:
        """How far `metric` may rise above the champion's, as a fraction of the champion's."""
        return getattr(self, f"max_{metric}_rise_fraction")

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, **asdict(self), "compared_metrics": list(self.compared_metrics)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RegressionGatePolicy":
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


MULTICLASS_HIGHER_IS_BETTER = {
    "macro_f1": True,
    "macro_roc_auc": True,
    "accuracy": True,
    "log_loss": False,
    "brier": False,
}
"""The multiclass metrics the no_regression rule can compare, and which way is better for each."""


@dataclass(frozen=True)
class MulticlassGatePolicy:
    """The gate of a multiclass classifier. Floors and tolerances are in the metrics' own units
    (fractions; log loss in nats)."""

    task: ClassVar[str] = "multiclass"
    rule_names: ClassVar[tuple[str, ...]] = rule_names("multiclass")

    min_macro_roc_auc: float = 0.6
    """Absolute floor of the challenger's overall macro one-vs-rest ROC AUC."""
    min_macro_f1: float = 0.0
    """Absolute floor of the challenger's overall macro F1."""
    max_calibration_error: float = 0.1
    """Absolute ceiling of the expected calibration error of the top-class probability."""
    min_class_recall: float = 0.0
    """Floor of each class's recall (of the classes with test rows): above 0, a model that never
    predicts a class fails however good its averages."""
    compared_metrics: tuple[str, ...] = ("macro_f1", "macro_roc_auc", "log_loss")
    """Overall metrics that must not be worse than the champion's beyond their tolerance; each
    one's direction is in `MULTICLASS_HIGHER_IS_BETTER` and its tolerance in the field below."""
    max_macro_f1_drop: float = 0.01
    """How far the overall macro F1 may fall below the champion's."""
    max_macro_roc_auc_drop: float = 0.005
    """How far the overall macro ROC AUC may fall below the champion's."""
    max_accuracy_drop: float = 0.01
    """How far the overall accuracy may fall below the champion's."""
    max_log_loss_rise: float = 0.005
    """How far the overall log loss may rise above the champion's."""
    max_brier_rise: float = 0.005
    """How far the overall multiclass Brier score may rise above the champion's."""
    max_slice_macro_f1_drop: float = 0.05
    """How far the macro F1 of any slice value evaluated for both models may fall."""
    min_slice_rows: int = 200
    """Slice values with fewer rows (in either evaluation) are skipped, not judged."""
    backtest_folds: int = 0
    """How many of the latest backtest folds of the challenger's catalog entry no_fold_regression
    judges against the champion's entry, with the no_regression tolerance of the fold metric
    (`max_macro_f1_drop`); 0: the rule is not judged and passes saying so."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "compared_metrics", tuple(self.compared_metrics))
        for name in (
            "min_macro_roc_auc",
            "min_macro_f1",
            "max_calibration_error",
            "min_class_recall",
        ):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name}={value}: must lie in [0, 1]")
        for name in (
            "max_macro_f1_drop",
            "max_macro_roc_auc_drop",
            "max_accuracy_drop",
            "max_log_loss_rise",
            "max_brier_rise",
            "max_slice_macro_f1_drop",
        ):
            value = getattr(self, name)
            if not 0 <= value < math.inf:
                raise ValueError(f"{name}={value}: must be finite and not negative")
        if self.min_slice_rows < 1:
            raise ValueError(f"min_slice_rows={self.min_slice_rows}: must be at least 1")
        if self.backtest_folds < 0:
            raise ValueError(f"backtest_folds={self.backtest_folds}: must be 0 or more")
        unknown = [m for m in self.compared_metrics if m not in MULTICLASS_HIGHER_IS_BETTER]
        if unknown or not self.compared_metrics:
            raise ValueError(
                f"compared_metrics={self.compared_metrics}: "
                f"must be some of {tuple(MULTICLASS_HIGHER_IS_BETTER)}"
            )
        if len(set(self.compared_metrics)) != len(self.compared_metrics):
            raise ValueError(f"compared_metrics={self.compared_metrics}: repeats a metric")

    def tolerance(self, metric: str) -> float:
        """How much worse than the champion's `metric` may be, in its own units."""
        suffix = "drop" if MULTICLASS_HIGHER_IS_BETTER[metric] else "rise"
        return getattr(self, f"max_{metric}_{suffix}")

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, **asdict(self), "compared_metrics": list(self.compared_metrics)}

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "MulticlassGatePolicy":
        return cls(**{f.name: values[f.name] for f in fields(cls) if f.name in values})


Policy = GatePolicy | RegressionGatePolicy | MulticlassGatePolicy
"""A gate policy of any task."""


def policy_from_dict(values: dict[str, Any]) -> Policy:
    """The policy of a `to_dict` output: a regression or multiclass policy names its task; a
    dict that names none is a binary one."""
    task = values.get("task", "binary")
    if task == "regression":
        return RegressionGatePolicy.from_dict(values)
    if task == "multiclass":
        return MulticlassGatePolicy.from_dict(values)
    return GatePolicy.from_dict(values)


POLICIES = (GatePolicy, RegressionGatePolicy, MulticlassGatePolicy)
"""Every task's policy, in the order of `TASKS`."""


def rules_table() -> str:
    """The rules as docs/serving.md's table: each rule's tasks, what passes, what it reads, and
    the policy fields it reads with their defaults (`python -m cli.gate_rules` prints it)."""
    rows = [
        "| check | tasks | passes when | reads | policy fields (defaults) |",
        "|---|---|---|---|---|",
    ]
    for rule in GATE_RULES:
        tasks = ", ".join(rule.tasks)
        rows.append(
            f"| `{rule.name}` | {tasks} | {rule.checks} | {rule.reads} | {_defaults(rule)} |"
        )
    return "\n".join(rows)


def _defaults(rule: GateRule) -> str:
    """`rule`'s policy fields and their defaults, told apart by task where the tasks differ."""
    by_task = {}
    for policy in POLICIES:
        if policy.task in rule.tasks:
            defaults = {spec.name: spec.default for spec in fields(policy)}
            by_task[policy.task] = ", ".join(
                f"`{name}` = {_shown(defaults[name])}"
                for name in rule.policy_fields
                if name in defaults
            )
    if len(set(by_task.values())) == 1:
        return next(iter(by_task.values()))
    return "; ".join(f"{task}: {shown}" for task, shown in by_task.items())


def _shown(value: object) -> str:
    if isinstance(value, tuple):
        return "(" + ", ".join(map(str, value)) + ")"
    return str(value)
