"""The jobs a use case gets, on a tiny declared use case whose assets are stubs."""

import pytest

from pipelines.jobs import build_jobs, definition_name, find_job
from tests.unit.tiny_case import TINY, stub_definitions

pytestmark = pytest.mark.unit

TRAINING = {"trained_model", "model_evaluation", "onnx_model", "registered_model"}
ARRIVALS = {"raw_trips", "validated_trips", "quarantined_trips"}


def selected(job_name: str) -> set[str]:
    defs = stub_definitions(jobs=build_jobs(TINY))
    job = defs.resolve_job_def(definition_name(TINY, job_name))
    return {key.path[-1] for key in job.asset_layer.selected_asset_keys}


@pytest.mark.parametrize(
    ("job", "assets"),
    [
        ("load_dimensions", {"stations"}),
        ("ingest_and_validate", ARRIVALS),
        (
            "daily_partition",
            ARRIVALS
            | {"trip_features", "trip_outcomes", "online_features"}
            | {"batch_predictions", "feature_drift", "realized_performance"},
        ),
        ("build_features", {"trip_features", "trip_outcomes"}),
        ("write_online_store", {"online_features"}),
        ("apply_feature_registry", {"feature_registry"}),
        ("build_training_set", {"training_set"}),
        ("train_model", TRAINING),
        ("retrain", TRAINING | {"training_set"}),
        ("score_day", {"batch_predictions", "feature_drift", "realized_performance"}),
    ],
)
def test_each_job_selects_the_use_cases_assets_of_its_stage(job, assets):
    assert selected(job) == assets


def test_every_selected_key_is_the_use_cases_own():
    defs = stub_definitions(jobs=build_jobs(TINY))
    keys = defs.resolve_job_def(
        definition_name(TINY, "daily_partition")
    ).asset_layer.selected_asset_keys
    assert {key.path[0] for key in keys} == {"tiny"}


def test_launched_runs_of_the_long_jobs_are_bounded_and_retried_from_the_failure():
    jobs = build_jobs(TINY)

    def tags(name: str) -> dict[str, str]:
        return dict(find_job(jobs, TINY, name).tags or {})

    hours = {
        name: int(tags(name)["dagster/max_runtime"]) / 3600
        for name in ("daily_partition", "retrain", "score_day")
    }
    assert hours == {"daily_partition": 1, "retrain": 4, "score_day": 1}
    assert tags("daily_partition")["dagster/max_retries"] == "1"
    assert tags("retrain")["dagster/retry_strategy"] == "FROM_FAILURE"
    assert "dagster/max_runtime" not in tags("train_model")


def test_the_rollback_job_runs_the_use_cases_rollback_op_and_names_its_model():
    rollback = find_job(build_jobs(TINY), TINY, "rollback_champion_job")
    resolved = stub_definitions(jobs=[rollback]).resolve_job_def(rollback.name)
    assert [node.name for node in resolved.nodes] == ["tiny_rollback_champion"]
    assert "tiny_model" in (rollback.description or "")


def test_descriptions_speak_of_the_declaration_not_of_another_use_case():
    jobs = build_jobs(TINY)
    assert "stations" in (find_job(jobs, TINY, "load_dimensions").description or "")
    assert "tiny_v1" in (find_job(jobs, TINY, "build_training_set").description or "")
    # The retrain's config goes to the training set's op, whose name follows its key.
    assert "tiny__training_set" in (find_job(jobs, TINY, "retrain").description or "")
    for job in jobs:
        assert "flight" not in (job.description or "").lower(), job.name


def test_a_job_the_use_case_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match=r"'tiny'.*'tiny_nightly'"):
        find_job(build_jobs(TINY), TINY, "nightly")
