"""`make run`: run the lifecycle on the bundled data with the embedded defaults, then say where
the results are.

Each day is one Dagster run of `ingest_and_validate`, recorded in the local instance exactly as a
run launched from the UI would be, so `make dev` afterwards shows every run, materialization and
check result. Runs execute in this process: one process keeps GX and the bundled data loaded
instead of paying their start-up once per step.
"""

import argparse
import datetime as dt
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

DEFAULT_START = "2013-01-15"
DEFAULT_END = "2013-02-14"
# Step-by-step DEBUG events stay in the instance (and the UI); the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass
class DayOutcome:
    """What one partition's run did, for the summary."""

    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    """Why the day was refused: failed checks and steps."""
    quarantines: list[str] = field(default_factory=list)
    """Which rules quarantined rows of a published day."""


def ensure_dagster_home(home: Path, repo_root: Path) -> Path:
    """DAGSTER_HOME (default `<home>/dagster_home`) with the project's dagster.yaml in it."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(repo_root / "dagster.yaml", dagster_home / "dagster.yaml")
    return dagster_home


def run_day(job: dg.JobDefinition, instance: dg.DagsterInstance, partition: str) -> DayOutcome:
    result = job.execute_in_process(
        partition_key=partition, instance=instance, raise_on_error=False, run_config=QUIET
    )
    outcome = DayOutcome(partition=partition, success=result.success)
    for event in result.all_events:
        if event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            rows = materialization.metadata.get("dagster/row_count")
            if isinstance(rows, dg.IntMetadataValue) and rows.value is not None:
                outcome.rows[materialization.asset_key.to_user_string()] = rows.value
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            quarantined = evaluation.metadata.get("quarantined_rows")
            if not evaluation.passed:
                outcome.problems.append(evaluation.description or evaluation.check_name)
            elif isinstance(quarantined, dg.IntMetadataValue) and quarantined.value:
                outcome.quarantines.append(evaluation.description or evaluation.check_name)
        elif event.is_step_failure:
            error = event.step_failure_data.error
            outcome.problems.append(
                f"step {event.step_key} failed: {error.message.strip() if error else 'unknown'}"
            )
    return outcome


def print_summary(outcomes: list[DayOutcome], home: Path, seconds: float) -> None:
    published = [o for o in outcomes if o.success]

    def total(asset: str) -> int:
        return sum(o.rows.get(asset, 0) for o in outcomes)

    print()
    print(
        f"Ingested and validated {len(outcomes)} day(s) in {seconds:.1f} s:"
        f" {len(published)} published, {len(outcomes) - len(published)} refused."
    )
    print(
        f"  flights: {total('raw_flights')} received, {total('validated_flights')} published,"
        f" {total('quarantined_flights')} quarantined"
    )
    print(
        f"  weather: {total('raw_weather')} received, {total('validated_weather')} published,"
        f" {total('quarantined_weather')} quarantined"
    )
    for outcome in outcomes:
        for line in outcome.quarantines + outcome.problems:
            print("  " + line.replace("\n", "\n  "))
    print()
    print(f"Results (all under {home}):")
    print(f"  lake (Parquet, one file per asset partition): {home / 'lake'}")
    print(f"  GX Data Docs:                                 {home / 'gx' / 'data_docs'}")
    print(f"  Dagster runs and events (SQLite):             {os.environ['DAGSTER_HOME']}")
    print("Open the UI with `make dev`, then http://127.0.0.1:3000 (Assets, Runs, Checks).")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the lifecycle on the bundled data.")
    parser.add_argument("--start", default=DEFAULT_START, help="first day (YYYY-MM-DD)")
    parser.add_argument("--end", default=DEFAULT_END, help="last day, inclusive (YYYY-MM-DD)")
    args = parser.parse_args(argv)

    from pipelines.definitions import REPO_ROOT, defs, local_home
    from pipelines.partitions import daily_partitions

    home = local_home()
    ensure_dagster_home(home, REPO_ROOT)
    start, end = dt.date.fromisoformat(args.start), dt.date.fromisoformat(args.end)
    partitions = [
        key
        for key in daily_partitions.get_partition_keys()
        if start <= dt.date.fromisoformat(key) <= end
    ]
    if not partitions:
        parser.error(f"no partitions between {start} and {end}")

    began = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        dimensions = defs.resolve_job_def("load_dimensions").execute_in_process(
            instance=instance, raise_on_error=False, run_config=QUIET
        )
        if not dimensions.success:
            print("Loading the dimension tables failed; see `make dev` → Runs.", file=sys.stderr)
            return 1
        daily = defs.resolve_job_def("ingest_and_validate")
        outcomes = []
        for partition in partitions:
            outcome = run_day(daily, instance, partition)
            outcomes.append(outcome)
            status = "published" if outcome.success else "REFUSED"
            print(f"{partition}: {status}", flush=True)
    print_summary(outcomes, home, time.perf_counter() - began)
    return 0


if __name__ == "__main__":
    sys.exit(main())
