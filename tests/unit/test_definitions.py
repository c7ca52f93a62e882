import functools
import json

import dagster as dg
import pytest

from assets import asset_key
from declare import UseCase
from tests.conftest import LIFECYCLE_GROUPS
from usecases.flights import USE_CASE as FLIGHTS

pytestmark = pytest.mark.unit


FLIGHTS_ASSETS = {
    "raw_flight_schedule",
    "validated_flight_schedule",
    "quarantined_flight_schedule",
    "raw_flights",
    "raw_weather",
    "planes",
    "airlines",
    "airports",
    "validated_flights",
    "quarantined_flights",
    "validated_weather",
    "quarantined_weather",
    "flight_features",
    "flight_outcomes",
    "weather_features",
    "aircraft_features",
    "carrier_history",
    "route_history",
}
RIDERSHIP_ASSETS = {
    "raw_day_plan",
    "validated_day_plan",
    "quarantined_day_plan",
    "raw_station_days",
    "raw_day_conditions",
    "validated_station_days",
    "quarantined_station_days",
    "validated_day_conditions",
    "quarantined_day_conditions",
    "station_day",
    "station_calendar",
    "station_history",
    "day_weather",
}
LIFECYCLE_ASSETS = {
    "feature_registry",
    "online_features",
    "training_set",
    "trained_model",
    "study",
    "backtest",
    "model_evaluation",
    "onnx_model",
    "registered_model",
    "batch_predictions",
    "feature_drift",
    "realized_performance",
}
"""The generic stages every use case gets, beside its own tables."""
GATE_RULES = {
    "binary": (
        *("finite_metrics", "absolute_floor", "no_regression", "no_slice_regression"),
        "no_fold_regression",
        "beats_baseline",
    ),
    "regression": (
        *("finite_metrics", "absolute_floor", "no_regression", "no_slice_regression"),
        "no_fold_regression",
        "beats_baseline",
    ),
    "multiclass": (
        *("finite_metrics", "absolute_floor", "no_regression", "no_slice_regression"),
        "no_fold_regression",
        "class_recall_floor",
    ),
}
FLIGHT_BANDS_ASSETS = FLIGHTS_ASSETS - {"flight_outcomes"} | {"flight_band_outcomes"}
BUNDLED_TABLES = {
    "flights": FLIGHTS_ASSETS,
    "ridership": RIDERSHIP_ASSETS,
    "flight_bands": FLIGHT_BANDS_ASSETS,
}
"""The bundled use cases' own assets, spelled out: what their declarations must give."""


def declared_assets(case: UseCase) -> set[str]:
    """A use case's assets, as its declaration names them: its event tables' raw, validated and
    quarantined days, its dimensions and feature tables, and the generic stages (a backtest
    where its days hold a fold)."""
    stages = ("raw", "validated", "quarantined")
    tables = {f"{stage}_{table.name}" for table in case.event_tables for stage in stages}
    tables |= {dimension.name for dimension in case.dimensions}
    lifecycle = LIFECYCLE_ASSETS if case.backtests else LIFECYCLE_ASSETS - {"backtest"}
    return tables | {spec.name for spec in case.feature_tables} | lifecycle


def declared_checks(case: UseCase) -> set[tuple[str, str]]:
    """A use case's asset checks: a contract per event table, the gate's rules of its task, the
    ONNX parity, drift and realized performance."""
    key = functools.partial(asset_key, case)
    return {
        *((key(f"raw_{t.name}").to_user_string(), f"{t.name}_contract") for t in case.event_tables),
        *((key("model_evaluation").to_user_string(), r) for r in GATE_RULES[case.label.task]),
        (key("onnx_model").to_user_string(), "onnx_parity"),
        (key("feature_drift").to_user_string(), "drift_within_thresholds"),
        (key("realized_performance").to_user_string(), "realized_within_tested"),
    }


def test_definitions_load_with_each_use_cases_graph_jobs_and_checks():
    from pipelines.definitions import USE_CASES, defs

    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {f"{case.name}/{a}" for case in USE_CASES for a in declared_assets(case)}
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert checks == {check for case in USE_CASES for check in declared_checks(case)}
    for case in USE_CASES:
        if case.name in BUNDLED_TABLES:
            assert declared_assets(case) == BUNDLED_TABLES[case.name] | LIFECYCLE_ASSETS
    key = functools.partial(asset_key, FLIGHTS)
    assert graph.get(key("onnx_model")).parent_keys == {
        key("model_evaluation"),
        key("training_set"),
    }
    retrain = {
        k.path[-1]
        for k in defs.resolve_job_def("flights_train_model").asset_layer.executable_asset_keys
    }
    assert retrain == {"trained_model", "model_evaluation", "onnx_model", "registered_model"}
    assert graph.get(key("validated_flights")).parent_keys == {key("raw_flights"), key("airlines")}
    daily = defs.resolve_job_def("flights_ingest_and_validate")
    assert daily.partitions_def is not None
    assert daily.partitions_def.get_first_partition_key() == "2013-01-01"
    assert daily.partitions_def.get_last_partition_key() == "2013-12-31"
    assert defs.resolve_job_def("flights_load_dimensions") is not None
    nightly = {
        k.to_user_string()
        for k in defs.resolve_job_def("flights_daily_partition").asset_layer.executable_asset_keys
    }
    assert {
        "flights/raw_flights",
        "flights/online_features",
        "flights/feature_drift",
        "flights/realized_performance",
    } <= nightly
    assert all(k.startswith("flights/") for k in nightly), "a day of one case runs only its own"
    # Drift measures a window that ends with the day's rows: in the day's run it comes after
    # them (and in a run of a range, where the feature tables are skipped, it is skipped too).
    graph = defs.resolve_asset_graph()
    assert (
        asset_key(FLIGHTS, "online_features")
        in graph.get(asset_key(FLIGHTS, "feature_drift")).parent_keys
    )
    tables = {asset_key(FLIGHTS, spec.name) for spec in FLIGHTS.feature_tables}
    assert tables <= graph.get(asset_key(FLIGHTS, "online_features")).parent_keys
    # The day's predictions were made the night before, by its own run.
    assert not nightly & {
        "flights/feature_registry",
        "flights/training_set",
        "flights/planes",
        "flights/batch_predictions",
    }
    ahead = {
        k.path[-1]
        for k in defs.resolve_job_def("flights_predict_day").asset_layer.executable_asset_keys
    }
    assert ahead == {
        *("raw_flight_schedule", "validated_flight_schedule", "quarantined_flight_schedule"),
        *("flight_features", "aircraft_features", "carrier_history", "route_history"),
        "batch_predictions",
    }
    # What the predictions of a day read: its tables built ahead, the rest as of the day before.
    predictions = graph.get(key("batch_predictions"))
    assert predictions.parent_keys == {
        key(name)
        for name in ("registered_model", "flight_features", "aircraft_features", "carrier_history",
                     "route_history", "weather_features")
    }  # fmt: skip
    retrain_all = {
        k.path[-1]
        for k in defs.resolve_job_def("flights_retrain").asset_layer.executable_asset_keys
    }
    assert retrain_all == {"training_set", *retrain}
    ridership_days = defs.resolve_job_def("ridership_daily_partition").partitions_def
    assert ridership_days is not None and ridership_days.timezone == "America/Chicago"


GROUPS = LIFECYCLE_GROUPS
KINDS = {
    *("pandas", "great_expectations", "feast", "pytorch", "onnx", "mlflow", "parquet", "sqlite"),
    "optuna",
}


def test_every_asset_has_a_group_kinds_an_owner_a_description_and_a_code_version():
    from pipelines.definitions import USE_CASES, defs

    graph = defs.resolve_asset_graph()
    for case in USE_CASES:
        seen_groups = set()
        for key in graph.get_all_asset_keys():
            if key.path[0] != case.name:
                continue
            node = graph.get(key)
            spec = node.assets_def.specs_by_key[key]
            name = key.to_user_string()
            assert spec.group_name in {case.group(stage) for stage in GROUPS}, name
            seen_groups.add(spec.group_name)
            assert spec.kinds and spec.kinds <= KINDS, (name, spec.kinds)
            assert spec.owners and all(o.startswith("team:") for o in spec.owners), name
            assert spec.description and len(spec.description) > 20, name
            assert spec.code_version, name
        assert seen_groups == {case.group(stage) for stage in GROUPS}


def test_steps_that_talk_to_other_systems_retry_and_runs_carry_their_limits():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    key = functools.partial(asset_key, FLIGHTS)
    external = ["raw_flights", "feature_registry", "online_features", "training_set"]
    external += ["registered_model", "batch_predictions", "feature_drift", "trained_model"]
    external += ["realized_performance"]
    for name in external:
        policy = graph.get(key(name)).assets_def.op.retry_policy
        assert policy is not None and policy.max_retries >= 1, name
    # Pure computation over the lake is not retried: it would fail the same way again.
    assert graph.get(key("carrier_history")).assets_def.op.retry_policy is None
    for job in ("daily_partition", "retrain", "score_day"):
        tags = defs.resolve_job_def(FLIGHTS.name_for(job)).tags
        assert int(tags["dagster/max_runtime"]) > 0, job
        assert (
            tags["dagster/max_retries"] == "1"
            and tags["dagster/retry_on_asset_or_op_failure"] == "false"
        )
    assert graph.get(key("trained_model")).assets_def.op.pool == "training"
    assert graph.get(key("registered_model")).assets_def.op.pool == "model_registry"
    assert graph.get(key("feature_registry")).assets_def.op.pool == "feast_registry"


def test_a_backfill_run_takes_the_deployments_days_per_run_a_month_unless_set():
    from pipelines.definitions import defs, use_case_definitions
    from pipelines.settings import Settings

    def runs_of(definitions) -> dict[str, int | None]:
        """The most days a backfill run takes, by asset name (None: all in one run)."""
        return {
            key.path[-1]: assets.backfill_policy.max_partitions_per_run
            for assets in definitions.assets or []
            if isinstance(assets, dg.AssetsDefinition) and assets.backfill_policy is not None
            for key in assets.keys
            if key.path[0] == FLIGHTS.name
        }

    batched = {"raw_flights", "validated_weather", "quarantined_flights", "online_features"}
    default = runs_of(defs)
    two = runs_of(use_case_definitions(FLIGHTS, settings=Settings.from_env(
        {"ML_LIFECYCLE_DAYS_PER_RUN": "2"}
    )))  # fmt: skip
    assert {name: default[name] for name in batched} == dict.fromkeys(batched, 31)
    assert {name: two[name] for name in batched} == dict.fromkeys(batched, 2)
    assert default["flight_features"] is two["flight_features"] is None  # a year in one run


def test_the_trailing_history_reads_the_28_days_before_its_partition():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    history = graph.get(asset_key(FLIGHTS, "carrier_history"))
    mapping = history.assets_def.get_partition_mapping(asset_key(FLIGHTS, "validated_flights"))
    subset = mapping.get_upstream_mapped_partitions_result_for_partitions(
        history.partitions_def.subset_with_partition_keys(["2013-02-10"]),
        history.partitions_def,
        history.partitions_def,
    ).partitions_subset
    keys = sorted(subset.get_partition_keys())
    assert keys[0] == "2013-01-13" and keys[-1] == "2013-02-09" and len(keys) == 28


def test_the_registry_code_version_changes_exactly_when_declarations_do(tmp_path):
    from resources.feature_store import declarations_version

    (tmp_path / "repo.py").write_text("x = 1\n")
    (tmp_path / "feature_store.yaml").write_text("project: p\n")
    first = declarations_version(tmp_path)
    (tmp_path / "notes.md").write_text("not a declaration")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "repo.cpython-311.pyc").write_text("a cache")
    assert declarations_version(tmp_path) == first
    (tmp_path / "repo.py").write_text("x = 2\n")
    second = declarations_version(tmp_path)
    assert second != first
    (tmp_path / "feature_store.yaml").write_text("project: q\n")
    assert declarations_version(tmp_path) != second


def test_a_drop_folder_takes_its_size_limit_and_chunk_from_the_environment(tmp_path):
    from pipelines.definitions import source
    from pipelines.settings import Settings
    from resources.sources import DropFolderSource
    from usecases.flights import USE_CASE

    env = {
        "ML_LIFECYCLE_DROP_FOLDER": str(tmp_path),
        "ML_LIFECYCLE_MAX_DROP_MIB": "64",
        "ML_LIFECYCLE_CHUNK_MIB": "0.5",
    }
    drops = source(USE_CASE, Settings.from_env(env))
    assert isinstance(drops, DropFolderSource)
    assert (drops.root, drops.max_drop_mib, drops.chunk_mib) == (str(tmp_path), 64.0, 0.5)
    assert (drops.settle_s, drops.completion_suffix) == (2.0, None)

    env |= {"ML_LIFECYCLE_DROP_SETTLE_S": "30", "ML_LIFECYCLE_DROP_COMPLETION_SUFFIX": ".done"}
    drops = source(USE_CASE, Settings.from_env(env))
    assert isinstance(drops, DropFolderSource)
    assert (drops.settle_s, drops.completion_suffix) == (30.0, ".done")


def test_the_ui_shows_the_definitions_the_snapshot_holds():
    """What the UI shows (assets, checks, jobs, schedules, sensors, launchpad configs) changes
    only on purpose: a reshaping of the code leaves tests/definitions.json as it is."""
    from tests.definitions_snapshot import SNAPSHOT, snapshot

    held = json.loads(SNAPSHOT.read_text())
    now = snapshot()
    changed = sorted(
        f"{part}: {name}"
        for part in held.keys() | now.keys()
        for name in _names(held.get(part)) | _names(now.get(part))
        if _entry(held.get(part), name) != _entry(now.get(part), name)
    )
    assert not changed, (
        f"the Definitions differ from tests/definitions.json in {changed}; if on purpose,"
        " rewrite it: python -m tests.definitions_snapshot --write"
    )


def _names(part) -> set[str]:
    if isinstance(part, dict):
        return set(part)
    return {json.dumps(item) for item in part or []}


def _entry(part, name: str):
    if isinstance(part, dict):
        return part.get(name)
    return name in {json.dumps(item) for item in part or []}
