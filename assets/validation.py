"""Each event table's day, from the drop to the published rows, as write-audit-publish in one
step: the drop as received (`raw_<table>`), audited by its GX contract (a blocking check on the
raw partition), then published without the rows broken by row rules (`validated_<table>`) beside
those rows and the rules they broke (`quarantined_<table>`). A refused day is not published; its
last published version is never touched. The work is `resources.publishing.EventDays`; this
module turns what it writes and finds into Dagster's events.

A backfill runs a range of days in one run (the deployment's `Settings.days_per_run`, Dagster's
`BackfillPolicy.multi_run`): the process, GX, the source and the lake are set up once for the
range, not once a day, and every day still gets its own materializations (its content hash as
the data version), check evaluation and quarantine, recorded as events of its own partition
(Dagster would record one data version for the whole range). The range's raw days are screened
by GX together (`ContractAudit.screen`): one pass/fail validation of their rows whose verdict
holds for each day, so that a clean range, the usual one, pays GX's fixed cost once; the days of
a range with a broken rule are validated one at a time, as a single day is. A day refused by its
source or its contract is refused alone: the range's other days publish, and the step then fails
naming each refused day, its rule and count, so the backfill marks only those days failed.
"""

import contextlib
import datetime as dt
import functools
import hashlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, dagster_metadata, daily_partitions
from assets.ingestion import INGESTION, KINDS, source_key
from assets.pods import SMALL
from assets.tags import CODE_VERSION_TAG, DATA_VERSION_TAG, INPUT_VERSION_TAG
from declare import EventTable, UseCase
from declare.contracts import TableContract
from resources.lake import LakeTable, ParquetLake, Stored
from resources.publishing import (
    REJECTED_BY,
    Audited,
    ContractAudit,
    DayRefused,
    EventDays,
    Selection,
    Written,
)
from resources.validation_report import ValidationReport

# Partitioned checks are what make "a check result per partition" visible in the UI; the feature is
# in preview in Dagster 1.13, and the warning would otherwise print at every code-location load.
warnings.filterwarnings(
    "ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning
)

VALIDATION = "validation"
CODE_VERSION = "1"


class IngestConfig(dg.Config):
    """What a person decides for an event table's days."""

    accept_revisions: list[str] = Field(
        default_factory=list,
        description="Days (YYYY-MM-DD) whose new version is published although the table's"
        " declared revisions hold it back (rows lost against the last good version or a table"
        " of the same events, a column emptied): a person has checked that it is right.",
    )


def event_table_assets(case: UseCase, days_per_run: int) -> list[dg.AssetsDefinition]:
    """Each event table's days: raw, audited, published and quarantined, `days_per_run` days a
    run in a backfill."""
    return [_days(case, table, days_per_run) for table in case.event_tables]


def stage_name(case: UseCase, table: EventTable) -> str:
    """The name of the step that ingests, audits and publishes `table`'s days."""
    return f"{case.name}__ingest_{table.name}"


def _references(case: UseCase, contract: TableContract) -> dict[str, dg.AssetIn]:
    """The dimension tables a contract's reference sets come from, as inputs."""
    tables = sorted({reference.split(".", 1)[0] for reference in contract.references})
    return {table: dg.AssetIn(asset_key(case, table)) for table in tables}


def input_version(parent: str) -> str:
    """What a published day records as the data version of the raw day it was made from: what
    Dagster records for an input of one partition (sha256 of its version), so that lineage can
    verify it against the raw day's own materialization."""
    return hashlib.sha256(parent.encode()).hexdigest()


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


def _specs(stage: _Stage, dimensions: list[dg.AssetKey]) -> list[dg.AssetSpec]:
    """The step's assets: the raw days, and the published and quarantined rows made of them."""
    case, table = stage.case, stage.table

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

    return [
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
            f"Rows of a published {table.name} day that broke row rules ({REJECTED_BY}).",
            stage.raw,
            *dimensions,
        ),
    ]


def _check_spec(stage: _Stage, dimensions: list[dg.AssetKey]) -> dg.AssetCheckSpec:
    """The raw day's contract check, blocking, a result per day."""
    return dg.AssetCheckSpec(
        stage.check.name,
        asset=stage.raw,
        blocking=True,
        partitions_def=stage.partitions_def,
        additional_deps=dimensions,
        description=(
            f"The {stage.table.name} GX suite: columns, types, nulls, ranges and sets, unique"
            " rows, events inside the partition's day, a minimum row count."
        ),
    )


def _days(case: UseCase, table: EventTable, days_per_run: int) -> dg.AssetsDefinition:
    stage = _Stage.of(case, table)
    references = _references(case, table.contract)
    dimensions = [asset_key(case, dimension) for dimension in references]

    @dg.multi_asset(
        name=stage_name(case, table),
        specs=_specs(stage, dimensions),
        check_specs=[_check_spec(stage, dimensions)],
        ins=references,
        partitions_def=stage.partitions_def,
        backfill_policy=dg.BackfillPolicy.multi_run(days_per_run),
        can_subset=True,
        retry_policy=EXTERNAL_RETRY,  # the source may be a network share or an object store
        op_tags=SMALL,
        required_resource_keys={source_key(case), "lake", "expectations"},
    )
    def _step(context: dg.AssetExecutionContext, config: IngestConfig, **refs):
        days = _event_days(context, stage, config, refs)
        if context.has_partition_key:
            with _refused_day():
                for record in days.one(context.partition_key):
                    yield _event(stage, record, ranged=False)
            return
        # A retried step of a range carries on from what its earlier tries recorded.
        recorded = _recorded_in_run(context) if context.retry_number else {}
        keys = _days_left(context, stage, recorded)
        raw_recorded = {key for key in keys if stage.raw in recorded.get(key, ())}
        refused: list[DayRefused] = []
        for record in days.many(keys, raw_recorded):
            if isinstance(record, DayRefused):
                refused.append(record)
            elif _recorded_as(stage, record) not in recorded.get(record.partition_key, ()):
                yield _event(stage, record, ranged=True)
        for exc in refused:
            context.log.error(str(exc))
        if refused:
            raise _range_refused(refused, len(context.partition_keys))

    return _step


@dataclass(frozen=True)
class _CaseLake:
    """The lake, with the use case's assets named by name (`resources.publishing.TableLake`)."""

    lake: ParquetLake
    case: UseCase

    def write(self, asset: str, partition_key: str, rows: Any) -> Stored:
        return self.lake.write(asset_key(self.case, asset), partition_key, rows)

    def table(self, asset: str, partition_key: str) -> LakeTable:
        return self.lake.table(asset_key(self.case, asset), partition_key)


def _event_days(
    context: dg.AssetExecutionContext, stage: _Stage, config: IngestConfig, references: dict
) -> EventDays:
    """The step's work on its table's days, on the step's resources and selection."""
    case, table, days = stage.case, stage.table, stage.partitions_def
    selected = context.selected_asset_keys
    audit = ContractAudit(
        context.resources.expectations,
        table.contract,
        days.timezone,
        functools.partial(_window, days),
        references,
    )
    selection = Selection(
        raw=stage.raw in selected,
        check=stage.check in context.selected_asset_check_keys,
        validated=stage.validated in selected,
        quarantined=stage.quarantined in selected,
    )
    source = getattr(context.resources, source_key(case))
    lake = _CaseLake(context.resources.lake, case)
    name, accepted = stage_name(case, table), frozenset(config.accept_revisions)
    return EventDays(table, case.same_events(table), name, lake, source, audit, selection, accepted)


def _window(
    partitions_def: dg.DailyPartitionsDefinition, partition_key: str
) -> tuple[dt.datetime, dt.datetime]:
    window = partitions_def.time_window_for_partition_key(partition_key)
    return window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)


@contextlib.contextmanager
def _refused_day() -> Iterator[None]:
    """A refused day as the step's failure, never retried, naming its partition and rule."""
    try:
        yield
    except DayRefused as exc:
        raise dg.Failure(
            description=str(exc),
            metadata={"partition": exc.partition_key, "rule": exc.rule},
            allow_retries=False,
        ) from exc


def _range_refused(refused: list[DayRefused], days: int) -> dg.Failure:
    """The failure of a range whose other days are published: every refused day, its rule."""
    refused = sorted(refused, key=lambda exc: exc.partition_key)
    return dg.Failure(
        description=f"{len(refused)} of {days} days refused; the others are"
        " published:\n" + "\n".join(str(exc) for exc in refused),
        metadata={
            "refused_partitions": [exc.partition_key for exc in refused],
            "rules": [exc.rule for exc in refused],
        },
        allow_retries=False,
    )


def _event(
    stage: _Stage, record: Written | Audited, *, ranged: bool
) -> dg.MaterializeResult | dg.AssetMaterialization | dg.AssetCheckResult | dg.AssetCheckEvaluation:
    """What the step records of a day: a step of one partition returns its results (Dagster
    derives the materialization), a step of a range records an event per partition."""
    if isinstance(record, Audited):
        return _checked(stage, record, ranged)
    key, version = asset_key(stage.case, record.asset), record.stored.data_version
    metadata = {**dagster_metadata(record.metadata), **record.stored.metadata}
    tags = {}
    if record.parent is not None:
        tags[INPUT_VERSION_TAG + stage.raw.to_user_string()] = input_version(record.parent)
    if not ranged:
        return dg.MaterializeResult(
            asset_key=key, metadata=metadata, data_version=version, tags=tags or None
        )
    tags |= {DATA_VERSION_TAG: version.value, CODE_VERSION_TAG: CODE_VERSION}
    return dg.AssetMaterialization(
        asset_key=key, partition=record.partition_key, metadata=metadata, tags=tags
    )


def _checked(
    stage: _Stage, audited: Audited, ranged: bool
) -> dg.AssetCheckResult | dg.AssetCheckEvaluation:
    """The contract check's verdict: blocking, an error when the day may not be published."""
    report = audited.report
    verdict = {
        "asset_key": stage.check.asset_key,
        "check_name": stage.check.name,
        "passed": report.passed,
        "severity": dg.AssetCheckSeverity.ERROR,
        "description": report.summary(),
        "metadata": check_metadata(report),
    }
    if not ranged:
        return dg.AssetCheckResult(**verdict)
    return dg.AssetCheckEvaluation(**verdict, partition=audited.partition_key, blocking=True)


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


def _days_left(
    context: dg.AssetExecutionContext, stage: _Stage, recorded: dict[str, set[Any]]
) -> list[str]:
    """The step's days not yet recorded whole (`recorded`: by earlier tries of the run), whole
    being what the step records for each day: its selected assets, and its check if selected."""
    wanted: set[Any] = {stage.raw, stage.validated, stage.quarantined} & context.selected_asset_keys
    if stage.check in context.selected_asset_check_keys:
        wanted.add(stage.check)
    return [key for key in context.partition_keys if not wanted <= recorded.get(key, set())]


def _recorded_as(stage: _Stage, record: Written | Audited) -> Any:
    """The asset or check key a record of a day is recorded under."""
    if isinstance(record, Audited):
        return stage.check
    return asset_key(stage.case, record.asset)
