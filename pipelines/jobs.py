"""Jobs: what runs together, and the limits every launched run of them carries.

The tags below act on runs launched through the daemon (the UI, schedules, sensors, backfills);
`make run` and the tests execute in-process, where they are only recorded.
"""

import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

import dagster as dg

from assets import asset_key
from assets.deployment import rollback_op
from declare import UseCase

if TYPE_CHECKING:
    # What `define_asset_job` returns; dagster does not export the class.
    from dagster._core.definitions.unresolved_asset_job_definition import (
        UnresolvedAssetJobDefinition,
    )

HOUR = 3600

# The daily job mixes steps of different backfill policies (the event tables' runs of a month of
# days, the features' one run, scoring's run a day), which Dagster says at every load. A backfill
# from the asset graph batches each as its policy says (assets/validation.py, assets/features.py).
warnings.filterwarnings(
    "ignore", message=r"Asset job \S+ materializes assets with varying BackfillPolicies"
)
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
"""The tags of a run of a range of days (Dagster's own names, not exported)."""
SCORING = ("batch_predictions", "feature_drift", "realized_performance")
"""The assets of scoring a day and measuring it, in order."""
TRAINING = ("trained_model", "model_evaluation", "onnx_model", "registered_model")
"""The assets of a model from its training set to its registration, in order."""

Job: TypeAlias = "UnresolvedAssetJobDefinition | dg.JobDefinition"


def run_limits(max_runtime_s: int, run_retries: int) -> dict[str, str]:
    """Tags bounding a launched run: run monitoring cancels it after `max_runtime_s` (a hung
    collective or a stuck download never holds the queue overnight); the run is retried up to
    `run_retries` times, from the failed step, only when its process died (a lost pod, an OOM
    kill): a failed step has already had its own retry policy, and a bad input fails the same
    way every time. Together with torchrun's restarts and the op retries, the attempts of a crash
    loop stay bounded."""
    return {
        "dagster/max_runtime": str(max_runtime_s),
        "dagster/max_retries": str(run_retries),
        "dagster/retry_strategy": "FROM_FAILURE",
        "dagster/retry_on_asset_or_op_failure": "false",
    }


def definition_name(case: UseCase, base: str) -> str:
    """The name of `case`'s job, schedule or sensor `base` (`retrain`, `nightly_retrain`,
    `drift_retrain`, ...): what the UI, run filters and `make run` look it up by."""
    return case.name_for(base)


def find_job(jobs: Sequence[Job], case: UseCase, base: str) -> Job:
    """`case`'s job `base` among `jobs` (as `build_jobs` made them)."""
    name = definition_name(case, base)
    for job in jobs:
        if job.name == name:
            return job
    raise ValueError(f"use case {case.name!r} has no job {name!r}: {[j.name for j in jobs]}")


def _assets(case: UseCase, *names: str) -> dg.AssetSelection:
    return dg.AssetSelection.assets(*(asset_key(case, name) for name in names))


def _arrivals(tables: Sequence[str]) -> list[str]:
    """The assets of a day's arrival of `tables`: raw, validated and quarantined."""
    return [f"{stage}_{t}" for t in tables for stage in ("raw", "validated", "quarantined")]


def day_after_arrival(case: UseCase) -> list[str]:
    """What `daily_partition` does with a day once its tables are published: build its feature
    tables, write them to the online store, and measure it (drift, realized performance) or,
    for a use case that does not predict ahead, score it too. In a run of a range of days these
    steps are skipped (the published tables are recorded day by day, with no output to pass on):
    `pipelines.sensors.build_range_sensor` backfills them for the range's published days."""
    features = [spec.name for spec in case.feature_tables]
    # Predicted ahead, a day's predictions are made by its own run the night before; its daily
    # run then brings its outcomes and judges them. Otherwise the daily run scores the day too.
    measuring = SCORING[1:] if case.predicts_ahead else SCORING
    return [*features, "online_features", *measuring]


def build_jobs(case: UseCase) -> list[Job]:
    """`case`'s jobs: its daily runs, its training and scoring, and the champion's rollback."""
    arrivals = _arrivals([table.name for table in case.event_tables])
    features = [spec.name for spec in case.feature_tables]
    rollback = rollback_op(case)
    dimensions = [dimension.name for dimension in case.dimensions]
    training_set_op = asset_key(case, "training_set").to_python_identifier()

    @dg.job(
        name=definition_name(case, "rollback_champion_job"),
        description=(
            f"Move the champion alias of {case.registered_model} back to a named registered"
            f" version (Launchpad: ops → {rollback.name} → config: version, reason). Batch"
            " scoring uses it from the next run."
        ),
    )
    def rollback_champion_job():
        rollback()

    load_dimensions = dg.define_asset_job(
        definition_name(case, "load_dimensions"),
        selection=_assets(case, *dimensions),
        description=f"Load the dimension tables ({', '.join(dimensions)}).",
    )
    predict_day = dg.define_asset_job(
        definition_name(case, "predict_day"),
        selection=_assets(
            case,
            *_arrivals(case.ahead_tables),
            *case.ahead_feature_tables,
            "batch_predictions",
        ),
        description=(
            "Predict a day before it begins: ingest and validate what is published ahead of it"
            f" ({', '.join(case.ahead_tables)}), build its feature tables that need nothing of the"
            " day itself, and score its entities with the champion, as of the day's start."
            " Requested for the next day after each day's `daily_partition` run."
        ),
        tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
    )
    return [
        *([load_dimensions] if dimensions else []),  # a use case may have none
        *([predict_day] if case.predicts_ahead else []),
        dg.define_asset_job(
            definition_name(case, "ingest_and_validate"),
            selection=_assets(case, *arrivals),
            description="Ingest one day's raw tables, audit them with GX and publish what passes.",
        ),
        dg.define_asset_job(
            definition_name(case, "daily_partition"),
            selection=_assets(case, *arrivals, *day_after_arrival(case)),
            description=(
                "Everything of one day: ingest, validate, build the feature tables, write the"
                " day's features to the online store, "
                + (
                    "measure drift and judge the predictions made for the day the night before"
                    " against its outcomes"
                    if case.predicts_ahead
                    else "score the day with the champion and measure drift"
                )
                + " (skipped before the first champion)."
            ),
            tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
        ),
        *(
            dg.define_asset_job(
                definition_name(case, name),
                selection=_assets(case, *assets),
                description=description,
                tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
            )
            for name, assets, description in (
                (
                    "build_features",
                    features,
                    "Build the feature tables of published days; a range of days is one run,"
                    " each day recorded as its own partition.",
                ),
                (
                    "write_online_store",
                    ["online_features"],
                    "Write the days' latest feature values to Feast's online store; a range of"
                    " days is one Feast materialization.",
                ),
            )
        ),
        dg.define_asset_job(
            definition_name(case, "apply_feature_registry"),
            selection=_assets(case, "feature_registry"),
            description=(
                f"Apply feature_repo/{case.name}/ to the Feast registry as the project"
                f" {case.name} (what `feast apply` in that folder does)."
            ),
        ),
        dg.define_asset_job(
            definition_name(case, "build_training_set"),
            selection=_assets(case, "training_set"),
            description=(
                f"Join the labelled rows of a window through {case.feature_service}; split by date."
            ),
        ),
        dg.define_asset_job(
            definition_name(case, "train_model"),
            selection=_assets(case, *TRAINING),
            description=(
                "Train on the latest training set (torchrun, via Pipes), evaluate against the"
                " champion, export to ONNX and, if every gate passes, register the model and make"
                " it champion."
            ),
        ),
        dg.define_asset_job(
            definition_name(case, "retrain"),
            selection=_assets(case, "training_set", *TRAINING),
            description=(
                "The whole retrain: a training set over a window of days (config: ops →"
                f" {training_set_op}), then train, evaluate against the champion, export and, if"
                " every gate passes, register and promote. Launched nightly, by the drift sensor,"
                " or by hand."
            ),
            tags=run_limits(max_runtime_s=4 * HOUR, run_retries=1),
        ),
        dg.define_asset_job(
            definition_name(case, "tune"),
            selection=_assets(case, "study"),
            description=(
                f"A hyperparameter study on the latest training set: {case.search.trials} trials"
                f" by default, up to {case.search.workers} side by side, each a training logged"
                " to MLflow under the study's run; pruned when its validation loss lags. Run"
                " again with the same study name, it resumes (config: ops → study)."
            ),
            tags=run_limits(max_runtime_s=12 * HOUR, run_retries=1),
        ),
        *(
            [
                dg.define_asset_job(
                    definition_name(case, "backtest"),
                    selection=_assets(case, "backtest"),
                    description=(
                        "A rolling backtest: a catalog entry (partition dimension `config`)"
                        f" trained on the {case.backtest.train_days} days before a month and"
                        " tested on the month (dimension `fold`), its metric with a bootstrap"
                        " interval beside the naive forecast's. Backfill a row of folds to run"
                        " them all."
                    ),
                    tags=run_limits(max_runtime_s=2 * HOUR, run_retries=1),
                ),
            ]
            if case.backtests  # a use case of a few weeks has no fold
            else []
        ),
        dg.define_asset_job(
            definition_name(case, "score_day"),
            selection=_assets(case, *SCORING),
            description=(
                "Score one day with the champion (onnxruntime), replacing that day's"
                " predictions, measure the drift of the days up to it and, once its outcomes are"
                " published, the realized performance of the predictions made for it."
            ),
            tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
        ),
        rollback_champion_job,
    ]
