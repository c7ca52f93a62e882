"""Great Expectations 1.x, called directly: a partition's frame validated against its table's
contract.

`GreatExpectations` runs a `TableContract` (declare/contracts.py) as its GX suite (built in
resources/gx_suites.py) on one partition's frame and returns a typed `ValidationReport`
(resources/validation_report.py). Rules come in two levels:

- table rules (the column set, the row count, a column's type): if one fails, the whole partition
  is refused;
- row rules (non-null, ranges, allowed values, patterns, values required where another column
  has one, natural-key uniqueness, the event time inside the partition's day, columns that
  restate a part of the event time agreeing with it): failing rows are
  quarantined with the rule that rejected them, as long as their share stays at or below the
  contract's `max_rejected_share`; above it the whole partition is refused.

Every rule first gets a pass/fail verdict (on large frames from the screening pass of
resources/gx_screening.py); only the rules that failed run again with full detail. A validation
can be rendered into GX Data Docs (resources/data_docs.py).

A table too large to hold whole is validated a chunk at a time (`validate_chunks`): each chunk
is one GX validation, and their results are combined here into the report one validation of the
whole table would give: counts, samples and row positions add up, the row count is judged on
the total, and natural keys must be unique across chunks too.

A partition past one machine is validated where it lives, as a Spark DataFrame, through GX's
Spark data source (`validate_spark_partition`, resources/gx_spark.py): the same rules and the
same report as a pandas frame of the same rows gets.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from declare.contracts import TableContract
from resources.data_docs import gx_context, publish
from resources.gx_screening import DayFrame, joint_days, screen, shifted
from resources.gx_spark import spark_report
from resources.gx_suites import (
    ROW_COUNT,
    RULE_KEY,
    UNIQUE_KEY,
    suite_parameters,
    validation_definition,
)
from resources.validation_report import (
    ON_ROWS,
    SAMPLE_SIZE,
    RuleResult,
    ValidationReport,
    event_time_parts,
    explained,
    holding,
    rule_name,
    rule_result,
)

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame as SparkFrame

SCREEN_IN_PARTS_ROWS = 20_000
"""From this many rows a partition's pass/fail pass runs in parts on narrow frames
(`resources.gx_screening.screen`): at 336,776 rows it takes half the time of one pass over the
whole frame; on a day of a thousand rows the three validations' fixed cost outweighs what they
save."""


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
        give each rule its verdict (`screen`).
        """
        import great_expectations as gx

        parameters = suite_parameters(contract, window, references)
        frame = frame.reset_index(drop=True)

        context = gx_context(self.data_docs_dir)
        definition = validation_definition(self.data_docs_dir, contract)
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
            url = publish(context, self.data_docs_dir)
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
            screened = screen(definition, contract, frame, parameters)
        # The suite's order, whichever pass and part a result came from (GX orders its own).
        outcomes: dict[str, Any] = dict.fromkeys(
            e.meta[RULE_KEY] for e in definition.suite.expectations
        )
        outcomes.update({rule_name(o): o for o in screened})
        failed = [
            e for e in definition.suite.expectations if not outcomes[e.meta[RULE_KEY]].success
        ]
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
            outcomes.update({rule_name(o): o for o in detail.results})
        return ValidationReport(
            table=contract.table,
            partition=partition,
            row_count=len(frame),
            max_rejected_share=contract.max_rejected_share,
            rules=explained(
                tuple(rule_result(o) for o in outcomes.values())
                + event_time_parts(contract, frame, timezone),
                frame,
                contract,
            ),
            data_docs_url=url,
        )

    def validate_spark_partition(
        self,
        contract: TableContract,
        frame: "SparkFrame",
        *,
        partition: str,
        window: tuple[dt.datetime, dt.datetime],
        timezone: str,
        references: Mapping[str, Sequence[Any]] | None = None,
        data_docs: bool = True,
    ) -> ValidationReport:
        """`validate_partition` for a partition held as a Spark DataFrame: the contract's suite
        run through GX's Spark data source, the rules our own code takes run in Spark, and the
        report a pandas frame of the same rows gets. Its rows are positions in the DataFrame's
        row order (`resources.gx_spark.with_positions`); resources/gx_spark.py says what else
        differs."""
        return spark_report(
            contract,
            frame,
            data_docs_dir=self.data_docs_dir,
            data_docs=self.build_data_docs and data_docs,
            partition=partition,
            window=window,
            timezone=timezone,
            references=references,
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

        Days screened together (`joint_days`) share their columns, dtypes and window length and
        hold at least the contract's rows; each rule then passes on every day exactly when it
        passes on their union, the event time shifted by its day's start (`shifted`). Where
        any rule fails, or the days cannot be screened together, the days are missing from the
        result: the caller validates them one at a time, which names each day's failures."""
        import pandas as pd

        joint = joint_days(contract, days)
        if len(joint) < 2:
            return {}
        parameters = suite_parameters(contract, joint[0].window, references)
        union = pd.concat([day.frame for day in joint], ignore_index=True)
        definition = validation_definition(self.data_docs_dir, contract)
        screened = screen(
            definition, contract, union, parameters, per_value=shifted(contract, joint, union)
        )
        if not all(outcome.success for outcome in screened):
            return {}
        passed = tuple(
            RuleResult(e.meta[RULE_KEY], e.meta["level"], True, 0, column=e.meta.get("column"))
            for e in definition.suite.expectations
        )
        return {
            day.partition: ValidationReport(
                table=contract.table,
                partition=day.partition,
                row_count=len(day.frame),
                max_rejected_share=contract.max_rejected_share,
                rules=explained(
                    passed + event_time_parts(contract, day.frame, timezone),
                    day.frame,
                    contract,
                ),
            )
            for day in joint
        }


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
        if name == ROW_COUNT:
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
        extra = duplicated if name == UNIQUE_KEY else ()
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
            observed = observed.replace(ON_ROWS.format(failed[0][1]), ON_ROWS.format(total), 1)
        return replace(first, observed=observed)
    rows = sorted({*(o + p for o, _, r in failed for p in r.rows), *(int(p) for p in extra)})
    if len(extra):  # keys repeated across chunks: sampled again, in the table's row order
        sample = _key_sample(contract, chunks, rows[:SAMPLE_SIZE])
    else:
        sample = tuple(itertools.islice((v for _, _, r in failed for v in r.sample), SAMPLE_SIZE))
    count = len(rows) if first.level == "row" else sum(r.unexpected_count for _, _, r in failed)
    observed = first.observed
    if first.holds is not None:
        observed = holding(first.found, count, total, first.holds)
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
