"""`python -m cli.run` (what `make run` runs) stopped with SIGTERM in ingestion, in a held
training and in scoring: within 15 s no process of it is left, the run in progress is CANCELED
(none FAILURE, none unfinished, no step retried), no further run starts, the command exits 143,
and its summary counts the days once and never prints a placeholder. The next command takes up
the rest: the stopped training resumes from its committed checkpoint and ends with the weights
of an uninterrupted training; the stopped day is scored whole.

One small world (three days of 2013, whose window needs no history lead-in, and the day after), and
one chain of commands in it, each stopped once its stage is seen under way: the file a held stage
writes (`ml.holds`): an ingestion once its first day is audited and before it is published, a
training after its first checkpoint, a scoring once it has what it scores. On three days the gate
refuses the model (no champion), which the summary says; a champion for the scoring stop is then
trained as `test_killed_runs` does, with a lenient gate. Polling the instance for a step instead
raced the step's end, and a stop that came after it found nothing to cancel: for the scoring, and
then for the ingestion (CI, 2026-12-05: the stop reached an ingestion run that had just ended
SUCCESS).

A training resumes only the same code (`ml.manifest.git_commit`, `+dirty` included): a commit
or an edit of a tracked file while this module runs makes the rerun train anew, and fail here.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import psutil
import pytest

from assets import asset_key
from ml.score import HOLD_IN_SCORING
from ml.train import HOLD_AFTER_CHECKPOINT
from resources.publishing import HOLD_IN_PUBLISHING
from tests.conftest import CASE, lake_file, node, processes_with
from tests.world import LENIENT, QUIET, REPO, make_drops

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

DAYS = ["2013-01-01", "2013-01-02", "2013-01-03"]
TEST_DAY = DAYS[-1]
COMMAND = [sys.executable, "-m", "cli.run", "--start", DAYS[0], "--end", DAYS[-1]]
STOP_WITHIN_S = 15.0
UNFINISHED = {
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.CANCELING,
}
COUNTS = re.compile(
    r"of (\d+) day\(s\) of flights: (\d+) published, (\d+) refused, (\d+) interrupted,"
    r" (\d+) not started"
)


@dataclass
class Command:
    """What one command did: its exit code, output, and the runs it made."""

    code: int
    out: str
    runs: list[dg.DagsterRun]
    stopped_after_s: float = 0.0
    """From the signal to the last of its processes gone."""


@dataclass
class Home:
    home: Path
    instance: dg.DagsterInstance

    def environment(self, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "ML_LIFECYCLE_HOME": str(self.home),
            "DAGSTER_HOME": str(self.home / "dagster_home"),
            "ML_LIFECYCLE_DROP_FOLDER": str(self.home / "drops"),
            # The command's default (`--processes 2`), for the other jobs' training too: the
            # same layout trains the same weights.
            "ML_LIFECYCLE_TRAIN_PROCESSES": "2",
            **extra,
        }

    def command(self, stop_when: Callable[[], bool] | None = None, **env: str) -> Command:
        """`python -m cli.run` over the world's days; with `stop_when`, SIGTERM it once
        that is seen, then wait (up to the promise) until no process of it is left."""
        before = {run.run_id for run in self.instance.get_runs()}
        process = subprocess.Popen(
            COMMAND,
            cwd=REPO,
            env=self.environment(**env),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        gone = 0.0
        if stop_when is not None:
            while not stop_when():
                assert process.poll() is None, process.communicate()[1][-3000:]
                time.sleep(0.05)
            sent = time.monotonic()
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=120)
            while self.processes_left() and time.monotonic() - sent < STOP_WITHIN_S:
                time.sleep(0.05)
            gone = time.monotonic() - sent
        else:
            out, err = process.communicate(timeout=900)
        runs = [run for run in self.instance.get_runs() if run.run_id not in before]
        assert "Traceback" not in err, err[-3000:]
        return Command(process.returncode, out, runs, gone)

    def processes_left(self) -> list[psutil.Process]:
        return processes_with("ML_LIFECYCLE_HOME", str(self.home))

    def job(self, job: str, partition: str | None = None, config: dict | None = None) -> None:
        """One job run as the kill tests run theirs (`tests/e2e/run_job.py`), to its end."""
        command = [sys.executable, "-m", "tests.e2e.run_job", job]
        command += ["--config", json.dumps({**QUIET, **(config or {})})]
        command += ["--partition", partition] if partition else []
        done = subprocess.run(
            command, cwd=REPO, env=self.environment(), capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-3000:]

    def materialization(self, asset: str) -> tuple[str, dict[str, object]]:
        event = self.instance.get_latest_materialization_event(asset_key(CASE, asset))
        assert event is not None and event.asset_materialization is not None
        metadata = event.asset_materialization.metadata
        return event.run_id, {k: getattr(v, "value", v) for k, v in metadata.items()}


def assert_stopped(home: Home, command: Command, job: str) -> None:
    """Stopped as promised while a run of `job` was under way."""
    assert command.code == 143, command.out[-3000:]
    assert command.stopped_after_s < STOP_WITHIN_S and not home.processes_left()
    statuses = {run.run_id: run.status for run in command.runs}
    assert not UNFINISHED & set(statuses.values()), statuses
    ended = [(run.job_name, run.status.value) for run in command.runs]
    canceled = [r for r in command.runs if r.status == dg.DagsterRunStatus.CANCELED]
    assert len(canceled) == 1, (ended, command.stopped_after_s, command.out[-2000:])
    (canceled,) = canceled
    assert canceled.job_name == CASE.name_for(job)
    # The stopped run is the last it started (the instance lists the newest first).
    assert command.runs[0].run_id == canceled.run_id
    for run in command.runs:
        retried = home.instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
        assert not retried, (run.job_name, retried)
    assert f"STOPPED by SIGTERM during a run of {CASE.name_for(job)}" in command.out
    assert_no_placeholder(command.out)


def assert_no_placeholder(out: str) -> None:
    placeholders = [line for line in out.splitlines() if "None" in line or "n/a" in line]
    assert not placeholders, placeholders


def day_counts(out: str) -> tuple[int, ...]:
    """(planned, published, refused, interrupted, not started) from a stopped summary."""
    found = COUNTS.search(out)
    assert found, out[-3000:]
    counts = tuple(int(n) for n in found.groups())
    assert counts[0] == sum(counts[1:]) == len(DAYS), counts
    return counts


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Home]:
    root = tmp_path_factory.mktemp("stopped")
    make_drops(root / "drops", [*DAYS, "2013-01-04"])  # the day after: predicted ahead
    (root / "dagster_home").mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster.local.yaml", root / "dagster_home" / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(root / "dagster_home")) as instance:
        yield Home(root, instance)


def test_a_stop_in_ingestion_cancels_its_run_and_counts_every_day_once(home: Home):
    held = home.home / "publishing-held"
    stopped = home.command(stop_when=held.exists, **{HOLD_IN_PUBLISHING: str(held)})

    assert_stopped(home, stopped, "ingest_and_validate")
    planned, published, refused, interrupted, not_started = day_counts(stopped.out)
    assert (published, refused) == (0, 0) and interrupted + not_started == planned
    assert "training set [2013-01-01, 2013-01-04): not run (stopped before it)" in stopped.out
    assert f"predictions {TEST_DAY}: not run (stopped before it)" in stopped.out


def test_a_stop_in_a_held_training_cancels_it_and_the_next_command_resumes_it(home: Home):
    held = home.home / "checkpoint-committed"
    stopped = home.command(stop_when=held.exists, **{HOLD_AFTER_CHECKPOINT: str(held)})

    assert_stopped(home, stopped, "train_model")
    assert day_counts(stopped.out)[1:] == (3, 0, 0, 0)  # the rerun of the ingestion is whole
    assert "training: STOPPED during" in stopped.out
    assert "resumes it from its last committed checkpoint" in stopped.out

    resumed = home.command()
    assert resumed.code == 1  # three days train a model the gate refuses: nothing to score
    run, metadata = home.materialization("trained_model")
    assert run in {r.run_id for r in resumed.runs}
    assert metadata["resumed_from"] != "none", metadata
    assert f"predictions {TEST_DAY}: not scored: no champion of flight_delay;" in resumed.out
    assert "STOPPED" not in resumed.out
    assert_no_placeholder(resumed.out)

    # An uninterrupted training of the same data, registered as champion by a lenient gate.
    home.job("train_model", config={"ops": {node("model_evaluation"): {"config": LENIENT}}})
    _, uninterrupted = home.materialization("trained_model")
    assert uninterrupted["resumed_from"] == "none"
    assert uninterrupted["weights_sha256"] == metadata["weights_sha256"]


def test_a_stop_in_scoring_cancels_it_and_the_day_is_then_scored_whole(home: Home):
    held = home.home / "scoring-held"
    stopped = home.command(stop_when=held.exists, **{HOLD_IN_SCORING: str(held)})

    assert_stopped(home, stopped, "score_day")
    assert f"predictions {TEST_DAY}: STOPPED during" in stopped.out
    home.job("score_day", TEST_DAY)
    _, scored = home.materialization("batch_predictions")
    predictions = pd.read_parquet(lake_file(home.home, "batch_predictions", f"{TEST_DAY}.parquet"))
    assert len(predictions) == scored["dagster/row_count"] and len(predictions) > 0
    assert not predictions.duplicated("flight_id").any()
    assert set(predictions["model_version"].astype(str)) == {"1"}
