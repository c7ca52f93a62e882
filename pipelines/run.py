"""`make run`: run the lifecycle on the bundled data with the embedded defaults, then say where
the results are.

First the dimension tables and the Feast registry; then each day is one Dagster run of
`daily_partition` (ingest, validate, feature tables, online store); then a training set over the
days that have a full feature history; then `trained_model`, two torchrun workers launched
through Dagster Pipes. Every run is recorded in the local instance exactly as a
run launched from the UI would be, so `make dev` afterwards shows every run, materialization and
check result. Runs execute in this process: one process keeps GX, Feast and the bundled data
loaded instead of paying their start-up once per step.
"""

import argparse
import datetime as dt
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

DEFAULT_START = "2013-01-29"
DEFAULT_END = "2013-02-28"
HISTORY_DAYS = 28
"""Days processed before the training window, so its trailing-delay features have their history
(fewer at the start of the data)."""
SPLIT_SHARES = (0.70, 0.15)
"""Train and validation shares of the training set's days; the test part gets the rest."""
# Step-by-step DEBUG events stay in the instance (and the UI); the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


@dataclass
class DayOutcome:
    """What one partition's run did, for the summary."""

    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    materialized: set[str] = field(default_factory=set)
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
            outcome.materialized.add(materialization.asset_key.to_user_string())
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


@dataclass
class AssetRun:
    """What a run of one unpartitioned asset produced, for the summary."""

    success: bool
    window: str
    metadata: dict[str, object] = field(default_factory=dict)
    problem: str = ""


def training_config(start: dt.date, last: dt.date) -> dict[str, str]:
    """The training set over [start, last], split 70/15/15 by day (at least a day each)."""
    end = last + dt.timedelta(days=1)
    days = (end - start).days
    validation = min(max(int(days * SPLIT_SHARES[0]), 1), days - 2)
    test = min(max(int(days * sum(SPLIT_SHARES)), validation + 1), days - 1)
    return {
        "start": start.isoformat(),
        "validation_start": (start + dt.timedelta(days=validation)).isoformat(),
        "test_start": (start + dt.timedelta(days=test)).isoformat(),
        "end": end.isoformat(),
    }


def run_asset(
    job: dg.JobDefinition, instance: dg.DagsterInstance, ops: dict, window: str = ""
) -> AssetRun:
    run_config = {**QUIET, "ops": ops}
    result = job.execute_in_process(instance=instance, raise_on_error=False, run_config=run_config)
    outcome = AssetRun(result.success, window)
    for event in result.all_events:
        if event.is_step_materialization:
            metadata = event.step_materialization_data.materialization.metadata
            outcome.metadata = {key: getattr(v, "value", v) for key, v in metadata.items()}
        elif event.is_step_failure and event.step_failure_data.error:
            outcome.problem = event.step_failure_data.error.message.strip()
    return outcome


def print_summary(
    outcomes: list[DayOutcome], training: AssetRun, model: AssetRun, home: Path, seconds: float
) -> None:
    published = [o for o in outcomes if o.success]

    def total(asset: str) -> int:
        return sum(o.rows.get(asset, 0) for o in outcomes)

    print()
    print(
        f"Ran {len(outcomes)} day(s), a training set and training in {seconds:.1f} s:"
        f" {len(published)} day(s) published, {len(outcomes) - len(published)} refused."
    )
    print(
        f"  flights: {total('raw_flights')} received, {total('validated_flights')} published,"
        f" {total('quarantined_flights')} quarantined"
    )
    print(
        f"  weather: {total('raw_weather')} received, {total('validated_weather')} published,"
        f" {total('quarantined_weather')} quarantined"
    )
    tables = ("flight_features", "weather_features", "aircraft_features", "carrier_history")
    online = sum("online_features" in o.materialized for o in outcomes)
    print("  features: " + ", ".join(f"{t} {total(t)} rows" for t in tables))
    print(f"  online store: {online} day(s) materialized")
    for outcome in outcomes:
        for line in outcome.quarantines + outcome.problems:
            print("  " + line.replace("\n", "\n  "))
    if training.success:
        meta = training.metadata
        splits = ", ".join(
            f"{part} {meta.get(f'rows_{part}')} rows ({_percent(meta.get(f'positive_rate_{part}'))}"
            " delayed)"
            for part in ("train", "validation", "test")
        )
        print(f"  training set {training.window}: {splits}")
        print(
            f"    {meta.get('features')} features from {meta.get('feature_service')};"
            f" {meta.get('unlabelled_rows_left_out')} cancelled/diverted flights left out;"
            f" fingerprint {str(meta.get('dataset_fingerprint'))[:12]}"
        )
    else:
        print(f"  training set {training.window}: FAILED: {training.problem}")
    if model.success:
        meta = model.metadata
        weights = Path(str(meta.get("weights")))
        print(
            f"  model: {meta.get('world_size')} process(es), {meta.get('precision')},"
            f" best epoch {meta.get('best_epoch')} of {meta.get('epochs')},"
            f" {_number(meta.get('samples_per_s'), '.0f')} samples/s"
        )
        print(
            "    validation: "
            + ", ".join(
                f"{name} {_number(meta.get(f'validation_{name}'), '.4f')}"
                for name in ("roc_auc", "average_precision", "log_loss", "brier", "accuracy")
            )
        )
        print(f"    layout:   {meta.get('layout')}")
        print(f"    weights:  {weights}")
        print(f"    manifest: {weights.parent / 'manifest.json'}")
        print(f"    MLflow:   {meta.get('mlflow_run')} (after `make mlflow`)")
    elif training.success:
        print(f"  model: FAILED: {model.problem}")
    print()
    print(f"Results (all under {home}):")
    print(f"  lake (Parquet, one file per asset partition): {home / 'lake'}")
    print(f"  training set:                                 {home / 'lake' / 'training_set'}")
    print(f"  models (weights, manifest, checkpoints):      {home / 'models'}")
    print(f"  MLflow runs (SQLite) and artifacts:           {home / 'mlflow'}")
    print(f"  Feast registry and online store (SQLite):     {home / 'feast'}")
    print(f"  GX Data Docs:                                 {home / 'gx' / 'data_docs'}")
    print(f"  Dagster runs and events (SQLite):             {os.environ['DAGSTER_HOME']}")
    print("Open the UI with `make dev`, then http://127.0.0.1:3000 (Assets, Runs, Checks).")


def _number(value: object, spec: str) -> str:
    return "n/a" if value is None else format(float(str(value)), spec)


def _percent(rate: object) -> str:
    return f"{rate:.1%}" if isinstance(rate, float) else "n/a"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the lifecycle on the bundled data.")
    parser.add_argument(
        "--start",
        default=DEFAULT_START,
        help=f"first day of the training set (YYYY-MM-DD); days from {HISTORY_DAYS} days earlier"
        " are processed too, for the trailing-delay history",
    )
    parser.add_argument("--end", default=DEFAULT_END, help="last day, inclusive (YYYY-MM-DD)")
    args = parser.parse_args(argv)

    # Feast installs a DeprecationWarning filter of its own when imported, ahead of any set
    # before; importing it first lets the filter below hold. The warning is pydantic 2's about
    # dagster-shared's v1-style attribute access: not ours to change.
    import feast  # noqa: F401

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    from pipelines.definitions import REPO_ROOT, defs, local_home
    from pipelines.partitions import daily_partitions

    home = local_home()
    ensure_dagster_home(home, REPO_ROOT)
    start, end = dt.date.fromisoformat(args.start), dt.date.fromisoformat(args.end)
    if (end - start).days < 2:
        parser.error(f"the training window {start}..{end} needs at least 3 days (train/val/test)")
    first = start - dt.timedelta(days=HISTORY_DAYS)
    partitions = [
        key
        for key in daily_partitions.get_partition_keys()
        if first <= dt.date.fromisoformat(key) <= end
    ]
    if not partitions:
        parser.error(f"no partitions between {first} and {end}")

    began = time.perf_counter()
    with dg.DagsterInstance.get() as instance:
        for job, what in (
            ("load_dimensions", "Loading the dimension tables"),
            ("apply_feature_registry", "Applying the Feast registry"),
        ):
            setup = defs.resolve_job_def(job).execute_in_process(
                instance=instance, raise_on_error=False, run_config=QUIET
            )
            if not setup.success:
                print(f"{what} failed; see `make dev` → Runs.", file=sys.stderr)
                return 1
        # The lead-in days are only ingested and validated: the window's history features read
        # their published flights; their own features would need a lead-in of their own.
        lead_in = defs.resolve_job_def("ingest_and_validate")
        daily = defs.resolve_job_def("daily_partition")
        outcomes = []
        for partition in partitions:
            in_window = dt.date.fromisoformat(partition) >= start
            outcome = run_day(daily if in_window else lead_in, instance, partition)
            outcomes.append(outcome)
            status = "published" if outcome.success else "REFUSED"
            print(f"{partition}: {status}{'' if in_window else ' (history lead-in)'}", flush=True)
        window = training_config(start, end)
        training = run_asset(
            defs.resolve_job_def("build_training_set"),
            instance,
            {"training_set": {"config": window}},
            f"[{window['start']}, {window['end']})",
        )
        model = AssetRun(False, "")
        if training.success:
            model = run_asset(defs.resolve_job_def("train_model"), instance, {})
    print_summary(outcomes, training, model, home, time.perf_counter() - began)
    return 0 if training.success and model.success else 1


if __name__ == "__main__":
    sys.exit(main())
