"""The policies a use case declares: when its nightly runs start, how drift is judged, how realized
performance is judged, and how far a new version of a published day may fall short of the last
good one. Plain frozen dataclasses, checked when they are made."""

import datetime as dt
import math
import re
from dataclasses import dataclass, replace
from typing import Literal

METHODS = ("deviations", "quantiles")


@dataclass(frozen=True)
class LineRule:
    """How a column's warn and fail lines are set from the values (PSI, KS) of its windows in
    the training period.

    - `"deviations"`: their mean plus `warn` (`fail`) standard deviations, a control chart's
      limits. A training period holds few independent windows (31 days: four weeks), so the
      most a column moved in them is a low estimate of how far it moves by chance
      (docs/monitoring.md measures both on a bundled use case).
    - `"quantiles"`: the `warn` and `fail` quantiles of those values (1.0: the most it ever
      moved)."""

    method: Literal["deviations", "quantiles"] = "deviations"
    warn: float = 2.0
    fail: float = 3.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method {self.method!r} is neither 'deviations' nor 'quantiles'")
        top = 1.0 if self.method == "quantiles" else math.inf
        if not 0 <= self.warn <= self.fail <= top:
            raise ValueError(
                f"need 0 <= warn <= fail{' <= 1' if top == 1 else ''} with {self.method!r},"
                f" got {self.warn}, {self.fail}"
            )

    def describe(self) -> str:
        if self.method == "quantiles":
            return f"warn at their {self.warn:g} quantile, fail at their {self.fail:g} quantile"
        return (
            f"warn at their mean + {self.warn:g} standard deviations, fail at their mean +"
            f" {self.fail:g} standard deviations"
        )


DEFAULT_RULE = LineRule()
"""Mean + 2 standard deviations warns, mean + 3 fails."""


@dataclass(frozen=True)
class Revisions:
    """How far a new version of a published day may fall short before it is held back."""

    max_row_loss: float = 0.10
    """Largest share (0..1) of the last good version's rows a new version may lose, and by which
    the day may hold fewer rows than a table declared to describe the same events
    (`EventTable.same_events_as`). A column that turns entirely null where the last good version
    had values is held back whatever this share."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_row_loss <= 1:
            raise ValueError(f"revisions.max_row_loss must be in [0, 1], got {self.max_row_loss}")


@dataclass(frozen=True)
class DriftSettings:
    """How `feature_drift` judges a window of days against the champion's training rows."""

    window_days: int = 7
    """Days compared, ending with the day."""
    psi_warn: float = 0.1
    """PSI from which a column warns: every column's with `lines="absolute"`, the least a
    column's measured line may be with `"natural"` (as the three below)."""
    psi_fail: float = 0.25
    """PSI from which a column fails."""
    ks_warn: float = 0.1
    """KS statistic from which a column warns."""
    ks_fail: float = 0.2
    """KS statistic from which a column fails."""
    min_rows: int = 50
    """Fewer scored rows in the window: reported, never an event."""
    lines: Literal["natural", "absolute"] = "natural"
    """`"natural"`: each column (and the score) is judged by how far it moved between windows of
    the model's own training period, measured when the model is exported
    (`ml.drift.natural_lines`); `"absolute"`: by the lines above."""
    rule: Literal["deviations", "quantiles"] = "deviations"
    warn_at: float = 2.0
    fail_at: float = 3.0
    """How a column's measured lines are set from how far it moved between windows of the
    training period (`LineRule`): by default its mean movement plus 2 (warn) and 3
    (fail) standard deviations; with `"quantiles"`, those quantiles of it (0.9 and 1.0: warn
    past nine windows in ten, fail past the most it ever moved)."""

    calendar: tuple[str, ...] = ()
    """Features (`<view>__<feature>`, as served) that are a function of the date alone: shown in
    the drift table, never flagged (`ml.drift.DriftThresholds.calendar`)."""

    def line_rule(self) -> LineRule:
        return LineRule(self.rule, self.warn_at, self.fail_at)

    def problem(self) -> tuple[str, str] | None:
        """The field and what is wrong with it, if anything."""
        if self.window_days < 1:
            return "drift.window_days", f"{self.window_days} is not >= 1"
        if self.min_rows < 1:
            return "drift.min_rows", f"{self.min_rows} is not >= 1"
        for warn, fail in (("psi_warn", "psi_fail"), ("ks_warn", "ks_fail")):
            if not 0 <= getattr(self, warn) <= getattr(self, fail):
                return f"drift.{warn}", f"need 0 <= {warn} <= {fail}"
        if self.lines not in ("natural", "absolute"):
            return "drift.lines", f"{self.lines!r} is neither 'natural' nor 'absolute'"
        try:
            self.line_rule()
        except ValueError as error:
            return ("drift.rule" if self.rule not in METHODS else "drift.warn_at"), str(error)
        return None


REALIZED_METRICS = {
    **dict.fromkeys(("roc_auc", "average_precision", "accuracy", "f1", "r2"), True),
    **dict.fromkeys(("macro_f1", "macro_recall", "macro_roc_auc"), True),
    **dict.fromkeys(("log_loss", "brier", "calibration_error", "rmse", "mae"), False),
}
"""The metrics realized performance can judge, and whether higher is better for each."""


@dataclass(frozen=True)
class DecayPolicy:
    """How `realized_performance` judges what a model's predictions realized, once their outcomes
    are known, against the model's own test figure (`ml.realized`)."""

    metric: str | None = None
    """The metric judged; None: the task's (`roc_auc` for a binary model, `rmse` for a
    regression, `macro_f1` for a multiclass one)."""
    max_drop: float = 0.1
    """The relative degradation that fails: a realized figure worse than the test figure by more
    than this fraction of it (0.1: a ROC AUC under 0.9 times the tested one, an RMSE over 1.1
    times it)."""
    level: float = 0.95
    """The bootstrap interval's coverage."""
    samples: int = 400
    """Bootstrap resamples (seeded: the same rows give the same interval)."""
    min_rows: int = 50
    """Fewer labelled rows: reported, not judged."""
    seed: int = 0
    """Seeds the bootstrap's resampling."""
    window_days: int = 7
    """Days of the trailing window judged, ending with the day."""

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in REALIZED_METRICS:
            raise ValueError(f"metric {self.metric!r}: one of {sorted(REALIZED_METRICS)}")
        if not 0 < self.max_drop < 1:
            raise ValueError(f"max_drop={self.max_drop}: must lie in (0, 1)")
        if not 0 < self.level < 1:
            raise ValueError(f"level={self.level}: must lie in (0, 1)")
        if self.samples < 10 or self.min_rows < 1:
            raise ValueError("samples must be >= 10 and min_rows >= 1")
        if self.window_days < 1:
            raise ValueError(f"window_days={self.window_days}: must be >= 1")

    def metric_for(self, task: str) -> str:
        """The metric judged for a model of `task`: `metric`, else the task's."""
        if self.metric is not None:
            return self.metric
        return {"binary": "roc_auc", "multiclass": "macro_f1"}.get(task, "rmse")

    def for_task(self, task: str) -> "DecayPolicy":
        """This policy with its metric named (`metric_for`)."""
        return replace(self, metric=self.metric_for(task))


HH_MM = re.compile(r"([01][0-9]|2[0-3]):[0-5][0-9]")


@dataclass(frozen=True)
class Automation:
    """When a use case's nightly schedules start, in its partitions' time zone: the daily run of
    the day before, and the retrain."""

    daily_at: str = "02:30"
    """When the nightly run processes the day before, HH:MM: not before the day's outcomes are
    all known (`Label.known_after`, checked by `UseCase`)."""
    retrain_cron: str = "0 4 * * *"
    """When the nightly retrain starts, a five-field cron string. Dagster's scheduler reads it,
    and refuses one it cannot read when the schedule is built, as the code location loads
    (naming the schedule, `<use case>_nightly_retrain`)."""

    @property
    def daily_time(self) -> dt.time:
        """`daily_at` as a time of day."""
        return dt.time.fromisoformat(self.daily_at)

    def problem(self) -> tuple[str, str] | None:
        """The field and what is wrong with it, if anything."""
        if not HH_MM.fullmatch(self.daily_at):
            return "automation.daily_at", f"{self.daily_at!r} is not HH:MM"
        return None
