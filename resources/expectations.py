"""Great Expectations 1.x, called directly: table contracts become GX suites, run on a DataFrame.

A `TableContract` (resources/contracts.py) declares what a raw table must look like with generic
rule kinds; this module turns it into an ExpectationSuite, validates one partition's frame with
GX, and returns a typed `ValidationReport`. Rules come in two levels:

- table rules (the column set, the row count, a column's type): if one fails, the whole partition
  is refused;
- row rules (non-null, ranges, allowed values, patterns, values required where another column
  has one, natural-key uniqueness, the event time inside the partition's day, columns that
  restate a part of the event time agreeing with it): failing rows are
  quarantined with the rule that rejected them, as long as their share stays at or below the
  contract's `max_rejected_share`; above it the whole partition is refused.

A table too large to hold whole is validated a chunk at a time (`validate_chunks`): each chunk
is one GX validation, and their results are combined into the report one validation of the
whole table would give: counts, samples and row positions add up, the row count is judged on
the total, and natural keys must be unique across chunks too.

Several days of a table can be screened together (`screen_days`): one pass/fail validation of
their rows, with each day's event times shifted into one day's window, passes exactly when every
day would pass alone, and gives each of them the report it would get alone; a range with a
failure is left to be validated a day at a time, which names each day's broken rules.

GX is imported only inside methods: it takes seconds to import and the code location must load
without it.
"""

import copy
import datetime as dt
import functools
import itertools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import dagster as dg
from pydantic import Field

from resources.contracts import TableContract
from resources.sources import UTC_OFFSET

if TYPE_CHECKING:
    import pandas as pd


# Pandas reads integer columns with a missing value as float, so "number" admits both.
_TYPE_LISTS: dict[str, list[str]] = {
    "number": [
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "Int64",
        "Float64",
        "int",
        "float",
    ],
    "text": ["str", "StringDtype"],
}
SAMPLE_SIZE = 5
SCREEN_IN_PARTS_ROWS = 20_000
"""From this many rows a partition's pass/fail pass runs in parts on narrow frames (`_screen`):
at 336,776 rows it takes half the time of one pass over the whole frame; on a day of a thousand
rows the three validations' fixed cost outweighs what they save."""


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


class GreatExpectations(dg.ConfigurableResource):
    """Runs table contracts as Great Expectations suites and publishes GX Data Docs."""

    data_docs_dir: str = Field(description="Folder of the GX Data Docs site.")
    build_data_docs: bool = Field(
        default=True, description="Render each validation into the Data Docs site."
    )

    def validate_partition(
        self,
        contract: TableContract,
        frame: "pd.DataFrame",
        *,
        partition: str,
        window: tuple[dt.datetime, dt.datetime],
        timezone: str,
        references: Mapping[str, Sequence[Any]] | None = None,
        data_docs: bool = True,
    ) -> ValidationReport:
        """Validate one partition's frame against `contract`.

        `window` is the partition's [start, end) as UTC-aware datetimes and `timezone` the one
        its days are cut in (an IANA name, for `event_time_part` rules); `references` holds the
        sets named by `allowed_from`; `data_docs=False` skips rendering the Data Docs page
        (publishing re-validates what the check already rendered).

        Two passes: every rule first with GX's cheapest result format (pass/fail only), then
        only the rules that failed again with full detail (counts, samples, row positions).
        Clean partitions, the usual case, pay for the first pass alone. Without Data Docs, on
        `SCREEN_IN_PARTS_ROWS` rows or more, the first pass runs on the narrowest frames that
        give each rule its verdict (`_screen`).
        """
        import great_expectations as gx

        parameters = _suite_parameters(contract, window, references)
        frame = frame.reset_index(drop=True)

        context = _gx_context(self.data_docs_dir)
        definition = _validation_definition(self.data_docs_dir, contract)
        # Building a batch fingerprints the whole frame: build it only where it is used.
        get_batch = functools.partial(definition.data.get_batch, {"dataframe": frame})
        url = None
        if self.build_data_docs and data_docs:
            # Only a ValidationDefinition run lands in the results store Data Docs render from.
            screening = definition.run(
                batch_parameters={"dataframe": frame},
                expectation_parameters=parameters,
                result_format="BOOLEAN_ONLY",
                run_id=gx.RunIdentifier(run_name=f"{contract.table}-{partition}"),
            )
            url = self._publish(context)
            screened = screening.results
        elif len(frame) < SCREEN_IN_PARTS_ROWS or frame.columns.has_duplicates:
            screened = (
                get_batch()
                .validate(
                    definition.suite,
                    result_format="BOOLEAN_ONLY",
                    expectation_parameters=parameters,
                )
                .results
            )
        else:
            screened = _screen(definition, contract, frame, parameters)
        # The suite's order, whichever pass and part a result came from (GX orders its own).
        outcomes: dict[str, Any] = dict.fromkeys(
            e.meta[_RULE] for e in definition.suite.expectations
        )
        outcomes.update({_rule_name(o): o for o in screened})
        failed = [e for e in definition.suite.expectations if not outcomes[e.meta[_RULE]].success]
        if failed:
            detail = get_batch().validate(
                gx.ExpectationSuite(
                    name=f"{contract.table}_failures", expectations=[copy.copy(e) for e in failed]
                ),
                result_format={
                    "result_format": "COMPLETE",
                    "partial_unexpected_count": SAMPLE_SIZE,
                    # GX would otherwise also build a pandas query string listing every index.
                    "return_unexpected_index_query": False,
                },
                expectation_parameters=parameters,
            )
            outcomes.update({_rule_name(o): o for o in detail.results})
        return ValidationReport(
            table=contract.table,
            partition=partition,
            row_count=len(frame),
            max_rejected_share=contract.max_rejected_share,
            rules=_explained(
                tuple(_rule_result(o) for o in outcomes.values())
                + _event_time_parts(contract, frame, timezone),
                frame,
                contract,
            ),
            data_docs_url=url,
        )

    def validate_chunks(
        self,
        contract: TableContract,
        chunks: Callable[[], Iterator["pd.DataFrame"]],
        *,
        partition: str,
        window: tuple[dt.datetime, dt.datetime],
        timezone: str,
        references: Mapping[str, Sequence[Any]] | None = None,
        data_docs: bool = True,
    ) -> ValidationReport:
        """`validate_partition` for a table handed over a chunk at a time: `chunks()` gives its
        rows in order (one chunk at a time is held) and is called a second time only to sample
        natural keys duplicated across chunks. Data Docs are rendered for a table of one chunk
        only: a page per chunk would show none of the table's verdict.

        Natural keys are compared across chunks by a 64-bit hash of each row's key (with the
        chunk it is in, 12 bytes a row until the last chunk is validated, about 30 while they are
        compared): two different keys with the same hash would count as a duplicate, which at
        ten million rows happens with a chance of about one in 300,000."""
        validate = functools.partial(
            self.validate_partition,
            contract,
            partition=partition,
            window=window,
            timezone=timezone,
            references=references,
        )
        frames = chunks()
        first = next(frames)
        second = next(frames, None)
        if second is None:
            return validate(first, data_docs=data_docs)
        reports, keys = [], _KeyIndex(contract.natural_key)
        for chunk in itertools.chain([first, second], frames):
            reports.append(validate(chunk, data_docs=False))
            keys.add(chunk)
        del first, second
        return _combined(contract, reports, keys.duplicated_across_chunks(), chunks)

    def screen_days(
        self,
        contract: TableContract,
        days: Sequence["DayFrame"],
        *,
        timezone: str,
        references: Mapping[str, Sequence[Any]] | None = None,
    ) -> dict[str, ValidationReport]:
        """The reports of days that pass every GX rule of `contract`, from one pass/fail
        screening of the days together instead of one validation per day: what a backfill
        pays GX's fixed cost for once a range instead of once a day. Each report is the one
        `validate_partition` gives the day alone (the pandas rules are still taken per day).

        Days screened together (`_joint`) share their columns, dtypes and window length and
        hold at least the contract's rows; each rule then passes on every day exactly when it
        passes on their union, the event time shifted by its day's start (`_shifted`). Where
        any rule fails, or the days cannot be screened together, the days are missing from the
        result: the caller validates them one at a time, which names each day's failures."""
        import pandas as pd

        joint = _joint(contract, days)
        if len(joint) < 2:
            return {}
        parameters = _suite_parameters(contract, joint[0].window, references)
        union = pd.concat([day.frame for day in joint], ignore_index=True)
        definition = _validation_definition(self.data_docs_dir, contract)
        screened = _screen(
            definition, contract, union, parameters, per_value=_shifted(contract, joint, union)
        )
        if not all(outcome.success for outcome in screened):
            return {}
        passed = tuple(
            RuleResult(e.meta[_RULE], e.meta["level"], True, 0, column=e.meta.get("column"))
            for e in definition.suite.expectations
        )
        return {
            day.partition: ValidationReport(
                table=contract.table,
                partition=day.partition,
                row_count=len(day.frame),
                max_rejected_share=contract.max_rejected_share,
                rules=_explained(
                    passed + _event_time_parts(contract, day.frame, timezone),
                    day.frame,
                    contract,
                ),
            )
            for day in joint
        }

    def _publish(self, context: Any) -> str | None:
        """Render the latest validation into the Data Docs site; its page's URL."""
        identifier = context.validation_results_store.list_keys()[-1]
        try:
            urls = context.build_data_docs(
                site_names=[_DOCS_SITE], resource_identifiers=[identifier]
            )
        finally:
            # The in-memory store would otherwise grow with every partition this process validates.
            context.validation_results_store.remove_key(identifier)
        index = urls.get(_DOCS_SITE)
        if index is None:
            return None
        page = Path(self.data_docs_dir, "validations", *identifier.to_tuple()).with_suffix(".html")
        return page.as_uri() if page.is_file() else index


def _suite_parameters(
    contract: TableContract,
    window: tuple[dt.datetime, dt.datetime],
    references: Mapping[str, Sequence[Any]] | None,
) -> dict[str, Any]:
    """The suite's parameters for one window: its bounds and the contract's reference sets
    (every set its `allowed_from` rules name must be given)."""
    references = references or {}
    missing = contract.references - set(references)
    if missing:
        raise ValueError(f"{contract.table}: reference sets {sorted(missing)} were not given")
    parameters: dict[str, Any] = {_WINDOW_START: window[0], _WINDOW_END: window[1]}
    parameters.update({_parameter(name): sorted(set(v)) for name, v in references.items()})
    return parameters


@dataclass(frozen=True)
class DayFrame:
    """One partition's rows and its [start, end) window (UTC-aware), for `screen_days`."""

    partition: str
    frame: "pd.DataFrame"
    window: tuple[dt.datetime, dt.datetime]


def _joint(contract: TableContract, days: Sequence[DayFrame]) -> list[DayFrame]:
    """The days that can be screened together, with each rule's verdict on their union true of
    each day: the largest group of days with the same columns and dtypes (so the union keeps
    every value's type) and window length (so one shifted window judges every day), each day
    holding at least the contract's rows (a count the union cannot judge per day), with unique
    column names and a UTC-aware event time to shift."""
    import pandas as pd

    def fits(day: DayFrame) -> bool:
        frame = day.frame
        times = frame.get(contract.event_time)
        return (
            len(frame) >= max(contract.min_rows, 1)
            and not frame.columns.has_duplicates
            and isinstance(times, pd.Series)
            and isinstance(times.dtype, pd.DatetimeTZDtype)
        )

    candidates = [day for day in days if fits(day)]
    groups: dict[tuple[Any, ...], list[DayFrame]] = {}
    for day in candidates:
        schema = tuple(zip(day.frame.columns, day.frame.dtypes, strict=True))
        groups.setdefault((schema, day.window[1] - day.window[0]), []).append(day)
    return max(groups.values(), key=len, default=[])


def _shifted(
    contract: TableContract, days: Sequence[DayFrame], union: "pd.DataFrame"
) -> "pd.DataFrame":
    """`union` with each day's event times moved back by its day's distance from the first
    day's start: a time is inside its own day's window exactly when the shifted time is inside
    the first day's (the days are of one length, and the shift is exact in nanoseconds)."""
    import numpy as np
    import pandas as pd

    first = days[0].window[0]
    offsets = np.repeat(
        np.array([day.window[0] - first for day in days], dtype="timedelta64[ns]"),
        [len(day.frame) for day in days],
    )
    times = union[contract.event_time]
    return union.assign(**{contract.event_time: times - pd.to_timedelta(offsets)})


_DOCS_SITE = "local"
_RULE = "ml_lifecycle_rule"
_CONDITION = "condition_column"
_WINDOW_START, _WINDOW_END = "partition_start", "partition_end"


def _expectations(contract: TableContract) -> list[Any]:
    """The GX expectations of a contract, each tagged with our rule name and level.

    What changes per partition (the day's window, the reference sets) is a suite parameter, so
    one suite per contract serves every partition.
    """
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    def tag(expectation: Any, rule: str, level: str) -> Any:
        column = getattr(expectation, "column", None)
        expectation.meta = {_RULE: rule, "level": level, "column": column}
        return expectation

    out = [
        tag(
            gxe.ExpectTableColumnsToMatchSet(column_set=contract.column_names, exact_match=True),
            _COLUMN_SET,
            "table",
        ),
        tag(
            gxe.ExpectTableRowCountToBeBetween(min_value=contract.min_rows),
            "rows.at_least_min_rows",
            "table",
        ),
    ]
    for rule in contract.columns:
        c = rule.column
        if rule.kind == "number" or (
            rule.kind == "text" and not (rule.allowed_from or rule.allowed or rule.pattern)
        ):
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInTypeList(
                        column=c, type_list=_TYPE_LISTS[rule.kind]
                    ),
                    f"{c}.is_{rule.kind}",
                    "table",
                )
            )
        if rule.required:
            out.append(tag(gxe.ExpectColumnValuesToNotBeNull(column=c), f"{c}.not_null", "row"))
        if rule.min_value is not None or rule.max_value is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeBetween(
                        column=c, min_value=rule.min_value, max_value=rule.max_value
                    ),
                    f"{c}.in_range[{rule.min_value},{rule.max_value}]",
                    "row",
                )
            )
        if rule.allowed is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInSet(column=c, value_set=sorted(set(rule.allowed))),
                    f"{c}.in_contract_set",
                    "row",
                )
            )
        if rule.allowed_from is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInSet(
                        column=c, value_set={"$PARAMETER": _parameter(rule.allowed_from)}
                    ),
                    f"{c}.known_in_{rule.allowed_from}",
                    "row",
                )
            )
        for other in rule.required_when_present:
            required = tag(
                gxe.ExpectColumnValuesToNotBeNull(
                    column=c, row_condition=Column(other).is_not_null()
                ),
                f"{c}.required_when_{other}_present",
                "row",
            )
            required.meta[_CONDITION] = other
            out.append(required)
        if rule.pattern:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToMatchRegex(column=c, regex=_whole(rule.pattern)),
                    f"{c}.matches_pattern",
                    "row",
                )
            )
    # GX's compound rule takes two columns at least; a one-column key has a rule of its own.
    (only,) = contract.natural_key if len(contract.natural_key) == 1 else (None,)
    out.append(
        tag(
            gxe.ExpectColumnValuesToBeUnique(column=only)
            if only is not None
            else gxe.ExpectCompoundColumnsToBeUnique(column_list=list(contract.natural_key)),
            _UNIQUE_KEY,
            "row",
        )
    )
    # Aware bounds: a timezone-naive column cannot be compared with them and fails the rule.
    out.append(
        tag(
            gxe.ExpectColumnValuesToBeBetween(
                column=contract.event_time,
                min_value={"$PARAMETER": _WINDOW_START},
                max_value={"$PARAMETER": _WINDOW_END},
                strict_max=True,
            ),
            f"{contract.event_time}.utc_aware_within_partition_day",
            "row",
        )
    )
    return out


def _whole(pattern: str) -> str:
    """`pattern` matched against the whole value. GX searches for a match anywhere, and `$` also
    matches before a trailing newline; `\\A…\\Z` admit neither."""
    return rf"\A(?:{pattern})\Z"


def _parameter(reference: str) -> str:
    """GX suite parameters must be identifiers: `stores.code` → `stores__code`."""
    return reference.replace(".", "__")


def _rule_name(outcome: Any) -> str:
    return outcome.expectation_config.meta[_RULE]


def _rule_result(outcome: Any) -> RuleResult:
    meta = outcome.expectation_config.meta or {}
    rule, level, column = meta[_RULE], meta["level"], meta.get("column")
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


def _event_time_parts(
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


def _explained(
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
        replace(rule, observed=_column_set(frame, contract))
        if rule.rule == _COLUMN_SET and not rule.passed
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
                    f"{found}{_ON_ROWS.format(len(frame))}: every value is a number stored as"
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
            out.append(replace(rule, observed=f"{found}{_ON_ROWS.format(len(frame))}"))
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
        observed=_holding(found, int(bad.sum()), len(frame), holds),
        holds=holds,
        found=found,
    )


def _holding(found: str | None, count: int, rows: int, holds: str) -> str:
    """What a counted type failure observed."""
    return f"{found + ': ' if found else ''}{count} of {rows} rows hold {holds}"


def _column_set(frame: "pd.DataFrame", contract: TableContract) -> str:
    """How a table's columns differ from the contract's, by name."""
    declared, present = contract.column_names, [str(c) for c in frame.columns]
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


@functools.cache
def _gx_context(data_docs_dir: str) -> Any:
    """One ephemeral GX context per process: building one per partition would cost more than
    the validation itself."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # GX logs every metric batch at INFO and warns on usage-statistics setup; keep runs readable.
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    context = gx.get_context(mode="ephemeral")
    # The "Calculating Metrics" tqdm bar would otherwise land in every run's stderr log.
    context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    context.add_data_docs_site(
        site_name=_DOCS_SITE,
        site_config={
            "class_name": "SiteBuilder",
            "store_backend": {
                "class_name": "TupleFilesystemStoreBackend",
                "base_directory": str(Path(data_docs_dir).resolve()),
            },
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
        },
    )
    context.data_sources.add_pandas("frames")
    return context


@functools.cache
def _validation_definition(data_docs_dir: str, contract: TableContract) -> Any:
    """The suite and validation definition of a contract, registered once per process."""
    import great_expectations as gx

    context = _gx_context(data_docs_dir)
    # The expectations first: one that cannot be built leaves nothing half-registered.
    expectations = _expectations(contract)
    batch = (
        context.data_sources.get("frames")
        .add_dataframe_asset(contract.table)
        .add_batch_definition_whole_dataframe("partition")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=contract.table, expectations=expectations))
    return context.validation_definitions.add(
        gx.ValidationDefinition(name=contract.table, data=batch, suite=suite)
    )


@dataclass(frozen=True)
class _Screening:
    """A contract's suite cut into the three parts the pass/fail pass runs, each on the frame
    that decides its rules at the least cost.

    GX filters the whole batch for every column rule (the rows where the column has a value,
    or where a row condition holds), so a rule run on a 19-column frame copies 19 columns.
    - `per_value`: rules that judge each value alone (type, not-null, range, set, pattern, the
      event time's window) and the column set. A value breaks such a rule wherever it is, so
      they pass on a table exactly when they pass on its distinct values (`_distinct_values`).
    - `keyed`: the row count and the key's uniqueness, on the key's columns, every row.
    - `conditioned`: rules with a row condition, on the columns they name, every row.
    """

    per_value: Any
    keyed: Any
    conditioned: Any
    condition_columns: tuple[str, ...]


@functools.cache
def _screening(contract: TableContract) -> _Screening:
    import great_expectations as gx

    groups: dict[str, list[Any]] = {"per_value": [], "keyed": [], "conditioned": []}
    condition_columns: dict[str, None] = {}
    for expectation in _expectations(contract):
        rule = expectation.meta[_RULE]
        if rule in (_ROW_COUNT, _UNIQUE_KEY):
            groups["keyed"].append(expectation)
        elif _CONDITION in expectation.meta:
            groups["conditioned"].append(expectation)
            condition_columns.update(
                dict.fromkeys((expectation.column, expectation.meta[_CONDITION]))
            )
        else:
            groups["per_value"].append(expectation)
    return _Screening(
        **{
            name: gx.ExpectationSuite(name=f"{contract.table}_{name}", expectations=expectations)
            for name, expectations in groups.items()
        },
        condition_columns=tuple(condition_columns),
    )


def _screen(
    definition: Any,
    contract: TableContract,
    frame: "pd.DataFrame",
    parameters: dict[str, Any],
    per_value: "pd.DataFrame | None" = None,
) -> list[Any]:
    """Every rule's pass/fail (GX's BOOLEAN_ONLY results), each part of the suite (`_Screening`)
    run on its own frame: the per-value rules on the distinct values of `per_value` (`frame`
    unless given: several days' rows with their event times shifted into one window), the
    others on `frame`'s rows. `frame`'s column names are unique."""
    screening = _screening(contract)
    present = set(frame.columns)

    def narrow(columns: Sequence[str]) -> "pd.DataFrame":
        # A missing column stays missing: its rules fail as they would on the whole frame.
        return frame[[c for c in columns if c in present]]

    patterns = frozenset(rule.column for rule in contract.columns if rule.pattern)
    results = []
    for suite, data in (
        (
            screening.per_value,
            _distinct_values(frame if per_value is None else per_value, patterns),
        ),
        (screening.keyed, narrow(contract.natural_key)),
        (screening.conditioned, narrow(screening.condition_columns)),
    ):
        if suite.expectations:
            batch = definition.data.get_batch({"dataframe": data})
            validated = batch.validate(
                suite, result_format="BOOLEAN_ONLY", expectation_parameters=parameters
            )
            results += validated.results
    return results


def _distinct_values(frame: "pd.DataFrame", pattern_columns: frozenset[str]) -> "pd.DataFrame":
    """A frame with `frame`'s columns and dtypes in which each column holds exactly the distinct
    values of that column, repeated in turn up to the longest column's count: every rule that
    judges a value alone passes on it exactly when it passes on `frame`.

    Distinct by equality, except where equal values can be judged apart: in a column of mixed
    Python objects (1, 1.0 and True are equal but not of one type), and in a pattern's column
    unless it holds text alone (GX matches `str(value)`: 0.0 and -0.0 are equal, their text is
    not). There each distinct (type, text) pair is kept."""
    import numpy as np
    import pandas as pd

    if frame.empty:
        return frame
    distinct = {}
    for name in frame.columns:
        values = frame[name]
        judged_as_text = values.dtype == object or name in pattern_columns
        if not judged_as_text or pd.api.types.infer_dtype(values) in ("string", "empty"):
            distinct[name] = pd.unique(values)
        else:
            kinds = values.map(type, na_action="ignore").astype(str)
            first = ~pd.DataFrame({"kind": kinds, "text": values.astype(str)}).duplicated()
            distinct[name] = values.array[first.to_numpy()]
    longest = max(len(values) for values in distinct.values())
    return pd.DataFrame(
        {name: values.take(np.arange(longest) % len(values)) for name, values in distinct.items()}
    )


_ON_ROWS = " on {} rows"
"""How a failed type rule without a count names the rows: "column of type object (declared
number) on 915 rows"."""
_COLUMN_SET = "columns.match_contract"
_ROW_COUNT = "rows.at_least_min_rows"
_UNIQUE_KEY = "natural_key.unique"


class _KeyIndex:
    """A 64-bit hash of every row's natural key, and the chunk the row is in."""

    def __init__(self, natural_key: Sequence[str]) -> None:
        self.natural_key = list(natural_key)
        self.hashes: list[Any] = []
        self.chunks: list[Any] = []

    def add(self, chunk: "pd.DataFrame") -> None:
        import numpy as np
        from pandas.util import hash_pandas_object

        if not set(self.natural_key) <= set(chunk.columns):
            return  # the column rule refuses the table already
        keys = chunk[self.natural_key]
        hashes = hash_pandas_object(keys, index=False).to_numpy()
        # GX ignores rows whose key is missing altogether; so does the comparison across chunks.
        present = keys.notna().any(axis=1).to_numpy()
        self.hashes.append(np.where(present, hashes, np.uint64(0)))
        self.chunks.append(np.where(present, len(self.chunks), -1).astype(np.int32))

    def duplicated_across_chunks(self) -> Any:
        """Positions (in the whole table) of the rows whose key is also in another chunk."""
        import numpy as np

        if not self.hashes:
            return np.empty(0, dtype=np.int64)
        hashes, chunks = np.concatenate(self.hashes), np.concatenate(self.chunks)
        self.hashes, self.chunks = [], []
        order = np.argsort(hashes, kind="stable")
        hashes, chunks = hashes[order], chunks[order]
        starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]])
        lowest = np.minimum.reduceat(chunks, starts)
        highest = np.maximum.reduceat(chunks, starts)
        across = (lowest >= 0) & (lowest != highest)
        group = np.cumsum(np.r_[True, hashes[1:] != hashes[:-1]]) - 1
        return np.sort(order[across[group] & (chunks >= 0)])


def _combined(
    contract: TableContract,
    reports: list[ValidationReport],
    duplicated: Any,
    chunks: Callable[[], Iterator["pd.DataFrame"]],
) -> ValidationReport:
    """One report from the reports of a table's chunks, in order; `duplicated` are the
    positions of rows whose natural key is also in another chunk."""
    offsets = list(itertools.accumulate((r.row_count for r in reports), initial=0))
    total = offsets[-1]
    merged = []
    by_name = [{rule.rule: rule for rule in report.rules} for report in reports]
    for name in by_name[0]:
        results = [rules[name] for rules in by_name]
        if name == _ROW_COUNT:
            passed = total >= contract.min_rows
            merged.append(
                replace(
                    results[0],
                    passed=passed,
                    unexpected_count=0 if passed else 1,
                    observed=None if passed else str(total),
                )
            )
            continue
        failed = [
            (offset, report.row_count, result)
            for offset, report, result in zip(offsets, reports, results, strict=False)
            if not result.passed
        ]
        extra = duplicated if name == _UNIQUE_KEY else ()
        if not failed and not len(extra):
            merged.append(results[0])
            continue
        merged.append(_merged_rule(results[0], failed, extra, total, contract, chunks))
    return ValidationReport(
        table=contract.table,
        partition=reports[0].partition,
        row_count=total,
        max_rejected_share=contract.max_rejected_share,
        rules=tuple(merged),
    )


def _merged_rule(
    rule: RuleResult,
    failed: list[tuple[int, int, RuleResult]],
    extra: Any,
    total: int,
    contract: TableContract,
    chunks: Callable[[], Iterator["pd.DataFrame"]],
) -> RuleResult:
    """One rule's failures in several chunks (each with its chunk's offset and row count) and
    the rows `extra` also broke it at (positions in the table) as one result."""
    first = failed[0][2] if failed else rule
    if first.level == "table" and first.holds is None:
        # Not counted by row: the first failing chunk's verdict stands for the table ("column
        # of type object on 900 rows" restated on the table's rows).
        observed = first.observed
        if observed is not None:
            observed = observed.replace(_ON_ROWS.format(failed[0][1]), _ON_ROWS.format(total), 1)
        return replace(first, observed=observed)
    rows = sorted({*(o + p for o, _, r in failed for p in r.rows), *(int(p) for p in extra)})
    if len(extra):  # keys repeated across chunks: sampled again, in the table's row order
        sample = _key_sample(contract, chunks, rows[:SAMPLE_SIZE])
    else:
        sample = tuple(itertools.islice((v for _, _, r in failed for v in r.sample), SAMPLE_SIZE))
    count = len(rows) if first.level == "row" else sum(r.unexpected_count for _, _, r in failed)
    observed = first.observed
    if first.holds is not None:
        observed = _holding(first.found, count, total, first.holds)
    return replace(
        first,
        passed=False,
        unexpected_count=count,
        sample=sample,
        rows=tuple(rows),
        observed=observed,
    )


def _key_sample(
    contract: TableContract, chunks: Callable[[], Iterator["pd.DataFrame"]], positions: Any
) -> tuple[str, ...]:
    """The natural keys at `positions` (ascending) of the table, as GX samples them."""
    wanted, found, offset = list(int(p) for p in positions), [], 0
    key = list(contract.natural_key)
    for chunk in chunks():
        while wanted and wanted[0] < offset + len(chunk):
            row = chunk.iloc[wanted.pop(0) - offset]
            found.append(repr({c: _plain(row[c]) for c in key}))
        offset += len(chunk)
        if not wanted:
            break
    return tuple(found)


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python value GX samples hold."""
    return value.item() if hasattr(value, "item") and not isinstance(value, str) else value
