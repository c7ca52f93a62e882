"""Data drift: how far a day's model inputs and scores have moved from what the model learned.

The reference is a seeded sample of the training window's rows (its train, validation and test
days: what the model learned from and was measured on), kept with the model (their raw feature
values and the served model's score for each row: its output, a probability or a predicted value,
`ml.task`). A day is compared column by column:

- the population stability index (PSI), on the reference's deciles for numbers (missing values
  are a bin of their own) and on the reference's categories for strings (plus one bin for
  categories the reference never saw, one for missing);
- the two-sample Kolmogorov-Smirnov statistic and p-value, for numbers and the score.

The score is measured as any number: its PSI bins are the reference's deciles, so a predicted
value of any range is binned as a probability is. A multiclass classifier's score is its predicted
class (`ml.predict.Scorer.monitored`): its PSI is over the classes, the shares of the day's
predictions in each against the reference's (plus bins for a class the reference never
predicted and for none), with no KS.

Each column gets a level, `ok`, `warn` or `fail`, from its lines: the configured thresholds, or
lines measured on the model's own training period (`natural_lines`): how far each column moved
between windows of those days while the model learned from them. A column is then flagged when
it moves more than it did then, never below the configured thresholds. Calendar columns (a
function of the date alone, declared) are measured and never flagged. The comparison is a
drift event when the score fails: what the model outputs has moved. Features that fail while the
score holds are a warning. On the bundled binary use case that is the line between signal and
noise: a week's conditions, calendar and trailing-history features always differ from the
training weeks' (PSI above 1 for half of them in the very next week), while the score's PSI stays
under 0.04 through the winter and passes 4 on a summer week. A single day is too noisy even for
the score (0.02 to 1.3 in one winter week), so callers compare a window of days. Plain
numpy/pandas/scipy; no Dagster.
"""

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from declare.policies import DEFAULT_RULE, DriftSettings, LineRule

SCORE = "probability"
"""The reference's and the day's column with the model's score (its output, whatever the task:
the name is kept for the references already stored)."""
REFERENCE_ROWS = 20_000
"""Rows of the training window kept as the reference: enough for stable deciles, small to ship."""
_SMOOTHING = 0.5
"""Added to every bin's count before proportions are taken, so an empty bin costs a finite,
sample-size-aware amount instead of log(0)."""
_MISSING = "\x00missing"
_UNSEEN = "\x00unseen"

Level = Literal["ok", "warn", "fail"]
Kind = Literal["numeric", "categorical", "score"]
_ORDER: dict[str, int] = {"ok": 0, "warn": 1, "fail": 2}


@dataclass(frozen=True)
class ColumnLines:
    """Where one column's drift becomes a warning or a failure."""

    psi_warn: float = 0.1
    psi_fail: float = 0.25
    ks_warn: float = 0.1
    """Kolmogorov-Smirnov statistic (the largest gap between the two CDFs), not its p-value:
    with thousands of reference rows any difference is 'significant'; its size is what counts."""
    ks_fail: float = 0.2

    def __post_init__(self) -> None:
        if not 0 <= self.psi_warn <= self.psi_fail:
            raise ValueError(
                f"need 0 <= psi_warn <= psi_fail, got {self.psi_warn}, {self.psi_fail}"
            )
        if not 0 <= self.ks_warn <= self.ks_fail <= 1:
            raise ValueError(
                f"need 0 <= ks_warn <= ks_fail <= 1, got {self.ks_warn}, {self.ks_fail}"
            )

    def level(self, psi: float, ks: float | None) -> Level:
        worst: Level = "ok"
        for value, warn, fail in (
            (psi, self.psi_warn, self.psi_fail),
            (ks, self.ks_warn, self.ks_fail),
        ):
            if value is None:
                continue
            # NaN compares false with everything: it is a failure, never a pass.
            if not value < fail:
                return "fail"
            if not value < warn:
                worst = "warn"
        return worst


@dataclass(frozen=True)
class DriftThresholds(ColumnLines):
    """The configured lines of every column, a column's own lines where measured (`columns`,
    from `natural_lines`), and the rows below which a comparison is not judged."""

    min_rows: int = 50
    """Fewer current rows than this: too few to judge; the day is reported, never an event."""
    columns: Mapping[str, ColumnLines] = field(default_factory=dict)
    calendar: tuple[str, ...] = ()
    """Features that are a function of the date alone (month, weekday, distance to a holiday):
    measured and shown, never flagged. Every day after training is a date the model never saw,
    so they always move further than in any window of its training days, and a person learns
    nothing from the alarm; the score's drift and the realized performance say whether the
    model copes with the new dates."""

    def lines(self, column: str | None = None) -> ColumnLines:
        """The lines `column` is judged by: its own when measured, else the configured ones."""
        if column is not None and column in self.columns:
            return self.columns[column]
        return ColumnLines(self.psi_warn, self.psi_fail, self.ks_warn, self.ks_fail)

    def level(self, psi: float, ks: float | None, column: str | None = None) -> Level:
        if column is not None and column in self.calendar:
            return "ok"
        return self.lines(column).level(psi, ks)

    def with_columns(self, columns: Mapping[str, ColumnLines]) -> "DriftThresholds":
        return replace(self, columns=dict(columns))


@dataclass(frozen=True)
class ColumnDrift:
    name: str
    kind: Kind
    psi: float
    ks_statistic: float | None
    ks_pvalue: float | None
    reference_missing: float
    current_missing: float
    level: Level
    unseen: float = 0.0
    """Share of current rows with a category the reference never saw (categorical only)."""


@dataclass(frozen=True)
class DriftReport:
    columns: tuple[ColumnDrift, ...]
    score: ColumnDrift | None
    reference_rows: int
    current_rows: int
    thresholds: DriftThresholds = field(default_factory=DriftThresholds)

    @property
    def features(self) -> tuple[ColumnDrift, ...]:
        return tuple(c for c in self.columns if c.kind != "score")

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.features if c.level == "fail"]

    @property
    def warned(self) -> list[str]:
        return [c.name for c in self.features if c.level == "warn"]

    @property
    def failed_share(self) -> float:
        return len(self.failed) / len(self.features) if self.features else 0.0

    @property
    def too_few_rows(self) -> bool:
        return self.current_rows < self.thresholds.min_rows

    @property
    def drift_event(self) -> bool:
        """Whether this comparison should trigger a retrain: the score failed on enough rows."""
        return not self.too_few_rows and self.score is not None and self.score.level == "fail"

    @property
    def level(self) -> Level:
        if self.drift_event:
            return "fail"
        if self.failed or self.warned or (self.score is not None and self.score.level != "ok"):
            return "warn"
        return "ok"

    def summary(self) -> str:
        score = "no score"
        if self.score is not None:
            # Predicted classes (multiclass) have a PSI over the classes and no KS.
            ks = self.score.ks_statistic
            shown = "" if ks is None else f", KS {ks:.3f}"
            score = f"score PSI {self.score.psi:.3f}{shown} ({self.score.level})"
        head = (
            f"{score}; {len(self.failed)} of {len(self.features)} features drifted,"
            f" {len(self.warned)} warned; {self.current_rows} rows vs {self.reference_rows}"
            " reference rows"
        )
        if self.too_few_rows:
            head += f"; fewer than {self.thresholds.min_rows} rows: not judged"
        if self.failed:
            head += ": " + ", ".join(self.failed[:8]) + (" …" if len(self.failed) > 8 else "")
        return head

    def table(self) -> str:
        """Markdown, worst first."""
        rows = sorted(
            self.columns,
            key=lambda c: (-_ORDER[c.level], -(c.psi if math.isfinite(c.psi) else 1e9)),
        )
        lines = [
            "| column | kind | level | PSI | PSI warn / fail | KS | KS p | missing ref → now"
            " | unseen |"
        ]
        lines.append("|---|---|---|---|---|---|---|---|---|")
        for c in rows:
            ks = "" if c.ks_statistic is None else f"{c.ks_statistic:.3f}"
            p = "" if c.ks_pvalue is None else f"{c.ks_pvalue:.1e}"
            unseen = f"{c.unseen:.1%}" if c.kind == "categorical" else ""
            line = self.thresholds.lines(c.name)
            level = "calendar: not judged" if c.name in self.thresholds.calendar else c.level
            lines.append(
                f"| {c.name} | {c.kind} | {level} | {c.psi:.3f} |"
                f" {line.psi_warn:.3g} / {line.psi_fail:.3g} | {ks} | {p} |"
                f" {c.reference_missing:.1%} → {c.current_missing:.1%} | {unseen} |"
            )
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {
            "drift_event": self.drift_event,
            "level": self.level,
            "failed": self.failed,
            "warned": self.warned,
            "failed_share": self.failed_share,
            "reference_rows": self.reference_rows,
            "current_rows": self.current_rows,
            "thresholds": asdict(self.thresholds),
            "columns": [asdict(c) for c in self.columns],
        }


def psi(reference_counts: np.ndarray, current_counts: np.ndarray) -> float:
    """Population stability index of two histograms over the same bins (counts, not shares):
    sum over bins of (current - reference) · ln(current / reference), after smoothing."""
    reference = np.asarray(reference_counts, dtype="float64") + _SMOOTHING
    current = np.asarray(current_counts, dtype="float64") + _SMOOTHING
    reference /= reference.sum()
    current /= current.sum()
    return float(np.sum((current - reference) * np.log(current / reference)))


def numeric_counts(
    reference: np.ndarray, current: np.ndarray, bins: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    """Counts of both samples in the reference's quantile bins, plus a last bin for missing."""
    ref = np.asarray(reference, dtype="float64")
    cur = np.asarray(current, dtype="float64")
    ref_present, cur_present = ref[np.isfinite(ref)], cur[np.isfinite(cur)]
    if ref_present.size:
        inner = np.unique(np.quantile(ref_present, np.linspace(0, 1, bins + 1)[1:-1]))
    else:
        inner = np.empty(0)
    # A value equal to an edge falls in the bin below it, so a constant reference (one edge)
    # splits into "at most the value" and "above it".
    ref_bins = np.bincount(
        np.searchsorted(inner, ref_present, side="left"), minlength=inner.size + 1
    )
    cur_bins = np.bincount(
        np.searchsorted(inner, cur_present, side="left"), minlength=inner.size + 1
    )
    return (
        np.append(ref_bins, ref.size - ref_present.size),
        np.append(cur_bins, cur.size - cur_present.size),
    )


def categorical_counts(
    reference: pd.Series, current: pd.Series
) -> tuple[np.ndarray, np.ndarray, float]:
    """Counts over the reference's categories, one bin for unseen ones and one for missing; and
    the current share of unseen categories."""
    ref = _labels(reference)
    cur = _labels(current)
    known = pd.Index(sorted(set(ref.unique()) - {_MISSING}))
    cur_unseen = ~cur.isin(known) & (cur != _MISSING)
    cur = cur.where(~cur_unseen, _UNSEEN)
    order = [*known, _UNSEEN, _MISSING]
    ref_counts = ref.value_counts().reindex(order, fill_value=0).to_numpy()
    cur_counts = cur.value_counts().reindex(order, fill_value=0).to_numpy()
    unseen = float(cur_unseen.mean()) if len(cur) else 0.0
    return ref_counts, cur_counts, unseen


def column_drift(
    name: str,
    kind: Kind,
    reference: pd.Series,
    current: pd.Series,
    thresholds: DriftThresholds,
) -> ColumnDrift:
    ref_missing = float(reference.isna().mean()) if len(reference) else 0.0
    cur_missing = float(current.isna().mean()) if len(current) else 0.0
    if kind == "categorical" or (kind == "score" and predicted_classes(reference)):
        ref_counts, cur_counts, unseen = categorical_counts(reference, current)
        value = psi(ref_counts, cur_counts)
        return ColumnDrift(
            name, kind, value, None, None, ref_missing, cur_missing,
            thresholds.level(value, None, name), unseen,
        )  # fmt: skip
    ref = pd.to_numeric(reference, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    cur = pd.to_numeric(current, errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    value = psi(*numeric_counts(ref, cur))
    statistic, pvalue = _ks(ref[np.isfinite(ref)], cur[np.isfinite(cur)])
    return ColumnDrift(
        name, kind, value, statistic, pvalue, ref_missing, cur_missing,
        thresholds.level(value, statistic, name),
    )  # fmt: skip


def predicted_classes(score: pd.Series) -> bool:
    """Whether a score column holds predicted classes' names (multiclass), not numbers: its
    drift is then that of the shares of the classes."""
    return not pd.api.types.is_numeric_dtype(score) and not pd.api.types.is_bool_dtype(score)


def compare(
    reference: pd.DataFrame,
    current: pd.DataFrame,
    numeric: Sequence[str],
    categorical: Sequence[str],
    thresholds: DriftThresholds | None = None,
    score: str | None = SCORE,
) -> DriftReport:
    """The drift of `current` from `reference`, per feature and for the score column (when both
    frames have it)."""
    thresholds = thresholds or DriftThresholds()
    missing = [c for c in [*numeric, *categorical] if c not in reference or c not in current]
    if missing:
        raise ValueError(f"drift: column(s) {missing} missing from the reference or the day")
    columns = [column_drift(c, "numeric", reference[c], current[c], thresholds) for c in numeric]
    columns += [
        column_drift(c, "categorical", reference[c], current[c], thresholds) for c in categorical
    ]
    score_drift = None
    if score is not None and score in reference and score in current:
        score_drift = column_drift(score, "score", reference[score], current[score], thresholds)
        columns.append(score_drift)
    return DriftReport(
        columns=tuple(columns),
        score=score_drift,
        reference_rows=len(reference),
        current_rows=len(current),
        thresholds=thresholds,
    )


def rule_lines(
    rule: LineRule, values: np.ndarray, floor: tuple[float, float]
) -> tuple[float, float]:
    """The warn and fail lines `rule` sets from `values` (a column's PSI or KS in each window of
    the training period), never below `floor`'s (warn, fail)."""
    if not values.size:
        return floor
    if rule.method == "quantiles":
        warn, fail = np.quantile(values, [rule.warn, rule.fail])
    else:
        mean, deviation = float(values.mean()), float(values.std())
        warn, fail = mean + rule.warn * deviation, mean + rule.fail * deviation
    return max(floor[0], float(warn)), max(floor[1], float(fail))


def declared_lines(
    frame: pd.DataFrame,
    days: pd.Series,
    numeric: Sequence[str],
    categorical: Sequence[str],
    settings: DriftSettings,
) -> "NaturalLines | None":
    """`natural_lines` as a use case's drift settings ask: over its window, by its rule, never
    below its absolute lines."""
    floor = ColumnLines(settings.psi_warn, settings.psi_fail, settings.ks_warn, settings.ks_fail)
    return natural_lines(
        frame, days, numeric, categorical, settings.window_days, floor, settings.line_rule()
    )


def natural_lines(
    frame: pd.DataFrame,
    days: pd.Series,
    numeric: Sequence[str],
    categorical: Sequence[str],
    window_days: int,
    floor: ColumnLines,
    rule: LineRule = DEFAULT_RULE,
    score: str | None = SCORE,
) -> "NaturalLines | None":
    """Each column's lines from how far it moved inside the model's own training period.

    `frame` holds the training rows (features, and the served model's `score` for each), `days`
    the local day of each row. Every run of `window_days` consecutive days of the period is
    compared, as a monitored window is, with the rest of the period (the same PSI and KS); a
    column's warn and fail lines are set from its windows' values by `rule`, never below
    `floor`. None when the period holds fewer than two windows' days: too short to say how much
    a column varies."""
    period = sorted(set(days))
    if len(period) < 2 * window_days:
        return None
    kinds: dict[str, Kind] = {c: "numeric" for c in numeric}
    kinds |= {c: "categorical" for c in categorical}
    if score is not None and score in frame:
        kinds[score] = "score"
    values: dict[str, list[tuple[float, float | None]]] = {c: [] for c in kinds}
    as_classes = {
        c for c, kind in kinds.items() if kind == "categorical" or predicted_classes(frame[c])
    }
    numbers = {
        c: pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
        for c in kinds
        if c not in as_classes
    }
    categories = {c: frame[c] for c in as_classes}
    for first in range(len(period) - window_days + 1):
        inside = days.isin(period[first : first + window_days]).to_numpy()
        for column, values_ in numbers.items():
            rest, window = values_[~inside], values_[inside]
            statistic = _ks_statistic(rest[np.isfinite(rest)], window[np.isfinite(window)])
            values[column].append((psi(*numeric_counts(rest, window)), statistic))
        for column, text in categories.items():
            counts = categorical_counts(text[~inside], text[inside])
            values[column].append((psi(counts[0], counts[1]), None))
    lines = {}
    for column, measured in values.items():
        psis = np.array([v[0] for v in measured], dtype="float64")
        kss = np.array([v[1] for v in measured if v[1] is not None], dtype="float64")
        psi_warn, psi_fail = rule_lines(rule, psis, (floor.psi_warn, floor.psi_fail))
        ks_warn, ks_fail = rule_lines(rule, kss, (floor.ks_warn, floor.ks_fail))
        lines[column] = ColumnLines(psi_warn, psi_fail, min(ks_warn, 1.0), min(ks_fail, 1.0))
    return NaturalLines(
        window_days=window_days,
        windows=len(period) - window_days + 1,
        rule=rule,
        columns=lines,
    )


@dataclass(frozen=True)
class NaturalLines:
    """Columns' lines measured on a training period (`natural_lines`), and how."""

    window_days: int
    windows: int
    rule: LineRule
    columns: Mapping[str, ColumnLines]

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_days": self.window_days,
            "windows": self.windows,
            "rule": asdict(self.rule),
            "columns": {c: asdict(lines) for c, lines in self.columns.items()},
        }

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> "NaturalLines":
        if "rule" in document:
            rule = LineRule(**document["rule"])
        else:  # lines registered before the rule was a choice: always quantiles
            rule = LineRule("quantiles", document["warn_quantile"], document["fail_quantile"])
        return cls(
            window_days=int(document["window_days"]),
            windows=int(document["windows"]),
            rule=rule,
            columns={c: ColumnLines(**v) for c, v in document["columns"].items()},
        )

    def describe(self) -> str:
        return (
            f"measured on the training period: {self.windows} windows of {self.window_days}"
            f" days, each against the rest; {self.rule.describe()}"
        )


def reference_sample(
    frame: pd.DataFrame, rows: int = REFERENCE_ROWS, seed: int = 0
) -> pd.DataFrame:
    """At most `rows` rows of `frame`, drawn without replacement with `seed` (same frame and seed
    → same sample), in their original order."""
    if len(frame) <= rows:
        return frame.reset_index(drop=True)
    picked = np.sort(np.random.default_rng(seed).choice(len(frame), size=rows, replace=False))
    return frame.iloc[picked].reset_index(drop=True)


def _labels(values: pd.Series) -> pd.Series:
    text = values.astype("string")
    return text.fillna(_MISSING).where(text.fillna("") != "", _MISSING).astype(object)


def _ks_statistic(reference: np.ndarray, current: np.ndarray) -> float | None:
    """The two-sample Kolmogorov-Smirnov statistic (scipy's, without its p-value): the largest
    gap between the two empirical CDFs."""
    if reference.size == 0 or current.size == 0:
        return None
    reference, current = np.sort(reference), np.sort(current)
    points = np.concatenate([reference, current])
    gaps = (
        np.searchsorted(reference, points, side="right") / reference.size
        - np.searchsorted(current, points, side="right") / current.size
    )
    return float(np.abs(gaps).max())


def _ks(reference: np.ndarray, current: np.ndarray) -> tuple[float | None, float | None]:
    if reference.size == 0 or current.size == 0:
        return None, None
    from scipy.stats import ks_2samp

    result: Any = ks_2samp(reference, current)
    return float(result.statistic), float(result.pvalue)
