"""Through the daemon: `dagster dev` is SIGKILLed, its whole process group, while a launched run's
step holds the `training` pool's only slot, as when the machine or the terminal goes. No process
is left to record the run's end, so it stays STARTED. When `dagster dev` is started again, run
monitoring asks the project's run launcher about the run's worker, marks the run failed and
frees its slot; the run retry (one, for a run whose worker died) takes the slot and succeeds, and
so does the next launched run.

`dagster dev` serves a one-asset code location of its own on an instance with the project's
dagster.yaml (run launcher, run monitoring every 10 s, slots freed 5 s after a run ends), so the
test waits on the daemon, not on GX, Feast or torch. (A run worker killed alone is marked failed
by its code server, which is its parent; then only the freeing of the slot is the project's.)
"""

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import psutil
import pytest

from tests.e2e.test_ui import Server, free_port

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
PARENT_RUN_TAG = "dagster/parent_run_id"

LOCATION = textwrap.dedent(
    """
    import os, time
    from pathlib import Path
    import dagster as dg

    @dg.asset(pool="training")
    def held(context: dg.AssetExecutionContext) -> None:
        hang = Path(os.environ["HANG_FLAG"])
        Path(os.environ["MARKERS"], context.run.run_id).write_text(str(os.getpid()))
        while hang.exists():  # until the test kills this process
            time.sleep(0.1)

    # In process, as the project's runs: the step's process is the run worker.
    defs = dg.Definitions(
        assets=[held],
        jobs=[dg.define_asset_job("hold_the_pool", selection=[held])],
        executor=dg.in_process_executor,
    )
    """
)
LAUNCH = """mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""
REPOSITORIES = """{ repositoriesOrError { ... on RepositoryConnection { nodes { name
  location { name } } } } }"""


def launch(server: Server) -> str:
    """Launch `hold_the_pool` through the API, as the UI's Launch button does; its run id."""
    (repository,) = server.graphql(REPOSITORIES)["repositoriesOrError"]["nodes"]
    selector = {
        "repositoryLocationName": repository["location"]["name"],
        "repositoryName": repository["name"],
        "jobName": "hold_the_pool",
    }
    launched = server.graphql(LAUNCH, {"params": {"selector": selector, "runConfigData": {}}})
    assert launched["launchRun"]["__typename"] == "LaunchRunSuccess", launched
    return launched["launchRun"]["run"]["runId"]


@pytest.fixture
def location(tmp_path: Path) -> Path:
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "deploy" / "dagster.local.yaml").read_text())
    (tmp_path / "location.py").write_text(LOCATION)
    (tmp_path / "markers").mkdir()
    return tmp_path


@contextmanager
def dagster_dev(folder: Path, log: Path) -> Iterator[tuple[Server, subprocess.Popen]]:
    """`dagster dev` on the folder's location and instance, stopped (if still running) at exit."""
    home = folder / "dagster_home"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "HANG_FLAG": str(folder / "hang"),
        "MARKERS": str(folder / "markers"),
    }
    port = free_port()
    command = [Path(sys.executable).parent / "dagster", "dev", "-f", "location.py"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with log.open("w") as sink:
        process = subprocess.Popen(
            command, cwd=folder, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    served = Server(url=f"http://127.0.0.1:{port}", log=log)

    def loaded() -> bool:
        try:
            return bool(served.graphql(REPOSITORIES)["repositoriesOrError"]["nodes"])
        except OSError:
            return False

    try:
        served.wait_for("the code location loaded", loaded, timeout_s=300)
        yield served, process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)


@pytest.mark.timeout(600)
def test_after_a_crash_run_monitoring_fails_the_dead_run_and_frees_its_pool_slot(location: Path):
    (location / "hang").touch()
    markers = location / "markers"
    with dagster_dev(location, location / "first.log") as (dev, process):
        dead = launch(dev)
        worker = int(dev.wait_for("the step holds the slot", lambda: _read(markers / dead), 300))
        os.killpg(process.pid, signal.SIGKILL)  # the webserver, daemon, code server, run worker
        process.wait()
        dev.wait_for("the run worker gone", lambda: not psutil.pid_exists(worker), 60)
    (location / "hang").unlink()  # later runs finish their step
    with dg.DagsterInstance.from_config(str(location / "dagster_home")) as instance:

        def status(run_id: str) -> dg.DagsterRunStatus:
            run = instance.get_run_by_id(run_id)
            assert run is not None
            return run.status

        def claimed() -> list:
            return instance.event_log_storage.get_concurrency_info("training").claimed_slots

        assert status(dead) == dg.DagsterRunStatus.STARTED and claimed()  # nobody recorded it
        with dagster_dev(location, location / "second.log") as (dev, _):
            started = dg.DagsterRunStatus.STARTED
            dev.wait_for("the dead run marked failed", lambda: status(dead) != started, 120)
            assert status(dead) == dg.DagsterRunStatus.FAILURE
            failure = instance.all_logs(dead, of_type=dg.DagsterEventType.RUN_FAILURE)
            assert f"worker process {worker}" in (failure[-1].message or ""), failure
            # dagster.yaml retries a run whose worker died, once. The retry needs the pool's only
            # slot: it runs only once the dead run's slot has been freed.
            done = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE}

            def retries() -> list[dg.DagsterRun]:
                return instance.get_runs(dg.RunsFilter(tags={PARENT_RUN_TAG: dead}))

            try:
                dev.wait_for(
                    "the dead run's retry finished",
                    lambda: any(run.status in done for run in retries()),
                    300,
                )
            except pytest.fail.Exception as failed:
                # Seen once in CI (2026-12-03): no retry was made, and neither session's daemon
                # logged why. What the instance held then is what tells the next time.
                pytest.fail(
                    f"{failed}\nThen: retries {[(r.run_id, r.status.value) for r in retries()]},"
                    f" claimed {claimed()}, auto-retry cursors {_retry_cursors(instance)}; the"
                    f" first session's log tail:\n{(location / 'first.log').read_text()[-3000:]}"
                )
            assert [run.status for run in retries()] == [dg.DagsterRunStatus.SUCCESS]
            following = launch(dev)
            dev.wait_for("the next run finished", lambda: status(following) in done, 300)
            assert status(following) == dg.DagsterRunStatus.SUCCESS


def _retry_cursors(instance: dg.DagsterInstance) -> dict[str, str]:
    """The cursors of the daemon that retries failed runs (Dagster's EventLogConsumerDaemon)."""
    from dagster._daemon.auto_run_reexecution.event_log_consumer import (
        DAGSTER_EVENT_TYPES,
        _create_cursor_key,
    )

    keys = {_create_cursor_key(event_type) for event_type in DAGSTER_EVENT_TYPES}
    return instance.daemon_cursor_storage.get_cursor_values(keys)


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else ""
