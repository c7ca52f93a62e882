"""What a validation found: the outcome of each rule (`RuleResult`) and the verdict on a
partition (`ValidationReport`), and how they are drawn up: from GX's outcomes (`rule_result`),
from the rules taken in pandas (`event_time_parts`), and with failures restated in terms a person
can act on (`explained`). pandas is imported inside functions only.
"""

import functools
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from declare.contracts import TableContract
from resources.gx_suites import COLUMN_SET, RULE_KEY
from resources.timestamps import UTC_OFFSET

if TYPE_CHECKING:
    import pandas as pd

SAMPLE_SIZE = 5
"""How many offending values a failed rule keeps as its sample."""
ON_ROWS = " on {} rows"
"""How a failed type rule without a count names the rows: "column of type object (declared
number) on 915 rows"."""


@dataclass(frozen=True)
class RuleResult:
    """The outcome of one rule on one partition."""

    rule: str
    level: Literal["table", "row"]
    passed: bool
    unexpected_count: int
    sample: tuple[str, ...] = ()
    rows: tuple[int, ...] = ()
    """Positions of the rows that broke a row rule."""
    observed: str | None = None
    """What a table rule saw instead (e.g. the row count or the column's type)."""
    error: str | None = None
    """Set when GX could not evaluate the rule at all (e.g. the column is missing)."""
    column: str | None = None
    holds: str | None = None
    """What the `unexpected_count` rows of a failed table rule hold, when they are counted
    (`observed` is then "<found>: <count> of <rows> rows hold <holds>")."""
    found: str | None = None
    """The column's physical type found and the kind declared, for a counted type failure:
    "column of type object (declared number)"."""


@dataclass(frozen=True)
class ValidationReport:
    """Every rule's outcome for one table partition, and the verdict drawn from them."""

    table: str
    partition: str
    row_count: int
    max_rejected_share: float
    rules: tuple[RuleResult, ...]
    data_docs_url: str | None = None

    @property
    def failed_rules(self) -> list[RuleResult]:
        return [rule for rule in self.rules if not rule.passed]

    @property
    def table_failures(self) -> list[RuleResult]:
        return [rule for rule in self.failed_rules if rule.level == "table"]

    @functools.cached_property
    def rejected_rows(self) -> frozenset[int]:
        """Positions of rows broken by at least one row rule."""
        return frozenset(
            pos for rule in self.failed_rules if rule.level == "row" for pos in rule.rows
        )

    @property
    def rejected_share(self) -> float:
        return len(self.rejected_rows) / self.row_count if self.row_count else 0.0

    @property
    def passed(self) -> bool:
        """Publishable: every table rule holds and the quarantined share is within budget."""
        return not self.table_failures and self.rejected_share <= self.max_rejected_share

    def rejection_reasons(self) -> dict[int, str]:
        """Row position → the names of the row rules that rejected it, sorted and `; `-joined."""
        reasons: dict[int, list[str]] = {}
        for rule in self.failed_rules:
            if rule.level == "row":
                for position in rule.rows:
                    reasons.setdefault(position, []).append(rule.rule)
        return {position: "; ".join(sorted(names)) for position, names in reasons.items()}

    def summary(self) -> str:
        """One line per broken rule, naming the partition, the rule and the count."""
        where = f"{self.table} partition {self.partition}"
        if not self.failed_rules:
            return f"{where}: all {len(self.rules)} rules passed on {self.row_count} rows"
        lines = []
        if self.passed:
            lines.append(
                f"{where}: published; {len(self.rejected_rows)} of {self.row_count} rows"
                " quarantined"
                f" ({self.rejected_share:.2%} <= {self.max_rejected_share:.2%})"
            )
        elif self.table_failures:
            lines.append(f"{where}: REFUSED, {len(self.table_failures)} table rule(s) failed")
        else:
            lines.append(
                f"{where}: REFUSED, {len(self.rejected_rows)} of {self.row_count} rows broke"
                " row rules"
                f" ({self.rejected_share:.2%} > max {self.max_rejected_share:.2%})"
            )
        for rule in self.failed_rules:
            if rule.error:
                detail = rule.error
            elif rule.observed is not None:
                detail = f"observed {rule.observed}"
            else:
                detail = f"{rule.unexpected_count} of {self.row_count} rows"
            sample = f"; e.g. {', '.join(rule.sample)}" if rule.sample else ""
            lines.append(f"  - rule {rule.rule} ({rule.level}): {detail}{sample}")
        return "\n".join(lines)


def rule_name(outcome: Any) -> str:
    """Our name of the rule a GX outcome (an ExpectationValidationResult) is of."""
    return outcome.expectation_config.meta[RULE_KEY]


def rule_result(outcome: Any) -> RuleResult:
    """A GX outcome as our rule's result: its level, count, sample and rows, or what GX observed
    or could not evaluate."""
    meta = outcome.expectation_config.meta or {}
    rule, level, column = meta[RULE_KEY], meta["level"], meta.get("column")
    if outcome.success:
        return RuleResult(rule, level, True, 0, column=column)
    if outcome.exception_info and outcome.exception_info.get("raised_exception"):
        message = str(outcome.exception_info.get("exception_message", "")).strip().splitlines()
        error = f"could not be evaluated: {message[-1] if message else 'unknown error'}"
        # A row rule GX cannot evaluate says nothing about single rows: refuse the table.
        return RuleResult(rule, "table", False, 0, error=error, column=column)
    result = outcome.result or {}
    unexpected = result.get("unexpected_count")
    sample = tuple(repr(v) for v in (result.get("partial_unexpected_list") or [])[:SAMPLE_SIZE])
    if unexpected is None:
        # An aggregate outcome (row count, column set, a typed column's dtype): no single row to
        # blame, so a failure refuses the table whatever level the rule was declared at.
        observed = result.get("observed_value")
        passed = bool(outcome.success)
        return RuleResult(
            rule,
            "table",
            passed,
            0 if passed else 1,
            observed=None if passed or observed is None else str(observed),
            column=column,
        )
    rows = tuple(int(i) for i in result.get("unexpected_index_list") or ())
    return RuleResult(
        rule, level, bool(outcome.success), int(unexpected), sample, rows, column=column
    )


def event_time_parts(
    contract: TableContract, frame: "pd.DataFrame", timezone: str
) -> tuple[RuleResult, ...]:
    """Row rules, computed with pandas: each column declared to restate a part of the event time
    equals that part of the event time in `timezone`. Rows missing either value are left to the
    not-null rules."""
    import numpy as np
    import pandas as pd

    times = frame.get(contract.event_time, pd.Series(dtype=object))
    local = None
    if isinstance(times.dtype, pd.DatetimeTZDtype):
        local = times.dt.tz_convert(timezone)
    out = []
    for rule in contract.columns:
        part, column = rule.event_time_part, rule.column
        if part is None:
            continue
        name = f"{column}.equals_{contract.event_time}_local_{part}"
        values = frame.get(column)
        if local is None or values is None or not pd.api.types.is_numeric_dtype(values):
            error = f"not evaluated: needs a number {column} and a UTC-aware {contract.event_time}"
            out.append(RuleResult(name, "table", False, 0, error=error, column=column))
            continue
        expected = getattr(local.dt, part)
        bad = (values.notna() & local.notna() & (values != expected)).to_numpy()
        sample = tuple(
            f"{value!r} ({contract.event_time} {time.isoformat()})"
            for value, time in zip(values[bad][:SAMPLE_SIZE], times[bad][:SAMPLE_SIZE], strict=True)
        )
        rows = tuple(int(i) for i in np.flatnonzero(bad))
        out.append(RuleResult(name, "row", not rows, len(rows), sample, rows, column=column))
    return tuple(out)


def explained(
    rules: tuple[RuleResult, ...], frame: "pd.DataFrame", contract: TableContract
) -> tuple[RuleResult, ...]:
    """Failures restated in terms a person can act on, with counts of the offending rows.

    A column set that is not the contract's names the missing and the unexpected columns. A CSV
    column with a single non-number in it arrives as text, and GX then counts every value as the
    wrong type; the rows to fix are those whose text is not a number. A timestamp column with
    values that are not UTC-aware timestamps fails without a count; the rows to fix are those
    values. Each names the column's type found and the kind declared. Rules on a column whose
    type is wrong are not evaluated on it, and any other rule GX failed without a count gets the
    column's type, the kind declared and the row count. An empty frame is reported by its row
    count and columns alone: a column of no values has no type.
    """
    import pandas as pd

    rules = tuple(
        replace(rule, observed=column_set_difference(frame.columns, contract))
        if rule.rule == COLUMN_SET and not rule.passed
        else rule
        for rule in rules
    )
    if frame.empty:
        return tuple(rule for rule in rules if rule.column is None)
    kinds = {rule.column: rule.kind for rule in contract.columns}
    timestamps = set(contract.timestamp_columns)
    mistyped = {r.column for r in rules if not r.passed and r.rule.endswith(".is_number")}
    out = []
    for rule in rules:
        column = rule.column
        if rule.passed or column is None or column not in frame.columns:
            out.append(rule)
            continue
        values = frame[column]
        found = f"column of type {values.dtype} (declared {kinds[column]})"
        if column in timestamps and not isinstance(values.dtype, pd.DatetimeTZDtype):
            bad, what = _not_utc_timestamps(values)
            out.append(_counted(rule, frame, bad, what, found))
        elif column in mistyped and rule.rule.endswith(".is_number"):
            bad = values.notna() & pd.Series(pd.to_numeric(values, errors="coerce")).isna()
            if bad.any():
                out.append(_counted(rule, frame, bad, "text that is not a number", found))
            else:  # every value reads as a number: it is the column's type that is wrong
                observed = (
                    f"{found}{ON_ROWS.format(len(frame))}: every value is a number stored as"
                    f" {values.dtype}; store the column as a number"
                )
                out.append(replace(rule, observed=observed))
        elif column in mistyped:
            out.append(replace(rule, level="table", error="not evaluated: the column is mistyped"))
        elif (
            rule.level == "table"
            and rule.error is None
            and (rule.observed is None or rule.rule == f"{column}.is_{kinds[column]}")
        ):  # GX observes a type rule's dtype alone
            out.append(replace(rule, observed=f"{found}{ON_ROWS.format(len(frame))}"))
        else:
            out.append(rule)
    return tuple(out)


def _counted(
    rule: RuleResult, frame: "pd.DataFrame", bad: "pd.Series", holds: str, found: str
) -> RuleResult:
    """A failed type rule restated as the rows at fault: those `bad` marks, which hold `holds`."""
    return replace(
        rule,
        level="table",
        error=None,
        unexpected_count=int(bad.sum()),
        sample=tuple(repr(v) for v in frame[rule.column][bad].head(SAMPLE_SIZE)),
        observed=holding(found, int(bad.sum()), len(frame), holds),
        holds=holds,
        found=found,
    )


def holding(found: str | None, count: int, rows: int, holds: str) -> str:
    """What a counted type failure observed."""
    return f"{found + ': ' if found else ''}{count} of {rows} rows hold {holds}"


def column_set_difference(columns: Iterable[Any], contract: TableContract) -> str:
    """How a table's columns (their names, in order) differ from the contract's."""
    declared, present = contract.column_names, [str(c) for c in columns]
    missing = [c for c in declared if c not in present]
    unexpected = [c for c in present if c not in declared]
    repeated = sorted({c for c in present if present.count(c) > 1})
    parts = [
        f"{what}: {', '.join(names)}"
        for what, names in (
            ("missing", missing),
            ("unexpected", unexpected),
            ("repeated", repeated),
        )
        if names
    ]
    return ", ".join(parts) or "the contract's columns"


def _not_utc_timestamps(values: "pd.Series") -> tuple["pd.Series", str]:
    """Which values of a timestamp column are not UTC-aware timestamps, and what they hold."""
    import pandas as pd

    present = values.notna()
    if pd.api.types.is_datetime64_any_dtype(values):
        return present, "timezone-naive timestamps (they must be UTC-aware)"
    with_offset = values.astype(str).str.contains(UTC_OFFSET, regex=True)
    parsed = pd.to_datetime(values.where(with_offset), format="ISO8601", utc=True, errors="coerce")
    return present & parsed.isna(), "text that is not a UTC-aware ISO-8601 timestamp"
