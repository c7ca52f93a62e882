"""`make dev`'s server, started as the Makefile starts it: the UI's API answers on 127.0.0.1 with
the asset graph, the daily partitions and the blocking checks."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
QUERY = """{ assetNodes { assetKey { path } groupName
  partitionDefinition { description type }
  assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def graphql(port: int, deadline_s: float = 120) -> dict:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": QUERY}).encode(),
        headers={"content-type": "application/json"},
    )
    give_up = time.monotonic() + deadline_s
    while True:
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)
        except OSError:
            if time.monotonic() > give_up:
                raise
            time.sleep(1)


@pytest.mark.timeout(240)
def test_the_ui_serves_the_graph_partitions_and_checks_on_localhost(tmp_path: Path):
    port = free_port()
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "ML_LIFECYCLE_HOME": str(tmp_path)}
    server = subprocess.Popen(
        [
            Path(sys.executable).parent / "dagster",
            "dev",
            "-w",
            "workspace.yaml",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        nodes = {"/".join(n["assetKey"]["path"]): n for n in graphql(port)["data"]["assetNodes"]}
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a loaded CI machine; the UI itself was served
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)

    assert {nodes[k]["groupName"] for k in nodes} == {
        "ingestion",
        "validation",
        "features",
        "training",
        "evaluation",
        "deployment",
        "inference",
    }
    assert {c["name"] for c in nodes["model_evaluation"]["assetChecksOrError"]["checks"]} == {
        "finite_metrics",
        "absolute_floor",
        "no_regression",
        "no_slice_regression",
    }
    assert nodes["onnx_model"]["assetChecksOrError"]["checks"] == [
        {"name": "onnx_parity", "blocking": True}
    ]
    assert nodes["batch_predictions"]["partitionDefinition"]["type"] == "TIME_WINDOW"
    assert nodes["carrier_history"]["partitionDefinition"]["type"] == "TIME_WINDOW"
    assert nodes["training_set"]["partitionDefinition"] is None
    assert nodes["raw_flights"]["partitionDefinition"]["type"] == "TIME_WINDOW"
    assert nodes["validated_weather"]["partitionDefinition"] is not None
    assert nodes["airlines"]["partitionDefinition"] is None
    assert nodes["raw_flights"]["assetChecksOrError"]["checks"] == [
        {"name": "flights_contract", "blocking": True}
    ]
    assert nodes["raw_weather"]["assetChecksOrError"]["checks"] == [
        {"name": "weather_contract", "blocking": True}
    ]
