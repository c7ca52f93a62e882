"""A partition too large for pandas, validated where it lives: a contract's GX suite run through
GX's Spark data source on a Spark DataFrame, giving the report the pandas path gives the same
rows (`GreatExpectations.validate_spark_partition` in resources/expectations.py calls
`spark_report`).

The same rules, read back the same way, in the same order:

- the suite is the contract's, built for Spark (resources/gx_suites.py): a number column is any
  of Spark's numeric types, a text column a string, and a pattern must match the whole value as
  Java's regular expressions read it (Spark's `rlike`), trailing newline included;
- two passes, as on pandas: every rule pass/fail, then the rules that failed with full detail;
- the rules our own code takes on pandas are taken here in Spark: columns that restate a part of
  the event time (`event_time_parts`), and the restatement of failures (`explained`: the column
  set by name; text in a number column, timestamps that are not UTC-aware, counted).

A row is named by its position (0, 1, ...) in the DataFrame's row order: its partitions in
order and each partition's rows in order (`with_positions`), which for a frame made from a pandas
frame or read from one Parquet file is the file's order, the positions the pandas path gives.
The failed rules are run on the frame with that position as a column, and the positions GX
returns are the report's rows; the samples are the values at the first of them, so they come in
row order whatever order Spark found them in (a key's duplicates are found after a shuffle).

What differs: a failed type rule names Spark's type (`column of type string (declared number)`
where pandas says `object`), as what Spark holds; GX judges a Spark column's type by its schema,
so a table-level type failure lists no rows (pandas lists the rows GX checked value by value;
either way no row is quarantined: the table is refused); text is read as a number, and as a
timestamp, by Spark's casts; timestamps are microseconds; Spark holds a missing value as null,
sampled as NaN in a number column (as pandas holds it) and None in a text column (where a pandas
frame read from a CSV holds NaN). The frame is persisted while it is validated (GX runs a Spark
job per rule), unless the caller had cached it already. Not tried here: a Spark Connect session's
DataFrames.

pyspark and GX are imported inside functions only.
"""

import datetime as dt
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from declare.contracts import TableContract
from resources.data_docs import gx_context, publish
from resources.gx_suites import COLUMN_SET, RULE_KEY, suite_parameters, validation_definition
from resources.timestamps import UTC_OFFSET
from resources.validation_report import (
    ON_ROWS,
    SAMPLE_SIZE,
    RuleResult,
    ValidationReport,
    column_set_difference,
    holding,
    rule_name,
    rule_result,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

_NUMBERS = frozenset({"byte", "short", "integer", "long", "float", "double", "decimal"})
"""Spark's numeric type names (`DataType.typeName()`)."""
POSITION = "__ml_lifecycle_position"
"""The column that carries each row's position while the failed rules are run in detail."""


def spark_report(
    contract: TableContract,
    frame: "DataFrame",
    *,
    data_docs_dir: str,
    data_docs: bool,
    partition: str,
    window: tuple[dt.datetime, dt.datetime],
    timezone: str,
    references: Mapping[str, Sequence[Any]] | None,
) -> ValidationReport:
    """The `ValidationReport` of one partition's Spark DataFrame against `contract`: what
    `GreatExpectations.validate_partition` reports on the same rows as a pandas frame (the
    module's docstring says what differs). `data_docs` renders the validation into the Data Docs
    site in `data_docs_dir`."""
    import great_expectations as gx

    parameters = suite_parameters(contract, window, references)
    definition = validation_definition(data_docs_dir, contract, "spark")
    persisted = not frame.is_cached
    if persisted:
        frame = frame.persist()
    try:
        url = None
        if data_docs:
            # Only a ValidationDefinition run lands in the results store Data Docs render from.
            context = gx_context(data_docs_dir)
            screened = definition.run(
                batch_parameters={"dataframe": frame},
                expectation_parameters=parameters,
                result_format="BOOLEAN_ONLY",
                run_id=gx.RunIdentifier(run_name=f"{contract.table}-{partition}-spark"),
            ).results
            url = publish(context, data_docs_dir)
        else:
            screened = _validate(definition, frame, definition.suite, "BOOLEAN_ONLY", parameters)
        outcomes: dict[str, Any] = dict.fromkeys(
            e.meta[RULE_KEY] for e in definition.suite.expectations
        )
        outcomes.update({rule_name(o): o for o in screened})
        positioned = functools.cache(lambda: with_positions(frame))
        # The column set is judged by name alone: a position column would only add to it.
        failed = [
            e
            for e in definition.suite.expectations
            if not outcomes[e.meta[RULE_KEY]].success and e.meta[RULE_KEY] != COLUMN_SET
        ]
        if failed:
            detail = _detail(definition, positioned(), contract, failed, parameters)
            outcomes.update({rule_name(o): o for o in detail})
        row_count = frame.count()
        rules = tuple(rule_result(o) for o in outcomes.values()) + event_time_parts(
            contract, frame, timezone, positioned
        )
        return ValidationReport(
            table=contract.table,
            partition=partition,
            row_count=row_count,
            max_rejected_share=contract.max_rejected_share,
            rules=explained(rules, frame, contract, row_count, positioned),
            data_docs_url=url,
        )
    finally:
        if persisted:
            frame.unpersist()


def with_positions(frame: "DataFrame", column: str = POSITION) -> "DataFrame":
    """`frame` with each row's position (0, 1, ...) in its row order as `column`: the rows of
    its first partition, then its second's, and so on. One job counts each partition's rows;
    the positions are as stable as the frame's partitions (a persisted frame's are)."""
    from pyspark.sql import functions as F

    partition = F.spark_partition_id()
    counts = dict(frame.groupBy(partition.alias("p")).count().collect())
    starts, total = [], 0
    for index in sorted(counts):
        starts += [F.lit(index), F.lit(total)]
        total += counts[index]
    if not starts:
        return frame.withColumn(column, F.lit(None).cast("long"))
    # monotonically_increasing_id holds the partition in its upper 31 bits, the row in the rest.
    within = F.monotonically_increasing_id() - partition.cast("long") * (1 << 33)
    return frame.withColumn(column, F.create_map(*starts)[partition] + within)


def _validate(
    definition: Any, frame: "DataFrame", suite: Any, result_format: Any, parameters: dict
) -> list[Any]:
    batch = definition.data.get_batch({"dataframe": frame})
    return batch.validate(
        suite, result_format=result_format, expectation_parameters=parameters
    ).results


def _detail(
    definition: Any,
    positioned: "DataFrame",
    contract: TableContract,
    failed: list[Any],
    parameters: dict,
) -> list[Any]:
    """The failed rules' outcomes with full detail, their rows as positions in row order and
    their samples the values at the first of them (the shape the pandas path's outcomes have)."""
    import copy

    import great_expectations as gx

    suite = gx.ExpectationSuite(
        name=f"{contract.table}_spark_failures", expectations=[copy.copy(e) for e in failed]
    )
    result_format = {
        "result_format": "COMPLETE",
        "partial_unexpected_count": SAMPLE_SIZE,
        "unexpected_index_column_names": [POSITION],
        "return_unexpected_index_query": False,
    }
    kinds = {f.name: f.dataType.typeName() for f in positioned.schema.fields}
    outcomes = _validate(definition, positioned, suite, result_format, parameters)
    for outcome in outcomes:
        found = (outcome.result or {}).get("unexpected_index_list")
        if found is None:
            continue
        found = sorted(found, key=lambda row: row[POSITION])
        columns = [c for c in found[0] if c != POSITION] if found else []
        outcome.result["unexpected_index_list"] = [row[POSITION] for row in found]
        outcome.result["partial_unexpected_list"] = [
            _value(row, columns, kinds) for row in found[:SAMPLE_SIZE]
        ]
    return outcomes


def _value(row: dict[str, Any], columns: list[str], kinds: dict[str, str]) -> Any:
    """A failing row's value as the pandas path samples it: the column's value, or for a key
    of several columns a dict of them; a timestamp as a UTC pandas Timestamp, and a missing
    number as NaN (pandas holds no other missing number)."""

    def plain(column: str) -> Any:
        value = row[column]
        if value is None:
            return float("nan") if kinds[column] in _NUMBERS else None
        return _utc(value) if kinds[column] == "timestamp" else value

    if len(columns) == 1:
        return plain(columns[0])
    return {column: plain(column) for column in columns}


def _utc(value: dt.datetime) -> Any:
    """A timestamp pyspark collected (naive, in this process's local time) as a UTC Timestamp."""
    import pandas as pd

    return pd.Timestamp(value.astimezone(dt.UTC))


def event_time_parts(
    contract: TableContract,
    frame: "DataFrame",
    timezone: str,
    positioned: Callable[[], "DataFrame"],
) -> tuple[RuleResult, ...]:
    """`resources.validation_report.event_time_parts` on a Spark DataFrame: each column declared
    to restate a part of the event time equals that part of the event time in `timezone`. One
    job counts every part's failures; only the parts that fail are read row by row."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import NumericType, TimestampType

    rules = [rule for rule in contract.columns if rule.event_time_part is not None]
    if not rules:
        return ()
    types = {f.name: f.dataType for f in frame.schema.fields}
    time = contract.event_time
    aware = isinstance(types.get(time), TimestampType)
    # The event time's wall clock in `timezone`, as a timestamp the session's zone reads back.
    session_zone = frame.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"
    local = F.to_utc_timestamp(F.from_utc_timestamp(F.col(time), timezone), session_zone)
    parts: dict[str, Callable[[Column], Column]] = {
        "year": F.year,
        "month": F.month,
        "day": F.dayofmonth,
        "hour": F.hour,
    }
    conditions: dict[str, Column] = {}
    out: dict[str, RuleResult] = {}
    for rule in rules:
        column, part = rule.column, rule.event_time_part
        assert part is not None
        name = f"{column}.equals_{time}_local_{part}"
        if not aware or not isinstance(types.get(column), NumericType):
            error = f"not evaluated: needs a number {column} and a UTC-aware {time}"
            out[name] = RuleResult(name, "table", False, 0, error=error, column=column)
            continue
        value = F.col(column)
        conditions[name] = value.isNotNull() & local.isNotNull() & (value != parts[part](local))
    if conditions:
        counts = frame.agg(
            *(F.sum(c.cast("long")).alias(str(i)) for i, c in enumerate(conditions.values()))
        ).first()
        assert counts is not None
        for (name, condition), count in zip(conditions.items(), counts, strict=True):
            column = name.split(".equals_", 1)[0]
            if not count:
                out[name] = RuleResult(name, "row", True, 0, column=column)
                continue
            bad = (
                positioned()
                .filter(condition)
                .select(POSITION, column, F.unix_micros(F.col(time)).alias("micros"))
                .orderBy(POSITION)
                .collect()
            )
            sample = tuple(
                f"{row[column]!r} ({time} {_from_micros(row['micros']).isoformat()})"
                for row in bad[:SAMPLE_SIZE]
            )
            rows = tuple(int(row[POSITION]) for row in bad)
            out[name] = RuleResult(name, "row", False, len(rows), sample, rows, column=column)
    return tuple(out[f"{r.column}.equals_{time}_local_{r.event_time_part}"] for r in rules)


def _from_micros(micros: int) -> Any:
    import pandas as pd

    return pd.Timestamp(micros, unit="us", tz="UTC")


def explained(
    rules: tuple[RuleResult, ...],
    frame: "DataFrame",
    contract: TableContract,
    row_count: int,
    positioned: Callable[[], "DataFrame"],
) -> tuple[RuleResult, ...]:
    """`resources.validation_report.explained` on a Spark DataFrame: the column set named by
    difference; text in a number column and timestamp values that are not UTC-aware counted (by
    Spark's casts); other rules on a mistyped column not evaluated; a failed type rule given the
    column's Spark type and the kind declared. An empty frame is reported by its row count and
    columns alone."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import TimestampNTZType, TimestampType

    rules = tuple(
        replace(rule, observed=column_set_difference(frame.columns, contract))
        if rule.rule == COLUMN_SET and not rule.passed
        else rule
        for rule in rules
    )
    if row_count == 0:
        return tuple(rule for rule in rules if rule.column is None)
    kinds = {rule.column: rule.kind for rule in contract.columns}
    types = {f.name: f.dataType for f in frame.schema.fields}
    timestamps = set(contract.timestamp_columns)
    mistyped = {r.column for r in rules if not r.passed and r.rule.endswith(".is_number")}
    out = []
    for rule in rules:
        column = rule.column
        if rule.passed or column is None or column not in types:
            out.append(rule)
            continue
        kind = types[column]
        found = f"column of type {kind.simpleString()} (declared {kinds[column]})"
        values = F.col(column)
        if column in timestamps and not isinstance(kind, TimestampType):
            if isinstance(kind, TimestampNTZType):
                bad, what = values.isNotNull(), "timezone-naive timestamps (they must be UTC-aware)"
            else:
                text = values.cast("string")
                aware = text.rlike(UTC_OFFSET) & text.try_cast("timestamp").isNotNull()
                bad = values.isNotNull() & ~aware
                what = "text that is not a UTC-aware ISO-8601 timestamp"
            out.append(_counted(rule, frame, positioned, bad, (what, found, row_count)))
        elif column in mistyped and rule.rule.endswith(".is_number"):
            bad = values.isNotNull() & values.try_cast("double").isNull()
            what = ("text that is not a number", found, row_count)
            counted = _counted(rule, frame, positioned, bad, what)
            if counted.unexpected_count:
                out.append(counted)
            else:  # every value reads as a number: it is the column's type that is wrong
                observed = (
                    f"{found}{ON_ROWS.format(row_count)}: every value is a number stored as"
                    f" {kind.simpleString()}; store the column as a number"
                )
                out.append(replace(rule, observed=observed))
        elif column in mistyped:
            out.append(replace(rule, level="table", error="not evaluated: the column is mistyped"))
        elif (
            rule.level == "table"
            and rule.error is None
            and (rule.observed is None or rule.rule == f"{column}.is_{kinds[column]}")
        ):  # GX observes a type rule's type alone
            out.append(replace(rule, observed=f"{found}{ON_ROWS.format(row_count)}"))
        else:
            out.append(rule)
    return tuple(out)


def _counted(
    rule: RuleResult,
    frame: "DataFrame",
    positioned: Callable[[], "DataFrame"],
    bad: "Column",
    what: tuple[str, str, int],
) -> RuleResult:
    """A failed type rule restated as the rows at fault: those `bad` marks, which hold
    `what[0]` (`what` is that, the type found and the row count). One job counts them; where
    there are any, a second reads the first few in row order as text."""
    from pyspark.sql import functions as F

    holds, found, row_count = what
    column = rule.column
    assert column is not None
    count = frame.filter(bad).count()
    sample = ()
    if count:
        first = positioned().filter(bad).orderBy(POSITION).limit(SAMPLE_SIZE)
        sample = tuple(repr(row[0]) for row in first.select(F.col(column).cast("string")).collect())
    return replace(
        rule,
        level="table",
        error=None,
        unexpected_count=count,
        sample=sample,
        observed=holding(found, count, row_count, holds),
        holds=holds,
        found=found,
    )
