"""Studies (`ml.tune`) on a journal file, with a runner that trains nothing: its loss is a
function of the trial's values, so the study's own behaviour is what is tested (seeding,
pruning, failures, dead workers, resuming, counting). Real trainings run in
tests/integration/test_tuning.py."""

import math
import threading
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from declare import BASELINE, Catalog, Choice, FloatRange, SearchError, SearchPolicy
from ml import tune
from ml.catalog import entry_settings, save

pytestmark = pytest.mark.unit
SPACE = (
    FloatRange("optim.lr", 1e-4, 1e-1, log=True),
    Choice("model.hidden_sizes", ((64,), (128, 64))),
)


def catalog(folder: Path) -> Catalog:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{BASELINE}.toml").write_text('description = "defaults"\n')
    return Catalog(folder)


def spec(tmp_path: Path, name: str = "s", **policy) -> tune.StudySpec:
    settings = {"space": SPACE, "trials": 4, "workers": 1, "startup_trials": 4, **policy}
    return tune.StudySpec(
        name=name,
        storage=f"journal:{tmp_path / 'studies.log'}",
        policy=SearchPolicy(**settings),
        start=BASELINE,
        heartbeat_s=0.05,
        grace_s=0.5,
    )


def loss_of(start: tune.TrialStart) -> float:
    """A loss with its minimum at lr 0.01 and the wider network."""
    wide = start.settings.model.hidden_sizes == (128, 64)
    return abs(math.log10(start.settings.optim.lr) + 2) + (0.0 if wide else 0.5)


def quick(start: tune.TrialStart, report: tune.Report, stop: threading.Event) -> float:
    for epoch in (1, 2, 3):
        if report(epoch, loss_of(start) + 1 / epoch):
            raise tune.Stopped(f"trial {start.number} stopped at epoch {epoch}")
    return loss_of(start)


def states(tmp_path: Path, name: str = "s") -> list[str]:
    study = optuna.load_study(study_name=name, storage=tune.open_storage(spec(tmp_path).storage))
    return [t.state.name for t in study.get_trials()]


def test_a_seeded_study_tries_the_same_settings_twice(tmp_path):
    catalogue = catalog(tmp_path / "configs")
    first = tune.run_study(spec(tmp_path, "a"), catalogue, quick, print)
    second = tune.run_study(spec(tmp_path, "b"), catalogue, quick, print)
    assert [t.params for t in first.trials] == [t.params for t in second.trials]
    assert [t.value for t in first.trials] == [t.value for t in second.trials]
    assert len(first.trials) == 4 and first.best is not None
    assert first.best.value == min(t.value for t in first.trials if t.value is not None)


def test_the_first_trial_is_the_starting_entry_and_the_others_its_settings_with_theirs(tmp_path):
    seen = []

    def record(start, report, stop):
        seen.append(start)
        return 1.0

    result = tune.run_study(spec(tmp_path, trials=2), catalog(tmp_path / "configs"), record, print)
    first, second = seen
    assert first.params == {"optim.lr": 3e-3, "model.hidden_sizes": (128, 64)}  # the defaults
    assert first.settings.catalog.name == BASELINE and first.settings.catalog.overridden == ()
    assert result.trials[0].note == "the settings of 'baseline'"
    assert second.settings.optim.lr == second.params["optim.lr"]
    assert second.settings.model.hidden_sizes == second.params["model.hidden_sizes"]
    assert second.settings.catalog.name == BASELINE
    assert "optim.lr" in second.settings.catalog.overridden


def test_a_starting_entry_outside_the_space_is_not_a_trial(tmp_path):
    lines = []
    narrow = (FloatRange("optim.lr", 1e-4, 1e-3, log=True),)  # the default 3e-3 is outside
    study_spec = spec(tmp_path, space=narrow, trials=1)
    result = tune.run_study(study_spec, catalog(tmp_path / "configs"), quick, lines.append)
    assert "'baseline''s optim.lr=0.003 is outside the space" in lines[0]
    assert result.trials[0].params["optim.lr"] <= 1e-3


def test_an_unpromising_trial_is_pruned_and_its_training_stopped(tmp_path):
    stopped = []

    def worse_each_time(start, report, stop):
        for epoch in (1, 2, 3):
            if report(epoch, float(start.number)):  # every trial worse than the ones before
                stopped.append((start.number, epoch, stop.is_set()))
                raise tune.Stopped("pruned")
        return float(start.number)

    result = tune.run_study(
        spec(tmp_path, trials=3, startup_trials=1, warmup_epochs=0),
        catalog(tmp_path / "configs"),
        worse_each_time,
        print,
    )
    assert [t.state for t in result.trials] == ["COMPLETE", "PRUNED", "PRUNED"]
    assert stopped == [(1, 1, True), (2, 1, True)]
    assert "stopped after epoch 1" in result.trials[1].note or result.trials[1].epochs == 1


def test_a_trial_whose_settings_are_refused_is_recorded_and_the_study_goes_on(tmp_path):
    def refuse_first(start, report, stop):
        if start.number == 0:
            raise tune.TrialRefused("model.hidden_sizes: too wide for this machine")
        return quick(start, report, stop)

    result = tune.run_study(spec(tmp_path), catalog(tmp_path / "configs"), refuse_first, print)
    assert result.trials[0].state == "FAIL" and len(result.trials) == 4
    assert {t.state for t in result.trials[1:]} <= {"COMPLETE", "PRUNED"}
    assert "refused its settings: model.hidden_sizes: too wide" in result.trials[0].note
    assert result.best is not None and result.best.number != 0


def test_a_dead_workers_trial_is_failed_retried_once_and_counted_once(tmp_path):
    """A trial left RUNNING with a stale heartbeat (its process was killed): the study, run
    again, fails it, runs it again with the same values, and still holds its 4 trials."""
    study_spec = spec(tmp_path)
    catalogue = catalog(tmp_path / "configs")
    tune.run_study(tune.StudySpec(**{**study_spec.__dict__, "trials": 1}), catalogue, quick, print)
    study = optuna.load_study(study_name="s", storage=tune.open_storage(study_spec.storage))
    orphan = study.ask()  # as a killed worker left it: started, never told
    orphan.suggest_float("optim.lr", 1e-4, 1e-1, log=True)
    orphan.suggest_categorical("model.hidden_sizes", ["64", "128,64"])
    orphan_params = dict(study.trials[-1].params)
    time.sleep(study_spec.grace_s + 0.1)  # its heartbeat (none: its start) is now stale

    result = tune.run_study(study_spec, catalogue, quick, print)
    rows = {t.number: t for t in result.trials}
    assert rows[1].state == "FAIL" and "its worker stopped" in rows[1].note
    retries = [t for t in result.trials if t.note.startswith("retry of trial 1")]
    assert len(retries) == 1 and retries[0].state == "COMPLETE"
    assert {k: tune.encode(v) for k, v in retries[0].params.items()} == orphan_params
    counted = [t for t in result.trials if t.number != 1]
    assert len(counted) == 4 and all(t.state == "COMPLETE" for t in counted)


def test_a_resumed_study_runs_only_the_trials_it_lacks(tmp_path):
    catalogue = catalog(tmp_path / "configs")
    first = tune.run_study(spec(tmp_path, trials=2), catalogue, quick, print)
    assert first.ran_here == 2
    again = tune.run_study(spec(tmp_path, trials=3), catalogue, quick, print)
    assert again.ran_here == 1 and len(again.trials) == 3
    same = tune.run_study(spec(tmp_path, trials=3), catalogue, quick, print)
    assert same.ran_here == 0 and len(set(t.params["optim.lr"] for t in same.trials)) == 3


def test_two_workers_run_trials_side_by_side(tmp_path):
    running, most = set(), [0]
    lock = threading.Lock()
    both = threading.Barrier(2, timeout=10)

    def together(start, report, stop):
        with lock:
            running.add(start.number)
            most[0] = max(most[0], len(running))
        if start.number < 2:
            both.wait()  # the first two trials wait for each other: they ran at once
        with lock:
            running.discard(start.number)
        return quick(start, report, stop)

    catalogue = catalog(tmp_path / "configs")
    result = tune.run_study(spec(tmp_path, workers=2), catalogue, together, print)
    assert most[0] == 2 and len(result.trials) == 4
    assert all(t.state == "COMPLETE" for t in result.trials)
    # Its random start is drawn in the order trials are asked for: the same as one worker's.
    alone = tune.run_study(spec(tmp_path, "alone"), catalogue, quick, print)
    assert [t.params for t in alone.trials] == [t.params for t in result.trials]


def test_a_worker_with_nothing_to_start_wakes_when_the_last_trial_ends(tmp_path):
    """Trial 0 runs until the other worker has nothing left to start and waits; a heartbeat is
    an hour, so the study ends (within the suite's timeout) only if that worker is woken by the
    trial's end rather than by its heartbeat."""
    idle = threading.Event()

    def heard(line: str) -> None:
        print(line)
        if line.startswith("no trial left to start"):
            idle.set()

    def last_to_end(start, report, stop):
        if start.number == 0:
            assert idle.wait(60), "the other worker never ran out of trials"
        return quick(start, report, stop)

    hourly = replace(spec(tmp_path, trials=2, workers=2), heartbeat_s=3600.0, grace_s=7200.0)
    result = tune.run_study(hourly, catalog(tmp_path / "configs"), last_to_end, heard)
    assert [t.state for t in result.trials] == ["COMPLETE", "COMPLETE"]
    assert idle.is_set()


def test_the_best_config_is_saved_to_the_catalog_with_its_study(tmp_path):
    catalogue = catalog(tmp_path / "configs")
    result = tune.run_study(spec(tmp_path), catalogue, quick, print)
    entry = tune.best_entry(catalogue, result, "tuned", dagster_run="abc")
    save(catalogue, entry, 0o644)
    saved = Catalog(tmp_path / "configs").entry("tuned")
    assert saved.origin["study"] == "s" and saved.origin["trial"] == result.best.number
    settings = entry_settings(saved)
    assert settings.optim.lr == result.best.params["optim.lr"]
    assert settings.model.hidden_sizes == result.best.params["model.hidden_sizes"]
    shown = result.metadata()
    assert shown["best_trial"] == result.best.number and "| trial |" in shown["trials_table"]
    assert shown["optimization_history"].startswith("![")


def test_a_space_or_storage_that_cannot_run_is_refused(tmp_path):
    with pytest.raises(SearchError, match=r"optim\.learning_rate: not a training setting"):
        tune.check_space((FloatRange("optim.learning_rate", 0.1, 1.0),))
    with pytest.raises(SearchError, match="output_dir: not a training setting"):
        tune.check_space((Choice("output_dir", ("a", "b")),))
    with pytest.raises(SearchError, match="plain SQLite is not safe"):
        tune.open_storage(f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(SearchError, match=r"low 1\.0 must be below high 0\.1"):
        FloatRange("optim.lr", 1.0, 0.1)
    assert tune.storage_shown("postgresql://u:secret@h/db") == "postgresql://u:***@h/db"
