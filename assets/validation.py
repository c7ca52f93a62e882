"""Validation as write-audit-publish: raw partitions are audited by blocking GX checks, and only a
partition that passes is published; rows broken by row rules are quarantined with their reason.

Dagster blocks downstream steps only within one run, so publishing validates again and refuses
a failing partition itself (a clean day costs GX about 0.1 s, so the second look is cheap).
The previously published version of a refused partition is never touched.
"""

import datetime as dt
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg

from assets import with_inputs
from assets.pods import SMALL
from assets.usecase import EventTable, UseCase
from resources.expectations import GreatExpectations, TableContract, ValidationReport
from resources.lake import Chunks, LakeTable

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
    context: dg.AssetCheckExecutionContext | dg.AssetExecutionContext,
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
    partition_key = context.partition_key
    window = partitions_def.time_window_for_partition_key(partition_key)
    sets = {}
    for reference in contract.references:
        table, column = reference.split(".", 1)
        sets[reference] = (references or {})[table][column].dropna().tolist()
    return expectations.validate_chunks(
        contract,
        raw.frames,
        partition=partition_key,
        window=(window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)),
        timezone=partitions_def.timezone,
        references=sets,
        data_docs=data_docs,
    )


def check_result(report: ValidationReport) -> dg.AssetCheckResult:
    """A blocking check's result: fails (ERROR) unless the partition may be published."""
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
    return dg.AssetCheckResult(
        passed=report.passed,
        severity=dg.AssetCheckSeverity.ERROR,
        description=report.summary(),
        metadata=metadata,
    )


def split(raw: LakeTable, report: ValidationReport) -> tuple[Chunks, Chunks]:
    """(published rows, quarantined rows with the rules that rejected them), a row group of the
    raw partition at a time."""
    if not report.passed:
        raise dg.Failure(
            description=f"not published: {report.summary()}",
            metadata={"partition": report.partition, "rules_failed": len(report.failed_rules)},
            allow_retries=False,
        )
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


def validation_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """Each event table's published and quarantined partitions."""
    return [_publication(case, table) for table in case.event_tables]


def validation_checks(case: UseCase) -> list[dg.AssetChecksDefinition]:
    """Each event table's contract, a blocking check on its raw partitions."""
    return [_contract_check(case, table) for table in case.event_tables]


def _references(case: UseCase, contract: TableContract) -> dict[str, dg.AssetIn]:
    """The dimension tables a contract's reference sets come from, as inputs."""
    tables = sorted({reference.split(".", 1)[0] for reference in contract.references})
    return {table: dg.AssetIn(case.key(table)) for table in tables}


def _contract_check(case: UseCase, table: EventTable) -> dg.AssetChecksDefinition:
    contract = table.contract
    partitions_def = case.partitions.definition()
    raw_name, references = f"raw_{table.name}", _references(case, contract)

    def _check(
        context: dg.AssetCheckExecutionContext, expectations: GreatExpectations, **inputs
    ) -> dg.AssetCheckResult:
        raw: LakeTable = inputs.pop(raw_name)
        return check_result(audit(context, expectations, contract, raw, partitions_def, inputs))

    return dg.asset_check(
        name=f"{table.name}_contract",
        asset=case.key(raw_name),
        blocking=True,
        additional_ins=references,
        partitions_def=partitions_def,
        description=(
            f"The {table.name} GX suite: columns, types, nulls, ranges and sets, unique rows,"
            " events inside the partition's day, a minimum row count."
        ),
    )(with_inputs(_check, {raw_name: LakeTable} | dict.fromkeys(references, Any)))


def _publication(case: UseCase, table: EventTable) -> dg.AssetsDefinition:
    """One published and one quarantined table per raw table, daily, written to the lake
    together."""
    name, contract = table.name, table.contract
    partitions_def = case.partitions.definition()
    validated, quarantined = f"validated_{name}", f"quarantined_{name}"

    @dg.multi_asset(
        name=f"publish_{name}",
        ins={
            "raw": dg.AssetIn(case.key(f"raw_{name}"), dagster_type=LakeTable),
            **_references(case, contract),
        },
        outs={
            validated: dg.AssetOut(
                key=case.key(validated),
                io_manager_key="lake",
                kinds={"pandas", "great_expectations"},
                code_version="1",
                description=f"{table.description} Only a day that passed its suite, without"
                " the rows that broke row rules.",
            ),
            quarantined: dg.AssetOut(
                key=case.key(quarantined),
                io_manager_key="lake",
                kinds={"pandas"},
                code_version="1",
                description=f"Rows of a published {name} day that broke row rules (rejected_by).",
            ),
        },
        partitions_def=partitions_def,
        group_name=case.group(VALIDATION),
        can_subset=False,
        op_tags=SMALL,
    )
    def _publish(
        context: dg.AssetExecutionContext, expectations: GreatExpectations, raw: LakeTable, **refs
    ):
        report = audit(context, expectations, contract, raw, partitions_def, refs, data_docs=False)
        published, rejected = split(raw, report)
        counts = dict.fromkeys(table.counted_flags, 0)

        def publishing() -> "Iterator[pd.DataFrame]":
            for chunk in published.frames():
                if table.publish is not None:
                    chunk = table.publish(chunk)
                for flag in table.counted_flags:
                    counts[flag] += int(chunk[flag].sum())
                yield chunk

        # The counts are taken while the lake writes the rows, and reported once it has.
        yield dg.Output(Chunks(publishing, metadata=lambda: counts), validated)
        yield dg.Output(rejected, quarantined)

    return _publish
