import json
import subprocess
import sys

import dagster as dg
import pytest

pytestmark = pytest.mark.unit

HEAVY = ("feast", "great_expectations", "torch", "onnxruntime", "onnx", "mlflow")


def test_loading_the_code_location_imports_no_heavy_library():
    probe = (
        "import json, sys; import pipelines.definitions as d; d.defs.resolve_asset_graph();"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_definitions_load_with_the_whole_graph_jobs_and_checks():
    from pipelines.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {key.to_user_string() for key in graph.get_all_asset_keys()}
    assert keys == {
        "raw_flights",
        "raw_weather",
        "planes",
        "airlines",
        "airports",
        "validated_flights",
        "quarantined_flights",
        "validated_weather",
        "quarantined_weather",
    }
    checks = {(c.asset_key.to_user_string(), c.name) for c in graph.asset_check_keys}
    assert checks == {("raw_flights", "flights_contract"), ("raw_weather", "weather_contract")}
    assert graph.get(dg.AssetKey("validated_flights")).parent_keys == {
        dg.AssetKey("raw_flights"),
        dg.AssetKey("airlines"),
    }
    daily = defs.resolve_job_def("ingest_and_validate")
    assert daily.partitions_def is not None
    assert daily.partitions_def.get_first_partition_key() == "2013-01-01"
    assert daily.partitions_def.get_last_partition_key() == "2013-12-31"
    assert defs.resolve_job_def("load_dimensions") is not None


def test_an_unknown_environment_is_refused_by_name():
    from pipelines.definitions import resources_for

    with pytest.raises(ValueError, match="ML_LIFECYCLE_ENV='staging'"):
        resources_for("staging")
