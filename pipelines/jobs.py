"""Jobs: what runs together, and the limits every launched run of them carries.

The tags below act on runs launched through the daemon (the UI, schedules, sensors, backfills);
`make run` and the tests execute in-process, where they are only recorded.
"""

import dagster as dg

from assets.deployment import rollback_champion

HOUR = 3600


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


DIMENSIONS = dg.AssetSelection.assets("planes", "airlines", "airports")

dimensions_job = dg.define_asset_job(
    "load_dimensions",
    selection=DIMENSIONS,
    description="Load the dimension tables (planes, airlines, airports).",
)

daily_ingestion_job = dg.define_asset_job(
    "ingest_and_validate",
    selection=dg.AssetSelection.groups("ingestion", "validation").required_multi_asset_neighbors()
    - DIMENSIONS,
    description="Ingest one day's raw tables, audit them with GX and publish what passes.",
)

daily_job = dg.define_asset_job(
    "daily_partition",
    selection=(
        dg.AssetSelection.groups(
            "ingestion", "validation", "features", "inference", "monitoring"
        ).required_multi_asset_neighbors()
        - DIMENSIONS
        - dg.AssetSelection.assets("feature_registry", "training_set")
    ),
    description=(
        "Everything of one day: ingest, validate, build the feature tables, write the day's"
        " features to the online store, score the day with the champion and measure drift (the"
        " last two skip themselves before the first champion)."
    ),
    tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
)

feature_registry_job = dg.define_asset_job(
    "apply_feature_registry",
    selection=dg.AssetSelection.assets("feature_registry"),
    description="Apply feature_repo/ to the Feast registry (what `feast apply` does).",
)

training_set_job = dg.define_asset_job(
    "build_training_set",
    selection=dg.AssetSelection.assets("training_set"),
    description="Join the labelled flights of a window through the FeatureService; split by date.",
)

TRAINING = dg.AssetSelection.assets(
    "trained_model", "model_evaluation", "onnx_model", "registered_model"
)

retrain_job = dg.define_asset_job(
    "retrain",
    selection=dg.AssetSelection.assets("training_set") | TRAINING,
    description=(
        "The whole retrain: a training set over a window of days (config: ops → training_set),"
        " then train, evaluate against the champion, export and, if every gate passes, register"
        " and promote. Launched nightly, by the drift sensor, or by hand."
    ),
    tags=run_limits(max_runtime_s=4 * HOUR, run_retries=1),
)

training_job = dg.define_asset_job(
    "train_model",
    selection=TRAINING,
    description=(
        "Train on the latest training set (torchrun, via Pipes), evaluate against the champion,"
        " export to ONNX and, if every gate passes, register the model and make it champion."
    ),
)

scoring_job = dg.define_asset_job(
    "score_flights",
    selection=dg.AssetSelection.assets("batch_predictions", "feature_drift"),
    description=(
        "Score one day's flights with the champion (onnxruntime), replacing that day, and"
        " measure the drift of the days up to it."
    ),
    tags=run_limits(max_runtime_s=1 * HOUR, run_retries=1),
)


@dg.job(
    description=(
        "Move the champion alias back to a named registered version (Launchpad: ops →"
        " rollback_champion → config: version, reason). Batch scoring uses it from the next run."
    )
)
def rollback_champion_job():
    rollback_champion()
