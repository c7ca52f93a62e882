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

from assets.contracts import FLIGHTS, WEATHER
from assets.ingestion import airlines, raw_flights, raw_weather
from assets.pods import SMALL
from pipelines.partitions import daily_partitions
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
    airlines_frame: "pd.DataFrame | None" = None,
    *,
    data_docs: bool = True,
) -> ValidationReport:
    """Validate one raw partition against its contract, a row group of the lake file at a
    time."""
    partition_key = context.partition_key
    window = daily_partitions.time_window_for_partition_key(partition_key)
    references = {}
    if airlines_frame is not None:
        references["airlines.carrier"] = airlines_frame["carrier"].dropna().tolist()
    return expectations.validate_chunks(
        contract,
        raw.frames,
        partition=partition_key,
        window=(window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)),
        timezone=daily_partitions.timezone,
        references=references,
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


def flag_cancellations(flights: "pd.DataFrame") -> "pd.DataFrame":
    """Cancelled flights (no departure) and diverted ones (departed, no arrival delay; the
    contract's presence rules ensure no air time either) are real events, kept and flagged
    rather than treated as bad data."""
    cancelled = flights["dep_time"].isna()
    return flights.assign(cancelled=cancelled, diverted=~cancelled & flights["arr_delay"].isna())


@dg.asset_check(
    asset=raw_flights,
    blocking=True,
    additional_ins={"airlines": dg.AssetIn(airlines.key)},
    partitions_def=daily_partitions,
)
def flights_contract(
    context: dg.AssetCheckExecutionContext,
    raw_flights: LakeTable,
    airlines,
    expectations: GreatExpectations,
) -> dg.AssetCheckResult:
    """The flights GX suite: columns, types, nulls, ranges, known carriers and airports, unique
    flights, departures inside the partition's day, a minimum row count."""
    return check_result(audit(context, expectations, FLIGHTS, raw_flights, airlines))


@dg.asset_check(asset=raw_weather, blocking=True, partitions_def=daily_partitions)
def weather_contract(
    context: dg.AssetCheckExecutionContext,
    raw_weather: LakeTable,
    expectations: GreatExpectations,
) -> dg.AssetCheckResult:
    """The weather GX suite: columns, types, physical ranges, one observation per airport and
    hour, observations inside the partition's day, a minimum row count."""
    return check_result(audit(context, expectations, WEATHER, raw_weather))


def _publication(table: str, validated: str) -> dict[str, Any]:
    """The settings shared by the publishing multi-assets: one published and one quarantined
    table per raw table, daily, written to the lake together."""
    return {
        "op_tags": SMALL,
        "outs": {
            f"validated_{table}": dg.AssetOut(
                io_manager_key="lake",
                kinds={"pandas", "great_expectations"},
                code_version="1",
                description=validated,
            ),
            f"quarantined_{table}": dg.AssetOut(
                io_manager_key="lake",
                kinds={"pandas"},
                code_version="1",
                description=f"Rows of a published {table} day that broke row rules (rejected_by).",
            ),
        },
        "partitions_def": daily_partitions,
        "group_name": VALIDATION,
        "can_subset": False,
    }


@dg.multi_asset(
    ins={"raw_flights": dg.AssetIn(raw_flights.key), "airlines": dg.AssetIn(airlines.key)},
    **_publication(
        "flights", "Flights of a day that passed the flights suite; cancellations flagged."
    ),
)
def publish_flights(
    context: dg.AssetExecutionContext,
    raw_flights: LakeTable,
    airlines,
    expectations: GreatExpectations,
):
    report = audit(context, expectations, FLIGHTS, raw_flights, airlines, data_docs=False)
    published, quarantined = split(raw_flights, report)
    counts = {"cancelled": 0, "diverted": 0}

    def flagged() -> "Iterator[pd.DataFrame]":
        for chunk in published.frames():
            chunk = flag_cancellations(chunk)
            counts["cancelled"] += int(chunk["cancelled"].sum())
            counts["diverted"] += int(chunk["diverted"].sum())
            yield chunk

    # The counts are taken while the lake writes the rows, and reported once it has.
    yield dg.Output(Chunks(flagged, metadata=lambda: counts), "validated_flights")
    yield dg.Output(quarantined, "quarantined_flights")


@dg.multi_asset(
    ins={"raw_weather": dg.AssetIn(raw_weather.key)},
    **_publication("weather", "Hourly weather of a day that passed the weather suite."),
)
def publish_weather(
    context: dg.AssetExecutionContext, raw_weather: LakeTable, expectations: GreatExpectations
):
    report = audit(context, expectations, WEATHER, raw_weather, data_docs=False)
    published, quarantined = split(raw_weather, report)
    yield dg.Output(published, "validated_weather")
    yield dg.Output(quarantined, "quarantined_weather")
