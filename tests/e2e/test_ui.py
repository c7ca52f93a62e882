"""`make dev`'s server on the shared trained world, used as a person and as a client would: the
API answers on 127.0.0.1 with the asset graph, partitions, checks, schedules and sensors; a real
browser materializes a partition and launches a backfill from the UI, reads the model's metrics
and plots, follows a training from Dagster to MLflow (`make mlflow`'s server) and back, and
watches a training's epochs arrive in MLflow while it runs. (A month's backfill launched through
the API and run by the daemon, on the production profile under its run queue, is
tests/e2e/test_backfill_load.py.)

Runs and backfills go through the server's queue and daemon, not `execute_in_process`, so this is
the path a person's click takes. The browser is Debian's chromium (`.ci/run` installs it).
Screenshots of each browser step land in `<repo>/.local/ui-screenshots/`.

Changes to the world: drops and raw partitions (with their contract checks) of days no other test
uses, `raw_flights` of 2013-04-01..03; every daily asset of 2013-01-01..02 (before the world's
history), from a ranged `daily_partition` run and the backfill that finishes it; one more run in
the flights MLflow experiment (a small training of its own, registered nowhere).
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pyarrow.parquet as pq
import pytest

from assets import asset_key
from cli.run_summary import UI, stage_link
from ml.train import HOLD_AFTER_CHECKPOINT
from resources.mlflow_runs import LOCAL_DAGSTER_UI, LOCAL_MLFLOW_UI, ML_VIEW
from tests.conftest import CASE, LIFECYCLE_GROUPS
from tests.integration.test_training import (
    materialize_trained_model,
    training_set,  # noqa: F401 - the fixture
)
from tests.world import World, make_drops

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = REPO / ".local" / "ui-screenshots"
MAKEFILE_DEV_WARNINGS = re.compile(r"^DEV_WARNINGS := (.+)$", re.MULTILINE)

# Days nobody else in the session uses: the browser's run and backfill.
UI_RUN_DAY = "2013-04-01"
UI_BACKFILL_DAYS = ["2013-04-02", "2013-04-03"]
# The ranged Launchpad run: the first days of the partitions, so their trailing windows need no
# history (before the first partition a window is shorter) and touch none of the world's days.
# Two days make a range; each more day adds its runs to the suite's longest test.
RANGE_DAYS = ["2013-01-01", "2013-01-02"]

GROUPS = LIFECYCLE_GROUPS
ASSETS_QUERY = """{ assetNodes { assetKey { path } groupName
  partitionDefinition { description type }
  assetChecksOrError { ... on AssetChecks { checks { name blocking } } } } }"""
REPOSITORIES_QUERY = """{ repositoriesOrError { ... on RepositoryConnection { nodes {
  name location { name } jobs { name } schedules { name } sensors { name } } } } }"""
RUNS_QUERY = """query($filter: RunsFilter) { runsOrError(filter: $filter) {
  ... on Runs { results { runId status tags { key value } } } } }"""
BACKFILLS_QUERY = """{ partitionBackfillsOrError(limit: 20) { ... on PartitionBackfills {
  results { id status partitionNames assetSelection { path } } } } }"""
BACKFILL_QUERY = """query($id: String!) { partitionBackfillOrError(backfillId: $id) {
  ... on PartitionBackfill { id status numPartitions
    assetBackfillData { assetBackfillStatuses {
      ... on AssetPartitionsStatusCounts { assetKey { path } numPartitionsTargeted
        numPartitionsMaterialized numPartitionsFailed numPartitionsInProgress } } } }
  ... on PythonError { message } } }"""
BACKFILLS_BY_TAG_QUERY = """{ partitionBackfillsOrError(limit: 20) { ... on PartitionBackfills {
  results { id status tags { key value } } } } }"""
LAUNCH_RUN = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
SENSOR_TICKS_QUERY = """query($selector: SensorSelector!) {
  sensorOrError(sensorSelector: $selector) { ... on Sensor {
    sensorState { status ticks(limit: 1) { status } } } } }"""
FINISHED = {"COMPLETED", "COMPLETED_SUCCESS", "COMPLETED_FAILED", "FAILED", "CANCELED"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    """A running `dagster dev` on the world, and its GraphQL API."""

    url: str
    log: Path

    def graphql(self, query: str, variables: dict | None = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.load(response)
        assert "errors" not in answer, answer["errors"]
        return answer["data"]

    def wait_for(self, what: str, probe: Callable[[], Any], timeout_s: float) -> Any:
        """`probe()`'s first truthy value; fails with the server's log tail after `timeout_s`."""
        give_up = time.monotonic() + timeout_s
        while True:
            value = probe()
            if value:
                return value
            if time.monotonic() > give_up:
                tail = self.log.read_text(errors="replace")[-4000:]
                pytest.fail(f"{what}: not after {timeout_s:.0f} s; dagster dev log tail:\n{tail}")
            time.sleep(2)

    def runs(self, **run_filter: Any) -> list[dict[str, Any]]:
        return self.graphql(RUNS_QUERY, {"filter": run_filter})["runsOrError"]["results"]

    def backfill(self, backfill_id: str) -> dict[str, Any]:
        return self.graphql(BACKFILL_QUERY, {"id": backfill_id})["partitionBackfillOrError"]

    def finished_backfill(self, backfill_id: str, timeout_s: float) -> dict[str, Any]:
        def probe() -> dict[str, Any] | None:
            backfill = self.backfill(backfill_id)
            return backfill if backfill["status"] in FINISHED else None

        return self.wait_for(f"backfill {backfill_id}", probe, timeout_s)


@pytest.fixture(scope="module")
def server(world: World) -> Iterator[Server]:
    """`dagster dev -w workspace.yaml` serving the world, as `make dev` starts it."""
    make_drops(world.drops, [UI_RUN_DAY, *UI_BACKFILL_DAYS, *RANGE_DAYS])
    port = free_port()
    log = world.home / f"dagster-dev-{port}.log"
    started = time.monotonic()
    with log.open("w") as sink:
        process = subprocess.Popen(
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
            env={**world.environment(), "PYTHONWARNINGS": dev_warnings()},
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    served = Server(url=f"http://127.0.0.1:{port}", log=log)

    def loaded() -> bool:
        try:
            return bool(served.graphql(ASSETS_QUERY)["assetNodes"])
        except OSError:  # not listening yet
            return False

    try:
        served.wait_for("the code location loaded", loaded, timeout_s=180)
        sys.stderr.write(f"dagster dev answered after {time.monotonic() - started:.0f} s\n")
        # Nothing at start-up that a person would read as something wrong with their setup.
        assert "Warning:" not in log.read_text(), log.read_text()[-3000:]
        yield served
    finally:
        stop(process)


def dev_warnings() -> str:
    """The warning filter `make dev` starts `dagster dev` under (Makefile, DEV_WARNINGS)."""
    found = MAKEFILE_DEV_WARNINGS.search((REPO / "Makefile").read_text())
    assert found, "the Makefile's DEV_WARNINGS"
    return found[1]


@pytest.fixture(scope="module")
def mlflow_ui(world: World) -> Iterator[str]:
    """`mlflow ui` on the world's store, as `make mlflow` starts it; its address."""
    port = free_port()
    log = world.home / f"mlflow-ui-{port}.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [
                Path(sys.executable).parent / "mlflow",
                "ui",
                "--backend-store-uri",
                world.registry.tracking_uri,
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as answer:
                return answer.status == 200
        except OSError:
            return False

    try:
        Server(url, log).wait_for("the MLflow UI", healthy, timeout_s=120)
        yield url
    finally:
        stop(process)


STOP_GRACE_S = 15
"""How long `dagster dev` gets to stop on SIGTERM. An idle one stops in about 3 s; after the
browser test it has been seen to take past 60 s, when its process group is killed anyway."""


def stop(process: subprocess.Popen) -> None:
    """SIGTERM to `dagster dev`'s process group, then SIGKILL to what is left after the grace,
    named in a warning (what was tested was served; the names say what held the shutdown)."""
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=STOP_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    left = [
        " ".join(p.info["cmdline"] or [])[:160]
        for p in psutil.process_iter(["cmdline"])
        if _group_of(p.pid) == process.pid
    ]
    warnings.warn(f"dagster dev still running after {STOP_GRACE_S} s: {left}", stacklevel=1)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.mark.timeout(600)
def test_the_api_serves_the_graph_partitions_checks_schedules_and_sensors(server: Server):
    nodes = {
        n["assetKey"]["path"][-1]: n
        for n in server.graphql(ASSETS_QUERY)["assetNodes"]
        if n["assetKey"]["path"][0] == CASE.name
    }
    (repository,) = server.graphql(REPOSITORIES_QUERY)["repositoriesOrError"]["nodes"]

    assert {c["name"] for c in nodes["model_evaluation"]["assetChecksOrError"]["checks"]} == {
        "finite_metrics",
        "absolute_floor",
        "no_regression",
        "no_slice_regression",
        "no_fold_regression",
        "beats_baseline",
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
    assert repository["location"]["name"] == "ml-lifecycle"  # workspace.yaml's, not a path
    jobs = {j["name"] for j in repository["jobs"]}
    assert {
        CASE.name_for("daily_partition"),
        CASE.name_for("ingest_and_validate"),
        CASE.name_for("load_dimensions"),
        CASE.name_for("apply_feature_registry"),
        CASE.name_for("build_training_set"),
        CASE.name_for("train_model"),
        CASE.name_for("score_day"),
        CASE.name_for("rollback_champion_job"),
    } <= jobs
    groups = {nodes[k]["groupName"] for k in nodes}
    schedules = {s["name"] for s in repository["schedules"]}
    sensors = {s["name"] for s in repository["sensors"]}
    # The unattended lifecycle, all checked before failing so one message names what is missing.
    unattended = {
        "job retrain": CASE.name_for("retrain") in jobs,
        "nightly schedules": {
            CASE.name_for("nightly_daily_partition"),
            CASE.name_for("nightly_retrain"),
        }
        <= schedules,
        "sensor drift_retrain": CASE.name_for("drift_retrain") in sensors,
        "feature_drift in monitoring": nodes.get("feature_drift", {}).get("groupName")
        == CASE.group("monitoring"),
    }
    assert all(unattended.values()), (unattended, jobs, schedules, sensors)
    assert groups == {CASE.group(stage) for stage in GROUPS}


@pytest.mark.timeout(900)
def test_a_ranged_launchpad_run_of_the_daily_job_is_finished_for_every_day(
    server: Server, world: World
):
    """The Launchpad's run of `daily_partition` over a range publishes the days in one run and
    skips what follows a day's publication; `finish_range` backfills that for the range's days:
    feature tables, the online store and drift (the world has a champion). Nothing of the days
    was predicted the night before, so their realized performance is left out: the step would
    skip, and the backfill would count that as a failure."""
    (repository,) = server.graphql(REPOSITORIES_QUERY)["repositoriesOrError"]["nodes"]
    where = {
        "repositoryLocationName": repository["location"]["name"],
        "repositoryName": repository["name"],
    }
    sensor = {**where, "sensorName": CASE.name_for("finish_range")}

    def ticked() -> bool:  # its first tick: it answers the runs that end after it
        state = server.graphql(SENSOR_TICKS_QUERY, {"selector": sensor})["sensorOrError"]
        return state["sensorState"]["status"] == "RUNNING" and bool(state["sensorState"]["ticks"])

    server.wait_for("finish_range's first tick", ticked, timeout_s=180)
    range_tags = [
        {"key": "dagster/asset_partition_range_start", "value": RANGE_DAYS[0]},
        {"key": "dagster/asset_partition_range_end", "value": RANGE_DAYS[-1]},
    ]
    params = {
        "selector": {**where, "jobName": CASE.name_for("daily_partition")},
        "runConfigData": {},
        "executionMetadata": {"tags": range_tags},
    }
    launched = server.graphql(LAUNCH_RUN, {"params": params})["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    run_id = launched["run"]["runId"]

    def run_ended() -> dict[str, Any] | None:
        (run,) = [r for r in server.runs(runIds=[run_id])]
        return run if run["status"] in {"SUCCESS", "FAILURE", "CANCELED"} else None

    assert server.wait_for("the ranged run", run_ended, timeout_s=300)["status"] == "SUCCESS"
    for day in RANGE_DAYS:  # published by the ranged run itself
        assert lake_rows(world, "validated_flights", day) == drop_rows(world, "flights", day)

    def follow_up() -> dict[str, Any] | None:
        backfills = server.graphql(BACKFILLS_BY_TAG_QUERY)["partitionBackfillsOrError"]["results"]
        tagged = [
            b
            for b in backfills
            if {"key": "ml_lifecycle/finishes_run", "value": run_id} in b["tags"]
        ]
        return tagged[0] if tagged else None

    backfill = server.wait_for("the backfill finishing the range", follow_up, timeout_s=180)
    finished = server.finished_backfill(backfill["id"], timeout_s=600)
    statuses = {
        s["assetKey"]["path"][-1]: s for s in finished["assetBackfillData"]["assetBackfillStatuses"]
    }
    done = {name: s["numPartitionsMaterialized"] for name, s in statuses.items()}
    failed = {
        name: s["numPartitionsFailed"] for name, s in statuses.items() if s["numPartitionsFailed"]
    }
    assert failed == {}, (finished, server.log.read_text(errors="replace")[-3000:])
    assert done == {name: len(RANGE_DAYS) for name in statuses}, finished
    assert {"online_features", "flight_features", "feature_drift"} <= set(done)
    # Nobody predicted these days: their realized performance is not even asked for.
    assert "realized_performance" not in done
    online = world.instance.fetch_materializations(
        asset_key(CASE, "online_features"), limit=10
    ).records
    written = {r.partition_key: r.asset_materialization.metadata for r in online}
    assert set(RANGE_DAYS) <= set(written)
    # One Feast materialization for the range, from its first day's start.
    starts = {written[day]["start"].value for day in RANGE_DAYS}
    assert len(starts) == 1 and starts.pop().startswith(RANGE_DAYS[0])
    for day in RANGE_DAYS:
        assert lake_rows(world, "flight_features", day) > 0


@pytest.fixture
def page(request: pytest.FixtureRequest, server: Server):
    """A headless chromium page (Debian's browser; Playwright downloads none)."""
    if not CHROMIUM.is_file():
        reason = f"{CHROMIUM} is missing: apt-get install chromium (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True)
        try:
            context = browser.new_context(viewport={"width": 1600, "height": 1000})
            context.set_default_timeout(60_000)
            page = context.new_page()
            # Dagster's first-visit invitation ("Join the Dagster community") opens a moment after
            # the first page and may then cover a dialog, under which its Skip button cannot be
            # clicked. It is marked seen, as Skip does, before the browser visits.
            server.graphql("mutation SetNuxSeen { setNuxSeen }")
            assert server.graphql("query ShouldShowNux { shouldShowNux }")["shouldShowNux"] is False
            yield page
        finally:
            browser.close()


def drop_rows(world: World, table: str, day: str) -> int:
    return len(pd.read_csv(world.drops / table / f"{day}.csv"))


def lake_rows(world: World, asset: str, day: str) -> int:
    return pq.read_metadata(world.home / "lake" / CASE.name / asset / f"{day}.parquet").num_rows


def screenshot(page, name: str) -> None:
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)


def zoom_out_until_in_view(page, names: tuple[str, ...], clicks: int = 20) -> None:
    """Click the graph's zoom-out control until a person sees every one of `names`: each is
    wholly on the page and the topmost thing at its centre (not under the graph's toolbar)."""
    graph = page.locator("[data-svg-viewport]").first
    drawn = page.get_by_text(names[0], exact=True)
    for name in names[1:]:
        drawn = drawn.or_(page.get_by_text(name, exact=True))
    drawn.first.wait_for(state="attached")  # the graph is laid out and drawn
    seen = """e => { const r = e.getBoundingClientRect();
        if (r.top < 0 || r.left < 0 || r.bottom > innerHeight || r.right > innerWidth) return false;
        const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
        return hit !== null && (hit === e || e.contains(hit) || hit.contains(e)); }"""

    def in_view(name: str) -> bool:
        found = page.get_by_text(name, exact=True)
        return any(found.nth(i).evaluate(seen) for i in range(found.count()))

    missing = list(names)
    for _ in range(clicks):
        missing = [name for name in names if not in_view(name)]
        if not missing:
            return
        before = graph.evaluate("e => e.firstChild.style.transform")
        page.get_by_role("img", name="zoom_out").click()
        page.wait_for_function(
            "([e, before]) => e.firstChild.style.transform !== before",
            arg=[graph.element_handle(), before],
        )
    raise AssertionError(f"{missing} not in the graph's view after {clicks} zoom-outs")


def open_plot(page, key: str, shot: str) -> None:
    """In the metadata table: `key`'s [Show Markdown] → its picture, drawn; the screenshot."""
    row = page.locator("tr", has=page.get_by_text(key, exact=True)).first
    row.get_by_text("[Show Markdown]").click()
    plot = page.get_by_role("dialog").locator('img[src^="data:image/png;base64,"]').first
    plot.wait_for()
    assert plot.evaluate("img => img.naturalWidth") > 100
    screenshot(page, shot)
    page.keyboard.press("Escape")


def launch_from_materialize_dialog(
    page, server: Server, partitions: str, button: str, shot: str
) -> None:
    """On raw_flights' page: Materialize → type the partitions → the launch button."""
    page.goto(f"{server.url}/assets/{CASE.name}/raw_flights")
    # "Materialize…": a partitioned asset asks which partitions first.
    page.get_by_role("button", name=re.compile("Materialize")).click()
    dialog = page.get_by_role("dialog")
    # The UI writes an asset key's parts joined by " / " (displayNameForAssetKey).
    shown = " / ".join(asset_key(CASE, "raw_flights").path)
    dialog.get_by_text(f"Launch runs to materialize {shown}").wait_for()
    selection = dialog.get_by_placeholder("ex:", exact=False).first
    selection.fill(partitions)
    selection.press("Enter")
    launch = dialog.get_by_role("button", name=button, exact=True)
    screenshot(page, shot)
    launch.click()
    dialog.wait_for(state="hidden")


@pytest.mark.timeout(900)
def test_a_person_materializes_backfills_and_reads_the_model_in_the_browser(
    server: Server, world: World, page
):
    # Where make run's summary sends a person first: a stage, its assets drawn as cards.
    page.goto(stage_link(CASE, "features").replace(UI, server.url))
    # The last: the next stage's. Dagster fits a group's graph to the page's width; a person
    # zooms out until the stage's assets are all in view.
    zoom_out_until_in_view(page, ("flight_features", "training_set", "trained_model"))
    screenshot(page, "0-features-stage")
    page.goto(f"{server.url}/asset-groups")
    for group in sorted(GROUPS):
        page.get_by_text(CASE.group(group), exact=True).first.wait_for()
    screenshot(page, "1-asset-graph")

    launch_from_materialize_dialog(page, server, UI_RUN_DAY, "Launch 1 run", "2-one-partition")
    partition = {"key": "dagster/partition", "value": UI_RUN_DAY}

    def run_finished() -> dict[str, Any] | None:
        runs = server.runs(tags=[partition])
        done = [r for r in runs if r["status"] in {"SUCCESS", "FAILURE", "CANCELED"}]
        return done[0] if done else None

    run = server.wait_for(f"the run of raw_flights {UI_RUN_DAY}", run_finished, timeout_s=300)
    assert run["status"] == "SUCCESS", run
    assert len(server.runs(tags=[partition])) == 1
    assert lake_rows(world, "raw_flights", UI_RUN_DAY) == drop_rows(world, "flights", UI_RUN_DAY)
    page.goto(f"{server.url}/runs/{run['runId']}")
    page.get_by_text("Success", exact=False).first.wait_for()
    screenshot(page, "3-partition-run")

    two_days = f"[{UI_BACKFILL_DAYS[0]}...{UI_BACKFILL_DAYS[-1]}]"
    launch_from_materialize_dialog(page, server, two_days, "Launch backfill", "4-two-partitions")
    (backfill,) = [
        b
        for b in server.graphql(BACKFILLS_QUERY)["partitionBackfillsOrError"]["results"]
        if b["partitionNames"] == UI_BACKFILL_DAYS
    ]
    finished = server.finished_backfill(backfill["id"], timeout_s=420)
    assert finished["status"] in {"COMPLETED", "COMPLETED_SUCCESS"}, finished
    (status,) = finished["assetBackfillData"]["assetBackfillStatuses"]
    assert (status["numPartitionsMaterialized"], status["numPartitionsFailed"]) == (2, 0)
    for day in UI_BACKFILL_DAYS:
        assert lake_rows(world, "raw_flights", day) == drop_rows(world, "flights", day)
    page.goto(f"{server.url}/runs/b/{backfill['id']}")
    page.get_by_text(backfill["id"], exact=False).first.wait_for()
    page.get_by_text("Succeeded", exact=True).first.wait_for()
    screenshot(page, "5-backfill")

    page.goto(f"{server.url}/assets/{CASE.name}/model_evaluation?view=events")
    page.get_by_text("test_roc_auc", exact=True).first.wait_for()
    for entry in ("roc_plot", "calibration_plot", "comparison"):
        page.get_by_text(entry, exact=True).first.wait_for()
    screenshot(page, "6-model-evaluation-metrics")
    open_plot(page, "roc_plot", "7-model-evaluation-roc")
    # Per-slice bars: each value's test rows under it and its interval on the bar.
    open_plot(page, "slices_plot", "8-model-evaluation-slices")

    # The same figures across materializations, drawn by Dagster from the numeric metadata.
    page.goto(f"{server.url}/assets/{CASE.name}/model_evaluation")
    page.get_by_role("button", name="Plots").click()
    page.get_by_text("test_roc_auc", exact=True).first.wait_for()
    assert page.locator("canvas").count() >= len(("test_roc_auc", "test_f1", "test_threshold"))
    screenshot(page, "9-model-evaluation-plots")

    # The gate's checks and their results, on the asset's Checks tab.
    page.goto(f"{server.url}/assets/{CASE.name}/model_evaluation?view=checks")
    for rule in (
        *("finite_metrics", "absolute_floor", "no_regression", "no_slice_regression"),
        *("no_fold_regression", "beats_baseline"),
    ):
        page.get_by_text(rule, exact=True).first.wait_for()
    page.get_by_text("Passed", exact=False).first.wait_for()
    screenshot(page, "10-model-evaluation-checks")

    # The schedules and the drift sensor, where a person switches them on.
    page.goto(f"{server.url}/automation")
    for name in ("nightly_daily_partition", "nightly_retrain", "drift_retrain"):
        page.get_by_text(CASE.name_for(name), exact=True).first.wait_for()
    screenshot(page, "11-automation")


@pytest.mark.timeout(900)
def test_a_person_follows_a_training_from_dagster_to_mlflow_and_back_and_watches_one_live(
    server: Server,
    world: World,
    page,
    mlflow_ui: str,
    training_set: Path,  # noqa: F811 - the fixture
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    from mlflow import MlflowClient

    # Dagster → MLflow: the trained model's `mlflow_run` link opens its run on the training view.
    page.goto(f"{server.url}/assets/{CASE.name}/trained_model?view=events")
    link = page.locator(f'a[href^="{LOCAL_MLFLOW_UI}/#/experiments/"]').first
    link.wait_for()
    href = link.get_attribute("href") or ""
    assert href.endswith(f"?{ML_VIEW}"), href
    mlflow_run = href.split("/runs/")[1].split("?")[0]
    page.goto(href.replace(LOCAL_MLFLOW_UI, mlflow_ui))
    page.get_by_text(mlflow_run).first.wait_for()
    for shown in ("validation_loss", "test_roc_auc", "Finished"):
        page.get_by_text(shown, exact=True).first.wait_for()
    page.get_by_text(re.compile(r"^flight_delay_v1 \([0-9a-f]+\)$")).first.wait_for()  # dataset
    screenshot(page, "12-mlflow-training-run")

    # And back: the run's description links the Dagster run that trained it.
    back = page.locator(f'a[href^="{LOCAL_DAGSTER_UI}/runs/"]').first
    back.wait_for()
    dagster_run = (back.get_attribute("href") or "").rsplit("/", 1)[1]
    trained = world.instance.get_latest_materialization_event(asset_key(CASE, "trained_model"))
    assert trained is not None and dagster_run == trained.run_id
    page.goto(f"{server.url}/runs/{dagster_run}")
    page.get_by_text("trained_model", exact=False).first.wait_for()
    page.get_by_text("Success", exact=False).first.wait_for()
    screenshot(page, "13-back-in-dagster")

    # The registered version: what it is, what it learned from, what made it, the gate it passed.
    page.goto(f"{server.url}/assets/{CASE.name}/registered_model?view=events")
    version = page.locator(f'a[href^="{LOCAL_MLFLOW_UI}/#/models/"]').first
    version.wait_for()
    page.goto((version.get_attribute("href") or "").replace(LOCAL_MLFLOW_UI, mlflow_ui))
    page.get_by_text(re.compile("Passed the gate")).first.wait_for()
    page.get_by_text("Inputs (2)", exact=True).first.wait_for()  # numeric, categorical
    screenshot(page, "14-mlflow-model-version")

    # A training in progress: held after its first epoch's checkpoint (ml.train), its MLflow run
    # is open and already shows that epoch; let go, it ends as the same run.
    held = tmp_path / "held"
    monkeypatch.setenv(HOLD_AFTER_CHECKPOINT, str(held))
    client = MlflowClient(world.registry.tracking_uri)
    experiment = client.get_experiment_by_name(CASE.name)
    assert experiment is not None
    before = {r.info.run_id for r in client.search_runs([experiment.experiment_id])}
    train = {"optim": {"max_epochs": 3}, "checkpoint_every_steps": 1_000_000}
    with ThreadPoolExecutor(1) as training:
        trained_now = training.submit(
            materialize_trained_model,
            training_set,
            tmp_path,
            train,
            registry=world.registry,
            processes=1,
        )

        def first_epoch_logged() -> str | None:
            assert not trained_now.done(), trained_now.result()  # it ended unheld
            if not held.exists():
                return None
            runs = client.search_runs([experiment.experiment_id])
            (live,) = [r for r in runs if r.info.run_id not in before]
            logged = client.get_metric_history(live.info.run_id, "validation_loss")
            return live.info.run_id if logged else None

        live_run = server.wait_for("the first epoch in MLflow", first_epoch_logged, 240)
        assert client.get_run(live_run).info.status == "RUNNING"
        page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{live_run}?{ML_VIEW}")
        for shown in ("Running", "validation_loss", "train_loss"):
            page.get_by_text(shown, exact=True).first.wait_for()
        screenshot(page, "15-mlflow-training-live")
        held.unlink()
        assert trained_now.result().success
    finished = client.get_run(live_run)
    assert finished.info.status == "FINISHED"
    assert len(client.get_metric_history(live_run, "validation_loss")) == 3
