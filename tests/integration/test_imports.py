"""What a fresh interpreter loads when it imports an entry point: the code location (under the
local and the production profile), training and its node, measuring and plotting. Each test
starts a Python process, so that nothing this test process imported already counts."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


HEAVY = (
    "feast",
    "great_expectations",
    "torch",
    "onnxruntime",
    "onnx",
    "mlflow",
    "duckdb",
    "pandas",
)


def test_loading_the_code_location_imports_no_heavy_library():
    probe = (
        "import json, sys; import pipelines.definitions as d; d.defs.resolve_asset_graph();"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_loading_the_production_profile_connects_to_nothing_and_imports_nothing_heavy(tmp_path):
    probe = (
        "import json, sys; import pipelines.definitions as d; d.defs.resolve_asset_graph();"
        "print(json.dumps(sorted(m for m in ('feast', 'mlflow', 'torch', 'redis', 'psycopg2',"
        " 'great_expectations') if m in sys.modules)))"
    )
    # Every service address is unreachable: loading must not try any of them.
    variables = {
        "ML_LIFECYCLE_ENV": "prod",
        "ML_LIFECYCLE_HOME": str(tmp_path),
        "ML_LIFECYCLE_LAKE_URL": "file:///nonexistent/lake",
        "FEAST_REGISTRY_URL": "postgresql+psycopg2://nobody@192.0.2.1:1/none",
        "FEAST_REDIS_URL": "192.0.2.1:1",
        "MLFLOW_TRACKING_URI": "postgresql://nobody@192.0.2.1:1/none",
        "MLFLOW_ARTIFACT_ROOT": "file:///nonexistent/artifacts",
    }
    out = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **variables},
        timeout=120,
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_training_and_its_node_do_not_import_each_other_at_import_time():
    # ml.train must not import ml.node; the node checks a config with ml.preflight, which
    # imports neither the trainer nor torch and pandas (seconds before any worker starts).
    def loaded(module: str, *names: str) -> list[str]:
        found = f"[m for m in {names!r} if m in sys.modules]"
        script = f"import json, sys, {module}; print(json.dumps({found}))"
        run = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, check=True
        )
        return json.loads(run.stdout)

    assert loaded("ml.train", "ml.node") == []
    assert loaded("ml.preflight", "ml.train", "torch", "pandas") == []
    assert loaded("ml.compat", "torch", "dagster") == []  # the node checks its environment
    from ml import exits, node

    assert node.EXIT_NOT_RETRYABLE == exits.EXIT_NOT_RETRYABLE == 78
    left = subprocess.run([sys.executable, "-c", "from ml.exits import leave; leave(78)"])
    assert left.returncode == 78


def test_measuring_and_plotting_import_no_scikit_learn():
    # Its import costs seconds in every process that trains or evaluates a model.
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, numpy as np, ml.metrics as m, ml.plots, ml.train;"
            " m.binary_metrics(np.array([0, 1]), np.array([0.2, 0.7]));"
            " m.best_threshold(np.array([0, 1]), np.array([0.2, 0.7]));"
            " m.roc_curve(np.array([0, 1]), np.array([0.2, 0.7]));"
            " print('sklearn' in sys.modules)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == "False"
