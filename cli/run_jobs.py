"""`make run`'s runs: one Dagster job executed in this process, as a run launched from the UI
would be recorded, and what it did to each day (`DayOutcome`) or asset (`AssetRun`)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from cli.stops import Stops
from pipelines.jobs import RANGE_END_TAG, RANGE_START_TAG

# Step-by-step DEBUG events stay in the instance (and the UI); the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_tags() -> dict[str, str]:
    """Tags of every run this command starts: what launched it (the UI's runs list shows it
    beside Dagster's "Manually launched"), and the machine it runs on, by which the next
    `make run` (or the daemon) tells that a run left unfinished here was killed."""
    from pipelines.run_health import HOST_TAG, this_host
    from pipelines.schedules import TRIGGER_TAG

    return {TRIGGER_TAG: "make_run", HOST_TAG: this_host()}


@dataclass
class DayOutcome:
    """What one partition's run did, for the summary."""

    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    """Row count of each materialized asset, by its key (as the UI writes it)."""
    materialized: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    """Why the day was refused: failed checks and steps."""
    quarantines: list[str] = field(default_factory=list)
    """Which rules quarantined rows of a published day."""
    stopped: bool = False
    """Its run was stopped before the day was done (neither published nor refused)."""

    def merged(self, later: "DayOutcome") -> "DayOutcome":
        """This day's outcome together with that of a later run of it (its features)."""
        return DayOutcome(
            self.partition,
            self.success and later.success,
            {**self.rows, **later.rows},
            self.materialized | later.materialized,
            self.problems + later.problems,
            self.quarantines + later.quarantines,
            self.stopped or later.stopped,
        )


def published_stretches(
    days: Sequence[str], outcomes: Mapping[str, "DayOutcome"]
) -> list[list[str]]:
    """The unbroken runs of consecutive `days` whose outcome so far is a success."""
    stretches: list[list[str]] = [[]]
    for day in days:
        if outcomes[day].success:
            stretches[-1].append(day)
        elif stretches[-1]:
            stretches.append([])
    return [stretch for stretch in stretches if stretch]


def execute(
    job: dg.JobDefinition, instance: dg.DagsterInstance, stops: Stops | None, **kwargs: Any
) -> dg.ExecuteInProcessResult:
    """One run of `job` in this process (`execute_in_process`'s `kwargs`); under `stops`, a
    stop ends it CANCELED and no run starts after one (`Stopped`)."""

    def run(run_id: str | None = None) -> dg.ExecuteInProcessResult:
        return job.execute_in_process(
            instance=instance, raise_on_error=False, run_id=run_id, **kwargs
        )

    return run() if stops is None else stops.run(job.name, run)


def run_days(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    partitions: Sequence[str],
    stops: Stops | None = None,
) -> dict[str, DayOutcome]:
    """One run of `job` over the consecutive `partitions`, as a batched backfill takes them:
    each day keeps its own materializations and check results, and a refused day refuses only
    itself."""
    result = execute(
        job,
        instance,
        stops,
        run_config=QUIET,
        tags={**run_tags(), RANGE_START_TAG: partitions[0], RANGE_END_TAG: partitions[-1]},
    )
    return day_outcomes(result, partitions)


def canceled(result: dg.ExecuteInProcessResult) -> bool:
    """Whether the run was stopped (it ended CANCELED)."""
    return any(event.event_type == dg.DagsterEventType.RUN_CANCELED for event in result.all_events)


def day_outcomes(
    result: dg.ExecuteInProcessResult, partitions: Sequence[str]
) -> dict[str, DayOutcome]:
    """What a run of `partitions` did to each of them. A day succeeded when none of its checks
    failed and every asset the job selects for it was materialized (a ranged step that refused a
    day fails as a whole, having published the others); in a stopped run, a day that is neither
    is stopped, not refused."""
    outcomes = {day: DayOutcome(partition=day, success=True) for day in partitions}
    single = partitions[0] if len(partitions) == 1 else None
    failed_steps = []
    for event in result.all_events:
        if event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            outcome = outcomes[materialization.partition or single or ""]
            outcome.materialized.add(materialization.asset_key.to_user_string())
            rows = materialization.metadata.get("dagster/row_count")
            if isinstance(rows, dg.IntMetadataValue) and rows.value is not None:
                outcome.rows[materialization.asset_key.to_user_string()] = rows.value
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            outcome = outcomes[evaluation.partition or single or ""]
            quarantined = evaluation.metadata.get("quarantined_rows")
            if not evaluation.passed:
                outcome.success = False
                outcome.problems.append(evaluation.description or evaluation.check_name)
            elif isinstance(quarantined, dg.IntMetadataValue) and quarantined.value:
                outcome.quarantines.append(evaluation.description or evaluation.check_name)
        elif event.is_step_failure:
            error = event.step_failure_data.error
            failed_steps.append(
                f"step {event.step_key} failed: {error.message.strip() if error else 'unknown'}"
            )
    selected = {key.to_user_string() for key in result.job_def.asset_layer.selected_asset_keys}
    stopped = canceled(result)
    for outcome in outcomes.values():
        if stopped:
            # Published before the stop, refused by its checks, or else interrupted.
            if outcome.success and not selected <= outcome.materialized:
                outcome.success, outcome.stopped = False, True
        elif single is not None:
            outcome.success = result.success
            outcome.problems += failed_steps
        elif outcome.success and not selected <= outcome.materialized:
            # No check refused it, yet it is not published: a step failed before reaching it.
            outcome.success = False
            outcome.problems += failed_steps or ["not materialized"]
    return outcomes


@dataclass
class AssetRun:
    """What a run of assets produced, for the summary."""

    success: bool
    window: str
    """The training window or the partition it ran on."""
    assets: dict[str, dict[str, object]] = field(default_factory=dict)
    """Metadata of each materialized asset, by its key (as the UI writes it)."""
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    """(check, passed, description) of every asset check that ran."""
    problem: str = ""
    stopped: str = ""
    """The step a stop interrupted (the run ended CANCELED); empty when not stopped."""
    ran: bool = True
    """False for a run that never started (an earlier step failed, or the command stopped)."""


def run_assets(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    window: str = "",
    ops: Mapping[str, object] | None = None,
    partition: str | None = None,
    stops: Stops | None = None,
) -> AssetRun:
    """One run of `job` (of `partition`, with the `ops` config), in this process."""
    result = execute(
        job,
        instance,
        stops,
        partition_key=partition,
        run_config={**QUIET, "ops": dict(ops or {})},
        tags=run_tags(),
    )
    outcome = AssetRun(result.success, window)
    stopped = canceled(result)
    for event in result.all_events:
        if event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            outcome.assets[materialization.asset_key.to_user_string()] = {
                key: getattr(v, "value", v) for key, v in materialization.metadata.items()
            }
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            outcome.checks.append(
                (evaluation.check_name, evaluation.passed, evaluation.description or "")
            )
        elif event.is_step_failure and event.step_failure_data.error:
            outcome.problem = event.step_failure_data.error.message.strip()
            if stopped:
                outcome.stopped = event.step_key or job.name
    if stopped and not outcome.stopped:
        outcome.stopped = "between its steps"
    return outcome
