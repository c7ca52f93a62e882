"""Each event table's day, from the drop to the published rows, as write-audit-publish in one
step: the drop as received (`raw_<table>`), audited by its GX contract (a blocking check on the
raw partition), then published without the rows broken by row rules (`validated_<table>`) beside
those rows and the rules they broke (`quarantined_<table>`). A refused day is not published; its
last published version is never touched.

A backfill runs a range of days in one run (`DailyPartitions.days_per_run`, Dagster's
`BackfillPolicy.multi_run`): the process, GX, the source and the lake are set up once for the
range, not once a day, and every day still gets its own materializations (its content hash as
the data version), check evaluation and quarantine, recorded as events of its own partition
(Dagster would record one data version for the whole range). The range's raw days are screened
by GX together (`screen`): one pass/fail validation of their rows whose verdict holds for each
day, so that a clean range, the usual one, pays GX's fixed cost once; the days of a range with a
broken rule are validated one at a time, as a single day is. A day refused by its source or its
contract is refused alone: the range's other days publish, and the step then fails naming each
refused day, its rule and count, so the backfill marks only those days failed.
"""

import datetime as dt
import hashlib
import warnings
from collections.abc import Generator, Iterator, Mapping, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, daily_partitions
from assets.ingestion import INGESTION, KINDS, Refused, drop_metadata, read_drop, source_key
from assets.pods import SMALL
from assets.tags import CODE_VERSION_TAG, DATA_VERSION_TAG, INPUT_VERSION_TAG
from declare import EventTable, UseCase
from declare.contracts import TableContract
from resources.contract_frames import StorageError, as_stored
from resources.expectations import GreatExpectations
from resources.lake import Chunks, LakeTable, ParquetLake, stored_hash
from resources.revisions import (
    Counter,
    HeldBack,
    Version,
    against_last_good,
    against_same_events,
    published_version,
)
from resources.validation_report import ValidationReport

if TYPE_CHECKING:
    import pandas as pd

# Partitioned checks are what make "a check result per partition" visible in the UI; the feature is
# in preview in Dagster 1.13, and the warning would otherwise print at every code-location load.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

VALIDATION = "validation"
REJECTED_BY = "rejected_by"
"""Column of a quarantined row that names the rule(s) that rejected it."""


def audit(
    partition_key: str,
    expectations: GreatExpectations,
    contract: TableContract,
    raw: LakeTable,
    partitions_def: dg.DailyPartitionsDefinition,
    references: "dict[str, pd.DataFrame] | None" = None,
    *,
    data_docs: bool = True,
) -> ValidationReport:
    """Validate one raw partition against its contract, a row group of the lake file at a
    time. `references` holds the dimension tables the contract's `allowed_from` rules name."""
    return expectations.validate_chunks(
        contract,
        raw.frames,
        partition=partition_key,
        window=_window(partitions_def, partition_key),
        timezone=partitions_def.timezone,
        references=_reference_sets(contract, references),
        data_docs=data_docs,
    )


SCREEN_TOGETHER_ROWS = 1_000_000
"""Most rows a range's days are screened with in one GX pass (`screen`); more days are screened
in several passes, fewer rows each, so that a range of large days is never held whole."""


def screen(
    days: Mapping[str, LakeTable],
    expectations: GreatExpectations,
    contract: TableContract,
    partitions_def: dg.DailyPartitionsDefinition,
    references: "dict[str, pd.DataFrame] | None" = None,
) -> dict[str, ValidationReport]:
    """The reports of the raw `days` that pass their contract whole, screened together a batch
    of consecutive days at a time (`GreatExpectations.screen_days`): the usual day of a
    backfill pays GX's fixed cost once a batch instead of once a day. A day missing from the
    result (one with a failed rule, one of a batch with one, a day stored in several row
    groups) is for `audit` to validate alone."""
    from resources.gx_screening import DayFrame

    batches: list[list[DayFrame]] = [[]]
    rows = 0
    for key, raw in days.items():
        if raw.row_groups != 1:
            continue
        frame = next(raw.frames())
        if rows + len(frame) > SCREEN_TOGETHER_ROWS and batches[-1]:
            batches.append([])
            rows = 0
        batches[-1].append(DayFrame(key, frame, _window(partitions_def, key)))
        rows += len(frame)
    sets = _reference_sets(contract, references)
    reports: dict[str, ValidationReport] = {}
    for batch in batches:
        reports |= expectations.screen_days(
            contract, batch, timezone=partitions_def.timezone, references=sets
        )
    return reports


def _window(
    partitions_def: dg.DailyPartitionsDefinition, partition_key: str
) -> tuple[dt.datetime, dt.datetime]:
    window = partitions_def.time_window_for_partition_key(partition_key)
    return window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)


def _reference_sets(
    contract: TableContract, references: "dict[str, pd.DataFrame] | None"
) -> dict[str, list[Any]]:
    """The values of each reference set a contract's `allowed_from` rules name."""
    sets = {}
    for reference in contract.references:
        table, column = reference.split(".", 1)
        sets[reference] = (references or {})[table][column].dropna().tolist()
    return sets


def check_metadata(report: ValidationReport) -> dict[str, Any]:
    """What a contract check's evaluation records: counts, and the broken rules as a table."""
    failed = report.failed_rules
    table = "\n".join(
        f"| {r.rule} | {r.level} | {r.observed if r.observed is not None else r.unexpected_count}"
        f" | {r.error or ', '.join(r.sample)} |"
        for r in failed
    )
    metadata: dict[str, Any] = {
        "partition": report.partition,
        "rows": report.row_count,
        "rules_checked": len(report.rules),
        "rules_failed": len(failed),
        "quarantined_rows": len(report.rejected_rows),
        "quarantined_share": report.rejected_share,
        "max_quarantined_share": report.max_rejected_share,
    }
    if failed:
        metadata["failed_rules"] = dg.MetadataValue.md(
            "| rule | level | unexpected / observed | sample |\n|---|---|---|---|\n" + table
        )
    if report.data_docs_url:
        metadata["data_docs"] = dg.MetadataValue.url(report.data_docs_url)
    return metadata


def split(raw: LakeTable, report: ValidationReport) -> tuple[Chunks, Chunks]:
    """(published rows, quarantined rows with the rules that rejected them), a row group of the
    raw partition at a time."""
    if not report.passed:
        rule = report.failed_rules[0].rule if report.failed_rules else "contract"
        raise Refused(report.partition, rule, f"not published: {report.summary()}")
    reasons = report.rejection_reasons()

    def parts(keep: bool) -> "Iterator[pd.DataFrame]":
        import numpy as np
        import pandas as pd

        positions = np.array(sorted(reasons), dtype=np.int64)
        offset = 0
        for chunk in raw.frames():
            start, end = np.searchsorted(positions, [offset, offset + len(chunk)])
            rejected = np.zeros(len(chunk), dtype=bool)
            rejected[positions[start:end] - offset] = True
            offset += len(chunk)
            if keep:
                yield chunk.loc[~rejected].reset_index(drop=True)
                continue
            why = pd.Series([reasons[p] for p in positions[start:end]], dtype="string")
            yield chunk.loc[rejected].reset_index(drop=True).assign(**{REJECTED_BY: why})

    return Chunks(lambda: parts(True)), Chunks(lambda: parts(False))


CODE_VERSION = "1"


class IngestConfig(dg.Config):
    """What a person decides for an event table's days."""

    accept_revisions: list[str] = Field(
        default_factory=list,
        description="Days (YYYY-MM-DD) whose new version is published although the table's"
        " declared revisions hold it back (rows lost against the last good version or a table"
        " of the same events, a column emptied): a person has checked that it is right.",
    )


def event_table_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """Each event table's days: raw, audited, published and quarantined."""
    return [_days(case, table) for table in case.event_tables]


def stage_name(case: UseCase, table: EventTable) -> str:
    """The name of the step that ingests, audits and publishes `table`'s days."""
    return f"{case.name}__ingest_{table.name}"


def _references(case: UseCase, contract: TableContract) -> dict[str, dg.AssetIn]:
    """The dimension tables a contract's reference sets come from, as inputs."""
    tables = sorted({reference.split(".", 1)[0] for reference in contract.references})
    return {table: dg.AssetIn(asset_key(case, table)) for table in tables}


def input_version(parent: dg.DataVersion) -> str:
    """What a published day records as the data version of the raw day it was made from: what
    Dagster records for an input of one partition (sha256 of its version), so that lineage can
    verify it against the raw day's own materialization."""
    return hashlib.sha256(parent.value.encode()).hexdigest()


@dataclass(frozen=True)
class _Stage:
    """The keys of one event table's assets and check."""

    case: UseCase
    table: EventTable
    raw: dg.AssetKey
    validated: dg.AssetKey
    quarantined: dg.AssetKey
    check: dg.AssetCheckKey
    partitions_def: dg.DailyPartitionsDefinition = field(repr=False)

    @classmethod
    def of(cls, case: UseCase, table: EventTable) -> "_Stage":
        raw = asset_key(case, f"raw_{table.name}")
        return cls(
            case,
            table,
            raw,
            asset_key(case, f"validated_{table.name}"),
            asset_key(case, f"quarantined_{table.name}"),
            dg.AssetCheckKey(raw, f"{table.name}_contract"),
            daily_partitions(case),
        )


class _Day:
    """The events of one day, as a step of one partition returns them (Dagster derives the
    materialization) or as a step of a range records them (an event per partition)."""

    def __init__(
        self,
        stage: _Stage,
        partition_key: str,
        ranged: bool,
        recorded: "Set[Any]" = frozenset(),
        accepted: bool = False,
    ):
        self.stage, self.partition_key, self.ranged = stage, partition_key, ranged
        self.recorded = recorded  # what an earlier try of the run recorded (asset, check keys)
        self.accepted = accepted  # a new version the revisions would hold back is published

    def materialized(
        self,
        key: dg.AssetKey,
        version: dg.DataVersion,
        metadata: Mapping[str, Any],
        parent: dg.DataVersion | None = None,
    ) -> dg.MaterializeResult | dg.AssetMaterialization:
        tags = (
            {}
            if parent is None
            else {INPUT_VERSION_TAG + self.stage.raw.to_user_string(): input_version(parent)}
        )
        if not self.ranged:
            return dg.MaterializeResult(
                asset_key=key, metadata=metadata, data_version=version, tags=tags or None
            )
        tags |= {DATA_VERSION_TAG: version.value, CODE_VERSION_TAG: CODE_VERSION}
        return dg.AssetMaterialization(
            asset_key=key, partition=self.partition_key, metadata=metadata, tags=tags
        )

    def checked(self, report: ValidationReport) -> dg.AssetCheckResult | dg.AssetCheckEvaluation:
        """The contract check's verdict: blocking, an error when the day may not be published."""
        verdict = {
            "asset_key": self.stage.check.asset_key,
            "check_name": self.stage.check.name,
            "passed": report.passed,
            "severity": dg.AssetCheckSeverity.ERROR,
            "description": report.summary(),
            "metadata": check_metadata(report),
        }
        if not self.ranged:
            return dg.AssetCheckResult(**verdict)
        return dg.AssetCheckEvaluation(**verdict, partition=self.partition_key, blocking=True)


def _days(case: UseCase, table: EventTable) -> dg.AssetsDefinition:
    stage = _Stage.of(case, table)
    name, contract = table.name, table.contract
    references = _references(case, contract)
    dimensions = [asset_key(case, table) for table in references]

    def spec(key: dg.AssetKey, group: str, kinds: set[str], description: str, *deps):
        return dg.AssetSpec(
            key,
            description=description,
            group_name=case.group(group),
            kinds=kinds,
            code_version=CODE_VERSION,
            deps=deps,
            skippable=True,
        ).with_io_manager_key("lake")

    @dg.multi_asset(
        name=stage_name(case, table),
        specs=[
            spec(stage.raw, INGESTION, KINDS, table.description),
            spec(
                stage.validated,
                VALIDATION,
                {"pandas", "great_expectations"},
                f"{table.description} Only a day that passed its suite, without the rows that"
                " broke row rules.",
                stage.raw,
                *dimensions,
            ),
            spec(
                stage.quarantined,
                VALIDATION,
                {"pandas"},
                f"Rows of a published {name} day that broke row rules ({REJECTED_BY}).",
                stage.raw,
                *dimensions,
            ),
        ],
        check_specs=[
            dg.AssetCheckSpec(
                stage.check.name,
                asset=stage.raw,
                blocking=True,
                partitions_def=stage.partitions_def,
                additional_deps=dimensions,
                description=(
                    f"The {name} GX suite: columns, types, nulls, ranges and sets, unique rows,"
                    " events inside the partition's day, a minimum row count."
                ),
            )
        ],
        ins=references,
        partitions_def=stage.partitions_def,
        backfill_policy=dg.BackfillPolicy.multi_run(case.partitions.days_per_run),
        can_subset=True,
        retry_policy=EXTERNAL_RETRY,  # the source may be a network share or an object store
        op_tags=SMALL,
        required_resource_keys={source_key(case), "lake", "expectations"},
    )
    def _step(context: dg.AssetExecutionContext, config: IngestConfig, **refs):
        expectations: GreatExpectations = context.resources.expectations
        accepted = set(config.accept_revisions)
        ranged = not context.has_partition_key
        keys = context.partition_keys
        # A retried step of a range carries on from what its earlier tries recorded.
        recorded = _recorded_in_run(context) if ranged and context.retry_number else {}
        wanted = _wanted(context, stage)
        refused: list[Refused] = []
        if not ranged:
            try:
                day = _Day(stage, keys[0], False, accepted=keys[0] in accepted)
                yield from _one_day(context, stage, day, expectations, refs)
            except Refused as exc:
                raise dg.Failure(
                    description=str(exc),
                    metadata={"partition": exc.partition_key, "rule": exc.rule},
                    allow_retries=False,
                ) from exc
            return
        # A range ingests every day first, then screens them together with GX (`screen`) and
        # validates alone only the days that screening did not pass.
        ingested: dict[str, tuple[_Day, LakeTable, dg.DataVersion]] = {}
        for key in keys:
            if wanted <= recorded.get(key, set()):
                continue
            day = _Day(stage, key, True, recorded.get(key, frozenset()), key in accepted)
            try:
                ingested[key] = (day, *(yield from _ingest(context, stage, day)))
            except Refused as exc:
                refused.append(exc)
        screened = {}
        if len(ingested) > 1 and _auditing(context, stage):
            raws = {key: raw for key, (_, raw, _) in ingested.items()}
            screened = screen(raws, expectations, stage.table.contract, stage.partitions_def, refs)
        for key, (day, raw, raw_version) in ingested.items():
            try:
                for event in _publish(
                    context, stage, day, expectations, refs, raw, raw_version, screened.get(key)
                ):
                    if _recorded_as(event) not in day.recorded:
                        yield event
            except Refused as exc:
                refused.append(exc)
        for exc in refused:
            context.log.error(str(exc))
        if refused:
            refused.sort(key=lambda exc: exc.partition_key)
            raise dg.Failure(
                description=f"{len(refused)} of {len(keys)} days refused; the others are"
                " published:\n" + "\n".join(str(exc) for exc in refused),
                metadata={
                    "refused_partitions": [exc.partition_key for exc in refused],
                    "rules": [exc.rule for exc in refused],
                },
                allow_retries=False,
            )

    return _step


def _recorded_in_run(context: dg.AssetExecutionContext) -> dict[str, set[Any]]:
    """What earlier tries of this run recorded, by day: asset keys materialized and check keys
    evaluated."""
    recorded: dict[str, set[Any]] = {}
    for kind in (
        dg.DagsterEventType.ASSET_MATERIALIZATION,
        dg.DagsterEventType.ASSET_CHECK_EVALUATION,
    ):
        for record in context.instance.get_records_for_run(context.run_id, of_type=kind).records:
            event = record.event_log_entry.dagster_event
            if event is None:
                continue
            if event.is_step_materialization:
                done = event.step_materialization_data.materialization
                partition, what = done.partition, done.asset_key
            else:
                evaluation = event.asset_check_evaluation_data
                partition, what = evaluation.partition, evaluation.asset_check_key
            if partition is not None:
                recorded.setdefault(partition, set()).add(what)
    return recorded


def _wanted(context: dg.AssetExecutionContext, stage: _Stage) -> set[Any]:
    """What the step records for each day: its selected assets, and its check if selected."""
    wanted: set[Any] = {stage.raw, stage.validated, stage.quarantined} & context.selected_asset_keys
    if stage.check in context.selected_asset_check_keys:
        wanted.add(stage.check)
    return wanted


def _recorded_as(event: Any) -> Any:
    """The asset or check key an event of `_publish` records a day under."""
    if isinstance(event, dg.AssetCheckEvaluation):
        return dg.AssetCheckKey(event.asset_key, event.check_name)
    return event.asset_key


def _auditing(context: dg.AssetExecutionContext, stage: _Stage) -> bool:
    """Whether the step's selection needs the day audited: its check, or its published rows."""
    return stage.check in context.selected_asset_check_keys or bool(
        {stage.validated, stage.quarantined} & context.selected_asset_keys
    )


def _one_day(
    context: dg.AssetExecutionContext,
    stage: _Stage,
    day: _Day,
    expectations: GreatExpectations,
    references: dict[str, "pd.DataFrame"],
) -> Iterator[Any]:
    """Ingest, audit and publish one day, as far as the step's selection asks; raises Refused
    (after recording the raw day and its check) for a day that is not published."""
    raw, raw_version = yield from _ingest(context, stage, day)
    yield from _publish(context, stage, day, expectations, references, raw, raw_version)


def _ingest(
    context: dg.AssetExecutionContext, stage: _Stage, day: _Day
) -> Generator[Any, None, tuple[LakeTable, dg.DataVersion]]:
    """The day's raw table, written from its drop and recorded if the step selects it, read
    from the lake otherwise; raises Refused for a drop the source refuses."""
    lake: ParquetLake = context.resources.lake
    key = day.partition_key
    if stage.raw not in context.selected_asset_keys or stage.raw in day.recorded:
        raw = lake.table(stage.raw, key)
        return raw, dg.DataVersion(stored_hash(raw.path) or "")
    drop = read_drop(getattr(context.resources, source_key(stage.case)), stage.table.contract, key)
    stored = lake.write(stage.raw, key, Chunks(drop.frames))
    yield day.materialized(
        stage.raw, stored.data_version, {**drop_metadata(drop), **stored.metadata}
    )
    return stored.table, stored.data_version


def _publish(
    context: dg.AssetExecutionContext,
    stage: _Stage,
    day: _Day,
    expectations: GreatExpectations,
    references: dict[str, "pd.DataFrame"],
    raw: LakeTable,
    raw_version: dg.DataVersion,
    screened: ValidationReport | None = None,
) -> Iterator[Any]:
    """Audit the raw day (unless `screened` already holds its report), record its check, and
    publish its rows, as far as the step's selection asks; raises Refused for a day that is
    not published."""
    selected = context.selected_asset_keys
    lake: ParquetLake = context.resources.lake
    contract, key = stage.table.contract, day.partition_key
    checking = stage.check in context.selected_asset_check_keys
    publishing = bool({stage.validated, stage.quarantined} & selected)
    if not (checking or publishing):
        return
    report = screened
    if report is None:
        # A range renders Data Docs for its refused days only: a page is the place to read a
        # refusal from, and one for every passing day of a year would double the backfill's time.
        report = audit(
            key,
            expectations,
            contract,
            raw,
            stage.partitions_def,
            references,
            data_docs=checking and not day.ranged,
        )
        if checking and day.ranged and not report.passed:
            report = audit(key, expectations, contract, raw, stage.partitions_def, references)
    if checking:
        yield day.checked(report)
    published, rejected = split(raw, report)  # refuses a day that failed its contract
    if not publishing:
        return
    counts = dict.fromkeys(stage.table.counted_flags, 0)
    revision = _Revision.of(lake, stage, day) if stage.validated in selected else None

    def publish() -> "Iterator[pd.DataFrame]":
        for chunk in published.frames():
            try:
                chunk = as_stored(contract, chunk)
            except StorageError as exc:
                raise Refused(key, exc.rule, f"partition {key}: not published: {exc}") from exc
            if stage.table.publish is not None:
                chunk = stage.table.publish(chunk)
            for flag in stage.table.counted_flags:
                counts[flag] += int(chunk[flag].sum())
            if revision is not None:
                revision.counter.add(chunk)
            yield chunk
        # Raised before the lake commits the file: the last good version stays published.
        if revision is not None:
            revision.check()

    # The counts are taken while the lake writes the rows, and reported once it has.
    for asset, rows in (
        (stage.validated, Chunks(publish, metadata=lambda: counts)),
        (stage.quarantined, rejected),
    ):
        if asset in selected:
            stored = lake.write(asset, key, rows)
            yield day.materialized(asset, stored.data_version, stored.metadata, parent=raw_version)


@dataclass
class _Revision:
    """A new version of a published day, counted as it is written, and what it is held to: the
    last good version of the day, and the published days of the tables declared to describe
    the same events (`resources.revisions`)."""

    stage: _Stage
    day: _Day
    last: Version | None
    same_events: dict[str, int]
    counter: Counter = field(default_factory=Counter)

    @classmethod
    def of(cls, lake: ParquetLake, stage: _Stage, day: _Day) -> "_Revision":
        key, case = day.partition_key, stage.case
        last = _published(lake, stage.validated, key)
        others = {}
        for other in case.same_events(stage.table):
            table = _published(lake, asset_key(case, f"validated_{other}"), key)
            if table is not None:
                others[other] = table.rows
        return cls(stage, day, last and published_version(last), others)

    def check(self) -> None:
        """Raises Refused for a new version its table's declared revisions hold back, unless
        a person accepted the day."""
        if self.day.accepted:
            return
        table, new = self.stage.table, self.counter.version
        revisions = table.revisions
        held: list[HeldBack | None] = [
            against_same_events(table.name, new.rows, other, rows, revisions)
            for other, rows in sorted(self.same_events.items())
        ]
        if self.last is not None:
            held.insert(0, against_last_good(table.name, new, self.last, revisions))
        reason = next((h for h in held if h is not None), None)
        if reason is None:
            return
        key = self.day.partition_key
        op = stage_name(self.stage.case, table)
        raise Refused(
            key,
            reason.rule,
            f"partition {key}: held back, rule {reason.rule} failed: {reason.message}. The"
            " published version stays; if the new one is right, publish it with the run config"
            f" ops: {{{op}: {{config: {{accept_revisions: ['{key}']}}}}}}",
        )


def _published(lake: ParquetLake, asset: dg.AssetKey, partition_key: str) -> LakeTable | None:
    """The published file of one day, None before its first publication."""
    try:
        return lake.table(asset, partition_key)
    except FileNotFoundError:
        return None
