"""Studies of real trainings: the `study` asset's trials launched through LocalTorchrun side by
side, each an MLflow run nested under the study's with its own manifest; the best saved to the
catalog; a pruned trial's training stopped; a study whose process was killed mid-trial resumed
with the dead trial retried once and every trial counted once."""

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import numpy as np
import optuna
import pandas as pd
import pytest

from assets.tuning import tuning_assets
from declare import BASELINE, Catalog, Choice, FloatRange, SearchPolicy
from ml import tune
from ml.catalog import entry_settings
from resources.launchers import LocalTorchrun, TrialSlot
from resources.mlflow_runs import PARENT_RUN_TAG
from resources.registry import local_registry
from resources.studies import StudyStorage
from tests.production import databases, postgres_url, require_services
from usecases import FLIGHTS

pytestmark = pytest.mark.integration
SPACE = (
    FloatRange("optim.lr", 1e-3, 3e-2, log=True),
    Choice("model.hidden_sizes", ((16,), (32, 16))),
)


@pytest.fixture(scope="module")
def training_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small training set shaped like the flights': features, label, split."""
    rng = np.random.default_rng(0)
    rows = 3_000
    carrier = rng.choice(["AA", "B6", "DL", "UA"], rows)
    temp = rng.normal(40, 10, rows)
    signal_ = (carrier == "B6") * 1.0 + (temp - 40) / 10
    frame = pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(rows)],
            "flight_schedule__carrier_code": carrier,
            "origin_weather__temp_f": temp,
            "arrival_delayed": (signal_ + rng.normal(0, 1, rows) > 0.5).astype("int64"),
            "split": np.where(np.arange(rows) < 2_000, "train", "validation"),
        }
    )
    path = tmp_path_factory.mktemp("data") / "training_set.parquet"
    frame.to_parquet(path)
    return path


def case_in(folder: Path, **policy):
    """The flights with a catalog of a short baseline and a small search space."""
    configs = folder / "configs"
    configs.mkdir(parents=True)
    (configs / f"{BASELINE}.toml").write_text(
        'description = "short"\n[training.optim]\nmax_epochs = 3\nbatch_size = 128\n'
    )
    search = SearchPolicy(space=SPACE, **{"trials": 3, "workers": 2, "startup_trials": 3, **policy})
    return dataclasses.replace(FLIGHTS, configs=Catalog(configs), search=search)


def materialize_study(case, home: Path, training_set: Path, storage: str = "", **config):
    @dg.input_manager
    def lake_paths(_):
        return training_set

    (study,) = tuning_assets(case)
    return dg.materialize(
        [study, dg.AssetSpec(["flights", "training_set"])],
        resources={
            "lake_paths": lake_paths,
            "launcher": LocalTorchrun(output_root=str(home / "models"), processes=1),
            "mlflow": local_registry(home),
            "studies": StudyStorage(url=storage or f"journal:{home / 'studies.log'}"),
        },
        run_config={"ops": {"flights__study": {"config": config}}},
        instance=dg.DagsterInstance.ephemeral(),
    )


def test_a_study_runs_real_trainings_side_by_side_each_traceable(training_set, tmp_path):
    """On PostgreSQL, as the production profile keeps studies (the journal file, the local
    profile's, is the other tests')."""
    require_services()
    case = case_in(tmp_path)
    with databases("optuna") as names:
        storage = postgres_url(names["optuna"], "postgresql")
        check_study(case, tmp_path, training_set, storage)


def check_study(case, tmp_path: Path, training_set: Path, storage: str) -> None:
    result = materialize_study(case, tmp_path, training_set, storage, save_best_as="tuned")
    assert result.success
    (materialization,) = result.asset_materializations_for_node("flights__study")
    shown = {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    assert shown["trials"] == 3 and shown["trials_complete"] == 3
    assert shown["storage"].startswith("postgresql://")
    assert "optimization_history" in shown and "| trial |" in shown["trials_table"]

    # Each trial: its own folder and manifest, recording the entry it started from and its seed.
    run_id = result.run_id
    for number in range(3):
        manifest = json.loads(
            (tmp_path / "models" / run_id / "trials" / str(number) / "manifest.json").read_text()
        )
        assert manifest["config"]["catalog"]["name"] == BASELINE
        assert "optim.lr" in manifest["config"]["catalog"]["overridden"]
        assert manifest["seed"] == 2013 and manifest["data_fingerprint"]

    # In MLflow: the study's run, and each trial's nested under it.
    client = local_registry(tmp_path).for_use_case("flights").client()
    experiment = client.get_experiment_by_name("flights")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name.startswith("study-")]
    trials = [r for r in runs if r.info.run_name.startswith("trial-")]
    assert len(trials) == 3
    assert all(r.data.tags[PARENT_RUN_TAG] == parent.info.run_id for r in trials)
    assert all(r.info.status == "FINISHED" for r in [parent, *trials])

    # The best saved to the catalog, with the study it came from.
    saved = case.configs.entry("tuned")
    assert saved.origin["study"] == shown["study"]
    assert saved.origin["trial"] == shown["best_trial"]
    assert entry_settings(saved).optim.max_epochs == 3  # the starting entry's, kept

    # Run again under the same name, the study has its trials: none runs twice.
    again = materialize_study(case, tmp_path, training_set, storage, study=shown["study"])
    (second,) = again.asset_materializations_for_node("flights__study")
    assert second.metadata["ran_in_this_run"].value == 0
    assert second.metadata["trials"].value == 3


def test_a_pruned_trials_training_is_stopped_at_once(training_set, tmp_path):
    """The launcher kills the trial's node when its study stops it: fewer epochs than planned,
    `Stopped` raised, no weights written."""
    stop, epochs = threading.Event(), []
    config = entry_settings(case_in(tmp_path).configs.entry(BASELINE))
    config = dataclasses.replace(
        config,
        data=dataclasses.replace(
            config.data, training_set=str(training_set), label="arrival_delayed"
        ),
        optim=dataclasses.replace(config.optim, max_epochs=200, patience_epochs=200),
        output_dir=str(tmp_path / "trial"),
    )

    def on_message(message):
        if isinstance(message, dict) and "epoch" in message:
            epochs.append(message["epoch"])
            stop.set()  # pruned at its first report

    @dg.asset
    def trial(context: dg.AssetExecutionContext, launcher: LocalTorchrun) -> dg.MaterializeResult:
        with pytest.raises(tune.Stopped):
            launcher.launch_trial(context, config, on_message, TrialSlot(0, 1, 1, stop))
        return dg.MaterializeResult()

    launcher = LocalTorchrun(output_root=str(tmp_path), processes=1)
    assert dg.materialize([trial], resources={"launcher": launcher}).success
    assert epochs and max(epochs) < 200
    assert not (tmp_path / "trial" / "model.safetensors").exists()


STUDY = """
import sys, threading
from pathlib import Path
from declare import BASELINE, Catalog, SearchPolicy
from ml import tune
from tests.integration.test_tuning import SPACE

def wait_forever(start, report, stop):
    print(f"running {start.number}", flush=True)
    threading.Event().wait()  # until the process is killed

spec = tune.StudySpec(
    name="killed", storage=sys.argv[1], start=BASELINE, heartbeat_s=0.1, grace_s=1.0,
    policy=SearchPolicy(space=SPACE, trials=3, workers=1, startup_trials=3),
)
tune.run_study(spec, Catalog(Path(sys.argv[2])), wait_forever, print)
"""


@pytest.fixture(params=["journal", "postgresql"])
def storage(request, tmp_path) -> Iterator[str]:
    """A study storage: a journal file, or a fresh database on this machine's PostgreSQL (as
    the production profile keeps studies)."""
    if request.param == "journal":
        yield f"journal:{tmp_path / 'studies.log'}"
        return
    require_services()
    with databases("optuna") as names:
        yield postgres_url(names["optuna"], "postgresql")


def test_a_study_killed_mid_trial_resumes_with_that_trial_retried_once(tmp_path, storage):
    case = case_in(tmp_path)
    killed = subprocess.Popen(
        [sys.executable, "-c", STUDY, storage, str(case.configs.folder)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert killed.stdout is not None
    try:
        for line in killed.stdout:  # until its first trial is running
            if line.startswith("running 0"):
                break
        else:
            pytest.fail(f"the study ended before its first trial ran: exit {killed.wait()}")
    finally:
        killed.kill()  # SIGKILL; also when the test fails: no orphan is left behind
        killed.wait()

    def quick(start, report, stop):
        report(1, start.settings.optim.lr)
        return start.settings.optim.lr

    spec = tune.StudySpec(
        name="killed",
        storage=storage,
        start=BASELINE,
        heartbeat_s=0.1,
        grace_s=1.0,
        policy=SearchPolicy(space=SPACE, trials=3, workers=1, startup_trials=3),
    )
    began = time.monotonic()
    result = tune.run_study(spec, case.configs, quick, print)
    assert time.monotonic() - began < 30
    states = [(row.number, row.state) for row in result.trials]
    assert states == [(0, "FAIL"), (1, "COMPLETE"), (2, "COMPLETE"), (3, "COMPLETE")]
    assert "its worker stopped" in result.trials[0].note
    retried = [row for row in result.trials if row.note.startswith("retry of trial 0")]
    assert len(retried) == 1 and retried[0].params == result.trials[0].params
    study = optuna.load_study(study_name="killed", storage=tune.open_storage(storage))
    assert sum(t.state.is_finished() for t in study.trials) == 4  # 3 counted + the dead one
