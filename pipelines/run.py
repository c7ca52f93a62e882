"""`make run`: run the lifecycle on the bundled data with the embedded defaults, then say where
the results are.

First the dimension tables and the Feast registry; then each day is one Dagster run of
`daily_partition` (ingest, validate, feature tables, online store); then a training set over the
days that have a full feature history; then `train_model`: `trained_model` (two torchrun workers
launched through Dagster Pipes), its evaluation against the champion and the gate, the ONNX export
with its parity check, and registration as champion if every gate passed; then the champion
scores the test days (`batch_predictions`). Every run is recorded in the local instance exactly as a
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
# Step-by-step DEBUG events stay in the instance (and the UI); the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}


def run_tags() -> dict[str, str]:
    """Tags of every run this command starts: the machine it runs on, by which the next
    `make run` (or the daemon) tells that a run left unfinished here was killed."""
    from pipelines.run_health import HOST_TAG, this_host

    return {HOST_TAG: this_host()}


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


def ensure_dagster_home(home: Path, instance_file: Path) -> Path:
    """DAGSTER_HOME (default `<home>/dagster_home`) with the profile's instance file in it."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instance_file, dagster_home / "dagster.yaml")
    return dagster_home


def run_day(job: dg.JobDefinition, instance: dg.DagsterInstance, partition: str) -> DayOutcome:
    result = job.execute_in_process(
        partition_key=partition,
        instance=instance,
        raise_on_error=False,
        run_config=QUIET,
        tags=run_tags(),
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
    """What a run of unpartitioned assets produced, for the summary."""

    success: bool
    window: str
    assets: dict[str, dict[str, object]] = field(default_factory=dict)
    """Metadata of each materialized asset, by name."""
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    """(check, passed, description) of every asset check that ran."""
    problem: str = ""

    @property
    def metadata(self) -> dict[str, object]:
        """The metadata of the run's last materialization."""
        return list(self.assets.values())[-1] if self.assets else {}


def run_asset(
    job: dg.JobDefinition, instance: dg.DagsterInstance, ops: dict, window: str = ""
) -> AssetRun:
    run_config = {**QUIET, "ops": ops}
    result = job.execute_in_process(
        instance=instance, raise_on_error=False, run_config=run_config, tags=run_tags()
    )
    outcome = AssetRun(result.success, window)
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
    return outcome


def score_days(
    job: dg.JobDefinition, instance: dg.DagsterInstance, partitions: list[str]
) -> dict[str, AssetRun]:
    """One `score_flights` run per day (the day's predictions, then the drift up to it)."""
    scored = {}
    for partition in partitions:
        result = job.execute_in_process(
            partition_key=partition,
            instance=instance,
            raise_on_error=False,
            run_config=QUIET,
            tags=run_tags(),
        )
        outcome = AssetRun(result.success, partition)
        for event in result.all_events:
            if event.is_step_materialization:
                materialization = event.step_materialization_data.materialization
                outcome.assets[materialization.asset_key.to_user_string()] = {
                    key: getattr(v, "value", v) for key, v in materialization.metadata.items()
                }
            elif event.is_step_failure and event.step_failure_data.error:
                outcome.problem = event.step_failure_data.error.message.strip()
        scored[partition] = outcome
    return scored


def print_summary(
    outcomes: list[DayOutcome],
    training: AssetRun,
    model: AssetRun,
    scored: dict[str, AssetRun],
    home: Path,
    seconds: float,
) -> None:
    published = [o for o in outcomes if o.success]

    def total(asset: str) -> int:
        return sum(o.rows.get(asset, 0) for o in outcomes)

    print()
    print(
        f"Ran {len(outcomes)} day(s), a training set, training, the gates and scoring in"
        f" {seconds:.1f} s:"
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
    trained = model.assets.get("trained_model")
    if trained:
        weights = Path(str(trained.get("weights")))
        print(
            f"  model: {trained.get('world_size')} process(es), {trained.get('precision')},"
            f" best epoch {trained.get('best_epoch')} of {trained.get('epochs')},"
            f" {_number(trained.get('samples_per_s'), '.0f')} samples/s"
        )
        print(f"    layout:   {trained.get('layout')}")
        print(f"    weights:  {weights}")
        print(f"    manifest: {weights.parent / 'manifest.json'}")
        print(f"    MLflow:   {trained.get('mlflow_run')} (after `make mlflow`)")
    evaluation = model.assets.get("model_evaluation")
    if evaluation:
        print(
            f"  evaluation on {evaluation.get('test_rows')} test rows"
            f" (threshold {_number(evaluation.get('threshold'), '.3f')}),"
            f" against champion: {evaluation.get('champion')}"
        )
        print("    " + str(evaluation.get("comparison", "")).replace("\n", "\n    "))
        print(f"  gate: {str(evaluation.get('decision')).upper()}: {evaluation.get('reasons')}")
        for name, passed, description in model.checks:
            print(f"    [{'pass' if passed else 'FAIL'}] {name}: {description}")
    exported = model.assets.get("onnx_model")
    if exported:
        print(f"  ONNX:     {exported.get('path')} (sha256 {str(exported.get('sha256'))[:12]})")
    registered = model.assets.get("registered_model")
    if registered and registered.get("unchanged"):
        print(f"  registered: nothing new; {registered.get('model')}: {registered['unchanged']}")
    elif registered:
        print(
            f"  registered: {registered.get('model')}, now champion"
            f" (before: {registered.get('champion_before')})"
        )
        print(f"    MLflow:   {registered.get('mlflow_model_version')}")
    elif evaluation:
        print("  registered: nothing; the champion is unchanged")
    if not model.success and model.problem:
        print(f"  training/deployment stopped: {model.problem}")
    for day, outcome in scored.items():
        meta = outcome.assets.get("batch_predictions", {})
        if outcome.success:
            print(
                f"  predictions {day}: {meta.get('dagster/row_count')} flights"
                f" by {meta.get('model')},"
                f" {meta.get('predicted_delayed')} predicted delayed,"
                f" {meta.get('rows_with_missing_features')} with missing features"
                f" → {meta.get('path')}"
            )
        else:
            print(f"  predictions {day}: FAILED: {outcome.problem}")
        if drift := outcome.assets.get("feature_drift"):
            failed = drift.get("failed_features")
            event = (
                "a DRIFT EVENT (the drift_retrain sensor requests a retrain)"
                if drift.get("drift_event")
                else "no drift event"
            )
            print(
                f"  drift {day}: window {drift.get('window')}: score PSI"
                f" {_number(drift.get('score_psi'), '.3f')}, {event};"
                f" {len(failed) if isinstance(failed, list) else '?'} features past their fail line"
                f" (check: {drift.get('level')})"
            )
    print()
    print(f"Results (all under {home}):")
    print(f"  lake (Parquet, one file per asset partition): {home / 'lake'}")
    print(f"  training set:                                 {home / 'lake' / 'training_set'}")
    print(f"  models (weights, manifest, ONNX, gate report): {home / 'models'}")
    print(f"  predictions (Parquet, one file per day):      {home / 'lake' / 'batch_predictions'}")
    print(f"  MLflow runs (SQLite) and artifacts:           {home / 'mlflow'}")
    print(f"  Feast registry and online store (SQLite):     {home / 'feast'}")
    print(f"  GX Data Docs:                                 {home / 'gx' / 'data_docs'}")
    print(f"  Dagster runs and events (SQLite):             {os.environ['DAGSTER_HOME']}")
    print("  the champion's lineage, back to raw days:     make lineage")
    print()
    print("Open the UI: `make dev`, then http://127.0.0.1:3000. There you find:")
    print(
        "  Assets → Global asset lineage: the whole lifecycle in 8 groups, ingestion to monitoring;"
    )
    print(
        "    each asset page shows its partitions, metadata (row counts, metrics, ROC/calibration/"
    )
    print("    slice/loss/drift plots) and check results (GX contracts, gate, ONNX parity, drift).")
    print("  Runs: every run this command made, step by step, with logs.")
    print("  Automation: nightly_daily_partition, nightly_retrain and the drift_retrain sensor")
    print("    (off until you switch them on; `make dev` runs the daemon that acts on them).")
    print("  Jobs → daily_partition → Materialize / Backfill: any day or range of 2013;")
    print("    retrain: train now; rollback_champion_job: move the champion back.")
    print("MLflow: `make mlflow`, then http://127.0.0.1:5000 (runs, Models → flight_delay).")


def _number(value: object, spec: str) -> str:
    return "n/a" if value is None else format(float(str(value)), spec)


def _percent(rate: object) -> str:
    return f"{rate:.1%}" if isinstance(rate, float) else "n/a"


def _day(text: str) -> dt.date:
    """A `--start`/`--end` value: a YYYY-MM-DD day, or a clean usage error naming it."""
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YYYY-MM-DD day") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the lifecycle on the bundled data.")
    parser.add_argument(
        "--start",
        type=_day,
        default=DEFAULT_START,
        help=f"first day of the training set (YYYY-MM-DD); days from {HISTORY_DAYS} days earlier"
        " are processed too, for the trailing-delay history",
    )
    parser.add_argument(
        "--end", type=_day, default=DEFAULT_END, help="last day, inclusive (YYYY-MM-DD)"
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="torchrun workers (DDP over gloo); 0 lets the launcher measure the fastest layout",
    )
    args = parser.parse_args(argv)
    if args.processes:  # read when the definitions are built, below
        os.environ["ML_LIFECYCLE_TRAIN_PROCESSES"] = str(args.processes)

    # Feast installs a DeprecationWarning filter of its own when imported, ahead of any set
    # before; importing it first lets the filter below hold. The warning is pydantic 2's about
    # dagster-shared's v1-style attribute access: not ours to change.
    import feast  # noqa: F401

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    from pipelines.definitions import defs, environment, instance_file, local_home
    from pipelines.partitions import daily_partitions, training_config
    from pipelines.run_health import release_dead_runs

    home = local_home()
    ensure_dagster_home(home, instance_file(environment()))
    start, end = args.start, args.end
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
        # A run an earlier, killed `make run` left unfinished would hold its pool slots forever.
        for released in release_dead_runs(instance):
            print(f"run {released.run_id} ({released.job_name}): {released.reason}", flush=True)
        for job, what in (
            ("load_dimensions", "Loading the dimension tables"),
            ("apply_feature_registry", "Applying the Feast registry"),
        ):
            setup = defs.resolve_job_def(job).execute_in_process(
                instance=instance, raise_on_error=False, run_config=QUIET, tags=run_tags()
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
        scored: dict[str, AssetRun] = {}
        if training.success:
            model = run_asset(defs.resolve_job_def("train_model"), instance, {})
            # The test days: the champion (new, or kept when the gate refused) scores them.
            test_days = [p for p in partitions if p >= window["test_start"]]
            scored = score_days(defs.resolve_job_def("score_flights"), instance, test_days)
    print_summary(outcomes, training, model, scored, home, time.perf_counter() - began)
    scoring_ok = bool(scored) and all(s.success for s in scored.values())
    return 0 if training.success and model.success and scoring_ok else 1


if __name__ == "__main__":
    sys.exit(main())
