"""Jobs: what runs together."""

import dagster as dg

from assets.deployment import rollback_champion

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
            "ingestion", "validation", "features"
        ).required_multi_asset_neighbors()
        - DIMENSIONS
        - dg.AssetSelection.assets("feature_registry", "training_set")
    ),
    description=(
        "Everything of one day: ingest, validate, build the feature tables and write the day's"
        " features to the online store."
    ),
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

training_job = dg.define_asset_job(
    "train_model",
    selection=dg.AssetSelection.assets(
        "trained_model", "model_evaluation", "onnx_model", "registered_model"
    ),
    description=(
        "Train on the latest training set (torchrun, via Pipes), evaluate against the champion,"
        " export to ONNX and, if every gate passes, register the model and make it champion."
    ),
)

scoring_job = dg.define_asset_job(
    "score_flights",
    selection=dg.AssetSelection.assets("batch_predictions"),
    description="Score one day's flights with the champion (onnxruntime), replacing that day.",
)


@dg.job(
    description=(
        "Move the champion alias back to a named registered version (Launchpad: ops →"
        " rollback_champion → config: version, reason). Batch scoring uses it from the next run."
    )
)
def rollback_champion_job():
    rollback_champion()
