"""Hyperparameter studies: a use case's search (`declare.search`) run as an Optuna study whose
trials are real trainings, side by side, on storage several workers share.

- **Storage.** `journal:<file>` is Optuna's journal storage in a local file (an append-only log
  under a file lock: safe for several threads and processes on one machine); `postgresql://...`
  is its SQL storage, for workers on several machines. Plain SQLite is refused: it is not safe
  for parallel workers.
- **Trials.** Each trial trains the study's starting catalog entry with the trial's values over
  it, through the `TrialRunner` the caller gives (assets/tuning.py launches it with the
  configured `TrainingLauncher`, as `trained_model` does). Its validation loss is reported each
  epoch, and a trial the median pruner judges unpromising is stopped. The objective is the
  trial's best validation loss.
- **Workers.** `policy.workers` threads of this process each take a trial (`Study.ask`, which
  hands out a waiting retry first), run it and tell its result, until the study has
  `policy.trials` trials that are finished. A resumed study runs only those it lacks.
- **Dead workers.** A running trial records a heartbeat every `heartbeat_s`. One whose
  heartbeat is older than `grace_s` lost its worker (a killed process, a lost pod): it is failed
  and, once, enqueued again with the same values; the failed one no longer counts. Checked
  whenever a worker looks for a trial, so a killed study's running trial is retried when the
  study resumes. A worker with no trial left to take waits for the running ones: woken the
  moment one run here ends, so a study ends with its last trial, not a heartbeat later.
- **Failures.** A trial whose settings the training refuses, or whose training fails, is
  recorded as failed with the reason; the study goes on.

No Dagster; Optuna is imported only when a study runs.
"""

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from declare.catalog import Catalog, NamedConfig
from declare.search import Choice, FloatRange, Param, SearchError, SearchPolicy, decode, encode
from ml import catalog as catalogs
from ml.config import TrainConfig, dotted, nested
from ml.results import Markdown, image

if TYPE_CHECKING:
    import optuna

log = logging.getLogger(__name__)

HEARTBEAT = "ml_lifecycle:heartbeat"
"""The system attribute a running trial's heartbeat (unix seconds) is kept in."""
RETRY_OF = "retry_of"
"""User attribute of a retried trial: the number of the trial whose worker died."""
REPLACED = "replaced_by_retry"
"""User attribute of a trial whose worker died and that was enqueued again: not counted."""
FAILED_BECAUSE = "failed_because"
"""User attribute of a failed trial: why."""
STARTING_ENTRY = "starting_entry"
"""User attribute of a new study's first trial: the catalog entry whose own settings it trains."""


class Stopped(RuntimeError):
    """The runner's training was stopped because the trial was pruned."""


class TrialRefused(RuntimeError):
    """The training refused the trial's settings (or its input): failed, never retried."""


@dataclass(frozen=True)
class TrialStart:
    """A trial as a runner gets it."""

    number: int
    settings: TrainConfig
    """The study's starting entry with the trial's values over it (`catalog` records both)."""
    params: Mapping[str, Any]
    """The trial's values, by dotted setting name."""
    retry_of: int | None = None


Report = Callable[[int, float], bool]
"""Called with (epoch, validation loss) as each epoch ends; True once the trial is pruned (the
runner then stops its training and raises `Stopped`). Must not raise."""
TrialRunner = Callable[[TrialStart, Report, threading.Event], float]
"""Trains a trial and returns its best validation loss; the event is set when it must stop."""


@dataclass(frozen=True)
class StudySpec:
    name: str
    storage: str
    """`journal:<file>` or a `postgresql://` URL."""
    policy: SearchPolicy
    start: str
    """The catalog entry every trial starts from."""
    workers: int | None = None
    """Trials side by side in this process; None: the policy's."""
    trials: int | None = None
    """Finished trials the study must hold; None: the policy's."""
    heartbeat_s: float = 5.0
    grace_s: float = 30.0

    @property
    def target(self) -> int:
        return self.trials if self.trials is not None else self.policy.trials

    @property
    def parallel(self) -> int:
        return self.workers if self.workers is not None else self.policy.workers


def check_space(space: Sequence[Param]) -> None:
    """Refuse a search space naming a setting `TrainConfig` lacks, or that a run cannot choose
    (its input, folder, label, catalog record)."""
    known = dotted(TrainConfig().to_dict())
    for param in space:
        if param.setting not in known or param.setting in catalogs.SET_BY_THE_RUN:
            raise SearchError(
                f"{param.setting}: not a training setting a study can choose; settings are"
                f" {sorted(set(known) - set(catalogs.SET_BY_THE_RUN))}"
            )


def trial_settings(configs: Catalog, start: str, params: Mapping[str, Any]) -> TrainConfig:
    """Entry `start`'s settings with `params` over them; `catalog` names the entry and the
    settings the trial changed."""
    base = catalogs.entry_settings(configs.entry(start))
    was = dotted(base.to_dict())
    values = {**was, **params}
    config = TrainConfig.from_dict(nested(values))
    changed = tuple(sorted(k for k, v in params.items() if _plain(v) != _plain(was[k])))
    return replace(config, catalog=replace(base.catalog, overridden=changed))


def storage_shown(url: str) -> str:
    """`url` with any password left out, for metadata and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return url.replace(f":{parts.password}@", ":***@", 1)


def open_storage(url: str) -> "optuna.storages.BaseStorage":
    """The study storage `url` names (module docstring)."""
    import optuna

    if url.startswith("journal:"):
        from pathlib import Path

        from optuna.storages.journal import JournalFileBackend

        path = Path(url.removeprefix("journal:"))
        path.parent.mkdir(parents=True, exist_ok=True)
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    if url.startswith(("postgresql://", "postgresql+psycopg2://")):
        # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; the driver here is psycopg2.
        driver = url.replace("postgresql://", "postgresql+psycopg2://", 1)
        return optuna.storages.RDBStorage(driver, engine_kwargs={"pool_pre_ping": True})
    raise SearchError(
        f"study storage {storage_shown(url)!r}: expected journal:<file> or a postgresql:// URL"
        " (plain SQLite is not safe for parallel workers)"
    )


@dataclass(frozen=True)
class TrialRow:
    number: int
    state: str
    value: float | None
    params: Mapping[str, Any]
    epochs: int
    seconds: float | None
    note: str = ""


@dataclass(frozen=True)
class StudyResult:
    """A study as it stands after a run of it: every trial, the best, and the plots."""

    name: str
    storage: str
    start: str
    trials: tuple[TrialRow, ...]
    best: TrialRow | None
    ran_here: int
    """Trials this run of the study ran (a resumed study's earlier ones are not counted)."""
    wall_s: float
    history_png: bytes = b""
    importances: Mapping[str, float] = field(default_factory=dict)
    importances_png: bytes = b""
    importances_missing: str = ""

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for row in self.trials:
            out[row.state] = out.get(row.state, 0) + 1
        return out

    def summary(self) -> str:
        """One paragraph: what the study holds and its best trial."""
        counts = ", ".join(f"{n} {state.lower()}" for state, n in sorted(self.counts().items()))
        best = (
            "no trial completed"
            if self.best is None
            else f"best trial {self.best.number}, validation loss {self.best.value:.5f}"
        )
        return (
            f"Study {self.name} from entry {self.start!r}: {len(self.trials)} trials ({counts}),"
            f" {self.ran_here} run this time in {self.wall_s:.0f} s; {best}."
        )

    def document(self) -> dict[str, Any]:
        """The study as JSON: every trial and the best."""
        return {
            "study": self.name,
            "started_from": self.start,
            "trials": [_row_document(row) for row in self.trials],
            "best": None if self.best is None else _row_document(self.best),
            "importances": dict(self.importances),
        }

    def metadata(self) -> dict[str, Any]:
        counts = self.counts()
        shown: dict[str, Any] = {
            "study": self.name,
            "storage": storage_shown(self.storage),
            "started_from": self.start,
            "trials": len(self.trials),
            **{f"trials_{state.lower()}": n for state, n in sorted(counts.items())},
            "ran_in_this_run": self.ran_here,
            "wall_s": round(self.wall_s, 1),
            "trials_table": Markdown(trials_table(self.trials)),
        }
        if self.best is None:
            shown["best"] = "no trial completed: see the trials table for why"
        else:
            shown.update(
                best_trial=self.best.number,
                best_validation_loss=self.best.value,
                best_config=Markdown(
                    "\n".join(f"- `{k}` = {v!r}" for k, v in self.best.params.items())
                ),
            )
        if self.history_png:
            shown["optimization_history"] = image("validation loss per trial", self.history_png)
        if self.importances_png:
            shown["param_importances"] = image("parameter importances", self.importances_png)
        else:
            shown["param_importances"] = self.importances_missing
        return shown


def _row_document(row: TrialRow) -> dict[str, Any]:
    return {
        "number": row.number,
        "state": row.state,
        "validation_loss": row.value,
        "params": {k: list(v) if isinstance(v, tuple) else v for k, v in row.params.items()},
        "epochs": row.epochs,
        "seconds": row.seconds,
        "note": row.note,
    }


def trials_table(rows: Sequence[TrialRow]) -> str:
    names = sorted({k for row in rows for k in row.params})
    head = ["trial", "state", "validation loss", "epochs", "s", *names, "note"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        value = "" if row.value is None else f"{row.value:.5f}"
        seconds = "" if row.seconds is None else f"{row.seconds:.0f}"
        cells = [str(row.number), row.state, value, str(row.epochs), seconds]
        cells += [_shown(row.params.get(k, "")) for k in names] + [row.note.replace("|", "/")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _shown(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def run_study(
    spec: StudySpec, configs: Catalog, runner: TrialRunner, on_trial: Callable[[str], None]
) -> StudyResult:
    """Run `spec`'s study until it holds its trials, finished; `on_trial` gets a line as each
    trial starts and ends."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_space(spec.policy.space)
    started = time.monotonic()
    storage = open_storage(spec.storage)
    existing = _existing_trials(storage, spec.name)
    policy = spec.policy
    study = optuna.create_study(
        study_name=spec.name,
        storage=storage,
        direction="minimize",
        load_if_exists=True,
        # A resumed study draws anew: the same seed again would propose the first trials again.
        sampler=optuna.samplers.TPESampler(
            seed=policy.seed + existing,
            n_startup_trials=policy.startup_trials,
            constant_liar=True,
        ),
        pruner=optuna.pruners.MedianPruner(
            n_startup_trials=policy.startup_trials, n_warmup_steps=policy.warmup_epochs
        ),
    )
    study.set_user_attr("started_from", spec.start)
    if existing == 0:
        _enqueue_start(study, configs, spec, on_trial)
    work = _Work(study, storage, spec, configs, runner, on_trial)
    with ThreadPoolExecutor(spec.parallel, thread_name_prefix="trial_worker") as pool:
        for done in [pool.submit(work.loop) for _ in range(spec.parallel)]:
            done.result()
    return _result(study, spec, work.ran, time.monotonic() - started)


def _enqueue_start(
    study: "optuna.Study", configs: Catalog, spec: StudySpec, on_trial: Callable[[str], None]
) -> None:
    """Make a new study's first trial its starting entry's own settings, where the space holds
    them: the study then measures what it set out to improve on, under the same conditions as
    every trial, and its best is never worse than the start on the validation loss."""
    settings = dotted(catalogs.entry_settings(configs.entry(spec.start)).to_dict())
    values = {}
    for param in spec.policy.space:
        value = _plain(settings[param.setting])
        if isinstance(param, Choice):
            inside = any(_plain(choice) == value for choice in param.choices)
            value = encode(value)
        else:
            inside = param.low <= value <= param.high
        if not inside:
            on_trial(
                f"{spec.start!r}'s {param.setting}={value!r} is outside the space: its settings"
                " are not the study's first trial"
            )
            return
        values[param.setting] = value
    study.enqueue_trial(values, user_attrs={STARTING_ENTRY: spec.start})


def _existing_trials(storage: Any, name: str) -> int:
    """How many trials study `name` already has (0 for a new study)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


class _Work:
    """What the study's worker threads share."""

    def __init__(
        self,
        study: "optuna.Study",
        storage: Any,
        spec: StudySpec,
        configs: Catalog,
        runner: TrialRunner,
        on_trial: Callable[[str], None],
    ) -> None:
        self.study, self.storage, self.spec = study, storage, spec
        self.configs, self.runner, self.on_trial = configs, runner, on_trial
        self.study_id = storage.get_study_id_from_name(spec.name)
        self.changed = threading.Condition()
        """Held to ask for a trial; notified as each trial run here ends."""
        self.ran = 0

    def loop(self) -> None:
        waited_for: list[int] = []
        while True:
            with self.changed:
                self.fail_stale()
                asked = self.next_trial()
                if asked is None:
                    if self.finished() >= self.spec.target:
                        return
                    # The last trials run in other workers: woken as soon as one here ends (it
                    # may leave the study short), else after a heartbeat, as one elsewhere may
                    # stop beating.
                    running = self.running()
                    if running != waited_for:
                        shown = ", ".join(map(str, running)) or "none yet"
                        self.on_trial(f"no trial left to start; waiting for trial(s) {shown}")
                        waited_for = running
                    self.changed.wait(self.spec.heartbeat_s)
                    continue
            self.run(*asked)

    def running(self) -> list[int]:
        from optuna.trial import TrialState

        return [
            t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        ]

    def counted(self) -> list[Any]:
        return [t for t in self.study.get_trials(deepcopy=False) if not t.user_attrs.get(REPLACED)]

    def finished(self) -> int:
        return sum(t.state.is_finished() for t in self.counted())

    def next_trial(self) -> "tuple[optuna.Trial, dict[str, Any]] | None":
        """A new trial and its values, or None when the study has all the trials it needs.
        Called under the lock: its values are drawn in the order trials are asked for, so a
        seeded study's random start is the same however many workers draw from it."""
        from optuna.trial import TrialState

        counted = self.counted()
        waiting = any(t.state == TrialState.WAITING for t in counted)
        if not waiting and len(counted) >= self.spec.target:
            return None
        trial = self.study.ask()
        self.beat(trial.number)
        return trial, {p.setting: decode(p, _suggest(trial, p)) for p in self.spec.policy.space}

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    def beat(self, number: int) -> None:
        self.storage.set_trial_system_attr(self.trial_id(number), HEARTBEAT, time.time())

    def fail_stale(self) -> None:
        """Fail each running trial whose heartbeat stopped; enqueue it again, once."""
        import optuna
        from optuna.trial import TrialState

        now = time.time()
        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            beat = trial.system_attrs.get(HEARTBEAT)
            began = trial.datetime_start
            last = beat if isinstance(beat, int | float) else began.timestamp() if began else now
            if now - last < self.spec.grace_s:
                continue
            again = RETRY_OF not in trial.user_attrs
            why = f"its worker stopped: no heartbeat for {now - last:.0f} s" + (
                "; retried as a new trial" if again else "; already a retry, not retried again"
            )
            trial_id = self.trial_id(trial.number)
            try:
                self.storage.set_trial_user_attr(trial_id, FAILED_BECAUSE, why)
                if again:
                    self.storage.set_trial_user_attr(trial_id, REPLACED, True)
                self.storage.set_trial_state_values(trial_id, state=TrialState.FAIL)
            except optuna.exceptions.UpdateFinishedTrialError:
                continue  # it ended meanwhile, or another worker failed it first
            self.on_trial(f"trial {trial.number} failed: {why}")
            if again:
                self.study.enqueue_trial(dict(trial.params), user_attrs={RETRY_OF: trial.number})

    def run(self, trial: "optuna.Trial", params: dict[str, Any]) -> None:
        from optuna.trial import TrialState

        retry = trial.user_attrs.get(RETRY_OF)
        stop, pruned, done = threading.Event(), threading.Event(), threading.Event()
        beating = threading.Thread(target=self.keep_beating, args=(trial.number, done), daemon=True)
        beating.start()

        def report(epoch: int, loss: float) -> bool:
            try:
                trial.report(loss, epoch)
                if trial.should_prune():
                    pruned.set()
                    stop.set()
            except Exception as error:  # a report must not stop the training
                log.warning(
                    "trial %d: epoch %d could not be reported: %s", trial.number, epoch, error
                )
            return stop.is_set()

        again = "" if retry is None else f" (a retry of trial {retry})"
        self.on_trial(f"trial {trial.number}{again} starts: {_params_line(params)}")
        started = time.monotonic()
        try:
            settings = trial_settings(self.configs, self.spec.start, params)
            value = self.runner(TrialStart(trial.number, settings, params, retry), report, stop)
        except Exception as error:  # recorded; the study goes on
            state, why = self.failed(trial, error, pruned.is_set())
            self.study.tell(trial, state=state)
            self.on_trial(f"trial {trial.number} {state.name.lower()}: {why}")
        else:
            if pruned.is_set():  # its launcher could not stop it early
                self.study.tell(trial, state=TrialState.PRUNED)
            else:
                self.study.tell(trial, value)
            seconds = time.monotonic() - started
            self.on_trial(f"trial {trial.number} finished in {seconds:.0f} s: {value:.5f}")
        finally:
            done.set()
            beating.join()
            with self.changed:
                self.ran += 1
                self.changed.notify_all()

    def failed(self, trial: "optuna.Trial", error: BaseException, pruned: bool) -> tuple[Any, str]:
        from optuna.trial import TrialState

        if pruned:
            last = max(
                self.storage.get_trial(self.trial_id(trial.number)).intermediate_values, default=0
            )
            return TrialState.PRUNED, f"stopped after epoch {last}: below the median of others"
        kind = "refused its settings" if isinstance(error, TrialRefused | ValueError) else "failed"
        why = f"the training {kind}: {error}"
        trial.set_user_attr(FAILED_BECAUSE, why[:500])
        return TrialState.FAIL, why

    def keep_beating(self, number: int, done: threading.Event) -> None:
        while not done.wait(self.spec.heartbeat_s):
            try:
                self.beat(number)
            except Exception as error:  # a missed beat: the next one comes
                log.warning("trial %d: heartbeat not recorded: %s", number, error)


def _suggest(trial: "optuna.Trial", param: Param) -> Any:
    if isinstance(param, FloatRange):
        return trial.suggest_float(param.setting, param.low, param.high, log=param.log)
    if isinstance(param, Choice):
        return trial.suggest_categorical(param.setting, [encode(c) for c in param.choices])
    return trial.suggest_int(param.setting, param.low, param.high, step=param.step)


def _params_line(params: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={_shown(v)}" for k, v in params.items())


def _plain(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _result(study: "optuna.Study", spec: StudySpec, ran: int, wall_s: float) -> StudyResult:
    from optuna.trial import TrialState

    rows = []
    for trial in study.get_trials(deepcopy=False):
        seconds = None
        if trial.datetime_complete is not None and trial.datetime_start is not None:
            seconds = (trial.datetime_complete - trial.datetime_start).total_seconds()
        params = {
            p.setting: decode(p, trial.params[p.setting])
            for p in spec.policy.space
            if p.setting in trial.params
        }
        note = str(trial.user_attrs.get(FAILED_BECAUSE, ""))
        if STARTING_ENTRY in trial.user_attrs:
            note = f"the settings of {trial.user_attrs[STARTING_ENTRY]!r}; {note}".strip("; ")
        if RETRY_OF in trial.user_attrs:
            note = f"retry of trial {trial.user_attrs[RETRY_OF]}; {note}".strip("; ")
        rows.append(
            TrialRow(
                trial.number,
                trial.state.name,
                trial.value if trial.state == TrialState.COMPLETE else None,
                params,
                len(trial.intermediate_values),
                seconds,
                note,
            )
        )
    complete = [r for r in rows if r.value is not None]
    best = min(complete, key=lambda r: (r.value, r.number)) if complete else None
    result = StudyResult(spec.name, spec.storage, spec.start, tuple(rows), best, ran, wall_s)
    return _with_plots(result, study)


def _with_plots(result: StudyResult, study: "optuna.Study") -> StudyResult:
    from ml import plots

    done = [(r.number, r.value) for r in result.trials if r.value is not None]
    history = plots.optimization_history(done) if done else b""
    if len(done) < 2:
        return replace(
            result,
            history_png=history,
            importances_missing=f"not computed: {len(done)} completed trial(s), 2 needed",
        )
    import optuna

    try:
        importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as error:
        return replace(result, history_png=history, importances_missing=f"not computed: {error}")
    return replace(
        result,
        history_png=history,
        importances=dict(importances),
        importances_png=plots.importances(dict(importances)),
    )


def best_entry(
    configs: Catalog, result: StudyResult, name: str, dagster_run: str = ""
) -> NamedConfig:
    """The study's best settings as catalog entry `name`: the starting entry's settings with the
    best trial's over them, its origin the study and the trial."""
    if result.best is None:
        raise SearchError(f"study {result.name!r} has no completed trial to save as {name!r}")
    start = configs.entry(result.start)
    training = {**dotted(start.training), **result.best.params}
    return NamedConfig(
        name=name,
        training=nested({k: list(v) if isinstance(v, tuple) else v for k, v in training.items()}),
        description=(
            f"The best trial of study {result.name!r}: trial {result.best.number}, validation"
            f" loss {result.best.value:.5f}; {result.start!r}'s settings with its values over them."
        ),
        origin={
            "study": result.name,
            "storage": storage_shown(result.storage),
            "trial": result.best.number,
            "validation_loss": result.best.value,
            "started_from": result.start,
            **({"dagster_run": dagster_run} if dagster_run else {}),
        },
    )
