"""A run killed at any stage never blocks the next one, and the next one finishes the work.

A small world of its own (the first four days of 2013, which need no history lead-in). Each
stage's run is started in a process of its own (`tests/e2e/run_job.py`, which runs a job as
`make run` does), and its whole process group is SIGKILLed once the stage is seen to have
started: its step's STEP_START in the instance, or for training a committed checkpoint and for
scoring its start (after which each holds, `ml.holds`, until it is killed). Then the
work runs again in a new process, as the next `make run` would: the dead run is found, marked
failed and its pool slots freed, and the rerun completes. A rerun is itself killed at the next
stage where it can be, so the stages form chains: ingestion → feature materialization; training
→ export (a new run, which resumes the killed training) → registration → done (each a
re-execution from failure, as the UI's button and a run retry do it); scoring. After each rerun
the lake and the models hold no half-written file and no duplicate row; the resumed training
gives the weights of the uninterrupted one, and the champion stays that model.
"""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import psutil
import pytest

from assets import asset_key
from ml import checkpoint
from ml.score import HOLD_IN_SCORING
from ml.train import HOLD_AFTER_CHECKPOINT
from pipelines.definitions import definitions, local_resources
from pipelines.run_health import release_dead_runs
from pipelines.settings import Settings
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry
from resources.sources import DropFolderSource
from tests.conftest import CASE, lake_file, node
from tests.world import LENIENT, QUIET, REPO, make_drops, opened

# Each test runs a chain of lifecycle runs, several in fresh processes (the module's world is
# built in the first test's setup): far past the suite's 300 s per test on a busy machine.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

DAYS = [f"2013-01-0{day}" for day in range(1, 5)]
LAST = DAYS[-1]
WINDOW = {"start": "2013-01-01", "validation_start": "2013-01-03", "test_start": "2013-01-04",
          "end": "2013-01-05"}  # fmt: skip
TRAIN = {
    "ops": {
        node("trained_model"): {
            "config": {"optim": {"max_epochs": 4, "batch_size": 64}, "checkpoint_every_steps": 8}
        },
        node("model_evaluation"): {"config": LENIENT},
    }
}
POOLS = ("training", "feast_registry", "model_registry")
MODEL = "flight_delay"


@dataclass
class Mini:
    home: Path
    drops: Path
    defs: dg.Definitions
    instance: dg.DagsterInstance
    registry: MlflowRegistry

    def environment(self) -> dict[str, str]:
        return {
            **os.environ,
            "DAGSTER_HOME": str(self.home / "dagster_home"),
            "ML_LIFECYCLE_HOME": str(self.home),
            "ML_LIFECYCLE_DROP_FOLDER": str(self.drops),
            "ML_LIFECYCLE_TRAIN_PROCESSES": "2",
        }

    def run(
        self, job: str, partition: str | None = None, config: dict | None = None
    ) -> dg.ExecuteInProcessResult:
        """A run in this process, for what the tests do not kill; dead runs are released first,
        as `make run` does."""
        release_dead_runs(self.instance)
        return self.defs.resolve_job_def(CASE.name_for(job)).execute_in_process(
            instance=self.instance,
            partition_key=partition,
            run_config={**QUIET, **(config or {})},
            raise_on_error=False,
        )

    def job(
        self,
        job: str,
        partition: str | None = None,
        config: dict | None = None,
        *,
        from_failure: str | None = None,
        kill_when: tuple[Callable[[], bool], str] | None = None,
        env: dict[str, str] | None = None,
    ) -> str:
        """Run `job` in a process of its own (after releasing dead runs, as `make run` does),
        with `env` added to its environment; with `kill_when`, SIGKILL its process group once
        the stage is seen, then wait until no process of it is left (torchrun's node included).
        The run's id."""
        command = [sys.executable, "-m", "tests.e2e.run_job", job]
        command += ["--config", json.dumps({**QUIET, **(config or {})})]
        command += ["--partition", partition] if partition else []
        command += ["--from-failure", from_failure] if from_failure else []
        before = {
            run.run_id for run in self.instance.get_runs(dg.RunsFilter(job_name=CASE.name_for(job)))
        }
        process = subprocess.Popen(
            command,
            cwd=REPO,
            env={**self.environment(), **(env or {})},
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if kill_when is None:
            _, err = process.communicate()
            assert process.returncode == 0, err[-3000:]
        else:
            seen, what = kill_when
            while not seen():
                time.sleep(0.05)
                if process.poll() is not None:
                    tail = process.stderr.read()[-3000:] if process.stderr else ""
                    raise AssertionError(
                        f"{job} ended ({process.returncode}) before {what}: {tail}"
                    )
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            while self.processes_left():
                time.sleep(0.05)
        (run,) = [
            r
            for r in self.instance.get_runs(dg.RunsFilter(job_name=CASE.name_for(job)))
            if r.run_id not in before
        ]
        expected = dg.DagsterRunStatus.STARTED if kill_when else dg.DagsterRunStatus.SUCCESS
        assert run.status == expected  # a killed run is left STARTED
        return run.run_id

    def materialization(self, asset: str) -> tuple[str, str | None, dict[str, object]]:
        """(run id, partition, metadata) of the asset's latest materialization."""
        event = self.instance.get_latest_materialization_event(asset_key(CASE, asset))
        assert event is not None and event.asset_materialization is not None
        materialization = event.asset_materialization
        metadata = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
        return event.run_id, materialization.partition, metadata

    def processes_left(self) -> list[psutil.Process]:
        home = str(self.home)
        left = []
        for process in psutil.process_iter():
            try:
                if process.environ().get("ML_LIFECYCLE_HOME") == home:
                    left.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return left

    def step_started(self, step: str) -> Callable[[], bool]:
        def seen() -> bool:
            running = self.instance.get_runs(
                dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]), limit=1
            )
            return bool(running) and any(
                entry.dagster_event is not None and entry.dagster_event.step_key == node(step)
                for entry in self.instance.all_logs(
                    running[0].run_id, of_type=dg.DagsterEventType.STEP_START
                )
            )

        return seen

    def assert_released(self, run_id: str) -> None:
        run = self.instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        for pool in POOLS:
            info = self.instance.event_log_storage.get_concurrency_info(pool)
            held = [s for s in [*info.claimed_slots, *info.pending_steps] if s.run_id == run_id]
            assert not held, (pool, held)

    def assert_nothing_half_written(self) -> None:
        """No half file in the lake or beside a run's published files, and every checkpoint a
        reader can see is whole. A training killed while writing a checkpoint leaves its hidden
        temporary folder (`.step-*.tmp`) in its own run's folder: no reader opens it, and the
        next save into that folder removes it."""
        for folder in ("lake", "models"):
            half = [
                p
                for p in (self.home / folder).rglob("*")
                if p.name.endswith(".tmp") and not _checkpoint_in_progress(p)
            ]
            assert not half, half
        for step in (self.home / "models").glob(f"*/checkpoints/{checkpoint.PREFIX}*"):
            assert (step / checkpoint.COMPLETE).is_file(), step
        for path in (self.home / "lake").rglob("*.parquet"):
            pd.read_parquet(path)  # raises on a truncated file
        key = ["year", "month", "day", "carrier", "flight", "sched_dep_time"]
        for table in ("raw_flights", "validated_flights"):
            for path in (self.home / "lake" / table).glob("*.parquet"):
                assert not pd.read_parquet(path).duplicated(key).any(), path

    def mlflow_runs(self, dagster_run: str) -> list[str]:
        """The statuses of the MLflow runs that Dagster run `dagster_run` opened."""
        client = self.registry.client()
        experiment = client.get_experiment_by_name(CASE.name)
        assert experiment is not None
        found = client.search_runs(
            [experiment.experiment_id], f"tags.dagster_run_id = '{dagster_run}'"
        )
        return [run.info.status for run in found]

    def champion_weights(self) -> str:
        champion = self.registry.champion(MODEL)
        assert champion is not None
        return champion.tags["weights_sha256"]


def _checkpoint_in_progress(path: Path) -> bool:
    """A checkpoint's temporary folder (`checkpoints/.step-*.tmp`), or a file in one."""
    return any(
        folder.parent.name == "checkpoints"
        and folder.name.startswith(f".{checkpoint.PREFIX}")
        and folder.name.endswith(".tmp")
        for folder in (path, *path.parents)
    )


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mini]:
    home = tmp_path_factory.mktemp("killed")
    drops = make_drops(home / "drops", DAYS)
    (home / "dagster_home").mkdir()
    (home / "dagster_home" / "dagster.yaml").write_text(
        (REPO / "deploy" / "dagster.local.yaml").read_text()
    )
    resources = local_resources(Settings(home=home))
    resources["flights_source"] = DropFolderSource(root=str(drops))
    resources["launcher"] = LocalTorchrun(output_root=str(home / "models"), processes=2)
    registry = resources["mlflow"]
    assert isinstance(registry, MlflowRegistry)
    with opened(dg.DagsterInstance.from_config(str(home / "dagster_home"))) as instance:
        mini = Mini(home, drops, definitions(resources), instance, registry)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "The `__fields__` attribute is deprecated")
            assert mini.run("load_dimensions").success
            assert mini.run("apply_feature_registry").success
            for day in DAYS[:-1]:
                assert mini.run("daily_partition", day).success, day
            yield mini


def test_a_day_killed_in_ingestion_then_in_materialization_is_published_whole(mini: Mini):
    ingesting = mini.job(
        "daily_partition",
        LAST,
        kill_when=(mini.step_started("raw_flights"), "ingestion"),
    )
    # The next run frees the dead one and gets past ingestion: it is killed later.
    materializing = mini.job(
        "daily_partition",
        LAST,
        kill_when=(mini.step_started("online_features"), "feature materialization"),
    )
    mini.assert_released(ingesting)
    rerun = mini.run("daily_partition", LAST)
    assert rerun.success
    mini.assert_released(materializing)
    mini.assert_nothing_half_written()
    assert (lake_file(mini.home, "validated_flights", f"{LAST}.parquet")).is_file()
    assert mini.materialization("online_features")[:2] == (rerun.run_id, LAST)


def test_a_training_killed_at_every_stage_resumes_and_ends_with_the_same_champion(mini: Mini):
    built = mini.run(
        "build_training_set", config={"ops": {node("training_set"): {"config": WINDOW}}}
    )
    assert built.success
    assert mini.run("train_model", config=TRAIN).success  # uninterrupted
    weights = mini.materialization("trained_model")[2]["weights_sha256"]
    assert mini.champion_weights() == weights

    # Training holds after its first committed checkpoint until it is killed: however fast
    # the machine, the kill lands before the training ends.
    held = mini.home / "checkpoint-committed"
    training = mini.job(
        "train_model",
        config=TRAIN,
        kill_when=(held.exists, "a checkpoint"),
        env={HOLD_AFTER_CHECKPOINT: str(held)},
    )
    # A new run resumes from that checkpoint, trains to the end and is killed in export.
    exporting = mini.job(
        "train_model", config=TRAIN, kill_when=(mini.step_started("onnx_model"), "export")
    )
    mini.assert_released(training)
    run, _, metadata = mini.materialization("trained_model")
    assert run == exporting and metadata["resumed_from"] != "none"
    assert metadata["weights_sha256"] == weights
    # The killed training's MLflow run, left RUNNING, was ended by the next training.
    assert mini.mlflow_runs(training) == ["KILLED"]
    assert mini.mlflow_runs(exporting) == ["FINISHED"]
    registering = mini.job(
        "train_model",
        config=TRAIN,
        from_failure=exporting,
        kill_when=(mini.step_started("registered_model"), "registration"),
    )
    mini.assert_released(exporting)
    mini.job("train_model", config=TRAIN, from_failure=registering)
    mini.assert_released(registering)
    assert mini.champion_weights() == weights
    mini.assert_nothing_half_written()


def test_a_day_killed_while_scored_is_scored_whole_by_the_next_run(mini: Mini):
    # Scoring holds, once it has what it scores, until it is killed.
    held = mini.home / "scoring-held"
    scoring = mini.job(
        "score_day",
        LAST,
        kill_when=(held.exists, "scoring"),
        env={HOLD_IN_SCORING: str(held)},
    )
    assert mini.run("score_day", LAST).success
    mini.assert_released(scoring)
    mini.assert_nothing_half_written()
    predictions = pd.read_parquet(lake_file(mini.home, "batch_predictions", f"{LAST}.parquet"))
    assert len(predictions) and not predictions.duplicated("flight_id").any()
