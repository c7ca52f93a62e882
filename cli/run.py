"""`make run`: run one declared use case's lifecycle on its bundled data with the embedded
defaults, then say where the results are.

    python -m cli.run [--use-case NAME] [--start YYYY-MM-DD] [--end YYYY-MM-DD]

First the dimension tables and the Feast registry; then every day, the history lead-in (the days
the window's trailing features read back) and the window, ingested and validated in runs of a
range of days as a batched backfill takes them; then the window's feature tables in one run of
its days and its online store in another (each day recorded as its own partition); then a
training set over the window; then `train_model`: `trained_model` (torchrun workers launched
through Dagster Pipes), its evaluation against the champion and the gate, the ONNX export with
its parity check, and registration as champion if every gate passed; then the champion scores
the test days (`batch_predictions`). Every run is recorded in the local instance exactly as a run
launched from the UI would be, so `make dev` afterwards shows every run, materialization and
check result. Runs execute in this process: one process keeps GX, Feast and the bundled data
loaded instead of paying their start-up once per step.
"""

import argparse
import datetime as dt
import os
import shutil
import signal
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dagster as dg

from assets import asset_key
from assets.usecase import Trailing, UseCase
from cli.stops import STOP_FD, Stopped, Stops, exit_code, supervise_worker
from pipelines.jobs import RANGE_END_TAG, RANGE_START_TAG, definition_name
from resources.registry import LOCAL_DAGSTER_UI, LOCAL_MLFLOW_UI, ML_VIEW

# Step-by-step DEBUG events stay in the instance (and the UI); the terminal gets the summary.
QUIET = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
"""The tags of a run that takes a range of partitions (what a batched backfill launches)."""
UI = LOCAL_DAGSTER_UI
LOCATION = "ml-lifecycle"
"""The code location's name in the UI (workspace.yaml's `location_name`; a test holds them
equal): a stage's page is `<UI>/locations/<LOCATION>/asset-groups/<group>`."""
MLFLOW_UI = f"{LOCAL_MLFLOW_UI}/#/?{ML_VIEW}"
"""`make mlflow`'s UI, on its machine-learning view (MLflow 3 opens on GenAI otherwise)."""
BINARY_EVALUATION = ("test_roc_auc", "test_threshold")
REGRESSION_EVALUATION = ("test_rmse", "test_mae", "test_r2")
"""`model_evaluation` metadata the summary shows, by task."""


def run_tags() -> dict[str, str]:
    """Tags of every run this command starts: what launched it (the UI's runs list shows it
    beside Dagster's "Manually launched"), and the machine it runs on, by which the next
    `make run` (or the daemon) tells that a run left unfinished here was killed."""
    from pipelines.run_health import HOST_TAG, this_host
    from pipelines.schedules import TRIGGER_TAG

    return {TRIGGER_TAG: "make_run", HOST_TAG: this_host()}


def baseline_lines(case: UseCase, evaluation: dict) -> list[str]:
    """The declared baseline forecast beside the model, on the rows the baseline covers."""
    if case.baseline is None or "baseline_rows" not in evaluation:
        return []
    names = [
        n for n in ("rmse", "mae", "r2", "roc_auc", "log_loss") if f"baseline_{n}" in evaluation
    ]

    def figures(prefix: str) -> str:
        return ", ".join(f"{n} {_number(evaluation[f'{prefix}{n}'], '.3f')}" for n in names)

    return [
        f"    on the {evaluation['baseline_rows']} test rows the baseline {case.baseline} covers:"
        f" model {figures('model_on_baseline_rows_')}; baseline {figures('baseline_')}"
    ]


def choose_use_case(cases: Sequence[UseCase], name: str | None) -> UseCase:
    """The declared use case called `name`; the first declared when `name` is None."""
    if not cases:
        raise ValueError("no use case is declared")
    if name is None:
        return cases[0]
    for case in cases:
        if case.name == name:
            return case
    raise ValueError(f"no use case {name!r} is declared; use one of {[c.name for c in cases]}")


def default_window(case: UseCase) -> tuple[dt.date, dt.date]:
    """The first and last day of the training window `make run` trains on when not told: the
    use case's default window, else its last `window.days` days."""
    declared = case.window.default
    if declared:
        last = dt.date.fromisoformat(declared["end"]) - dt.timedelta(days=1)
        return dt.date.fromisoformat(declared["start"]), last
    last = dt.date.fromisoformat(case.partitions.end) - dt.timedelta(days=1)
    first = max(
        last - dt.timedelta(days=case.window.days - 1),
        dt.date.fromisoformat(case.partitions.start),
    )
    return first, last


def training_split(
    case: UseCase, start: dt.date | None = None, end: dt.date | None = None
) -> tuple[dict[str, str], str]:
    """The `training_set` config `make run` trains on, and where its dates come from: the
    declared `window.default` as it stands when no day is given, else the days [start, end]
    (the default window's where one is left out) split by `window.shares`."""
    declared = case.window.default
    if declared and start is None and end is None:
        return dict(declared), f"the split {case.name} declares (window.default)"
    first, last = default_window(case)
    start, end = start or first, end or last
    shares = "/".join(f"{share:.0%}" for share in case.window.shares)
    return case.window.config(start, end), f"{start}..{end} split {shares} (window.shares)"


def history_days(case: UseCase) -> int:
    """Days processed before the training window, so that the window's trailing feature inputs
    have their history (the longest any feature table reads back)."""
    return max(
        (
            source.days
            for spec in case.feature_tables
            for source in spec.inputs.values()
            if isinstance(source, Trailing)
        ),
        default=0,
    )


@dataclass
class DayOutcome:
    """What one partition's run did, for the summary."""

    partition: str
    success: bool
    rows: dict[str, int] = field(default_factory=dict)
    """Row count of each materialized asset, by its key (as the UI writes it)."""
    materialized: set[str] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    """Why the day was refused: failed checks and steps."""
    quarantines: list[str] = field(default_factory=list)
    """Which rules quarantined rows of a published day."""
    stopped: bool = False
    """Its run was stopped before the day was done (neither published nor refused)."""

    def merged(self, later: "DayOutcome") -> "DayOutcome":
        """This day's outcome together with that of a later run of it (its features)."""
        return DayOutcome(
            self.partition,
            self.success and later.success,
            {**self.rows, **later.rows},
            self.materialized | later.materialized,
            self.problems + later.problems,
            self.quarantines + later.quarantines,
            self.stopped or later.stopped,
        )


def published_stretches(
    days: Sequence[str], outcomes: Mapping[str, "DayOutcome"]
) -> list[list[str]]:
    """The unbroken runs of consecutive `days` whose outcome so far is a success."""
    stretches: list[list[str]] = [[]]
    for day in days:
        if outcomes[day].success:
            stretches[-1].append(day)
        elif stretches[-1]:
            stretches.append([])
    return [stretch for stretch in stretches if stretch]


def ensure_dagster_home(home: Path, instance_file: Path) -> Path:
    """DAGSTER_HOME (default `<home>/dagster_home`) with the profile's instance file in it."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instance_file, dagster_home / "dagster.yaml")
    return dagster_home


def execute(
    job: dg.JobDefinition, instance: dg.DagsterInstance, stops: Stops | None, **kwargs: Any
) -> dg.ExecuteInProcessResult:
    """One run of `job` in this process (`execute_in_process`'s `kwargs`); under `stops`, a
    stop ends it CANCELED and no run starts after one (`Stopped`)."""

    def run(run_id: str | None = None) -> dg.ExecuteInProcessResult:
        return job.execute_in_process(
            instance=instance, raise_on_error=False, run_id=run_id, **kwargs
        )

    return run() if stops is None else stops.run(job.name, run)


def run_days(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    partitions: Sequence[str],
    stops: Stops | None = None,
) -> dict[str, DayOutcome]:
    """One run of `job` over the consecutive `partitions`, as a batched backfill takes them:
    each day keeps its own materializations and check results, and a refused day refuses only
    itself."""
    result = execute(
        job,
        instance,
        stops,
        run_config=QUIET,
        tags={**run_tags(), RANGE_START_TAG: partitions[0], RANGE_END_TAG: partitions[-1]},
    )
    return day_outcomes(result, partitions)


def canceled(result: dg.ExecuteInProcessResult) -> bool:
    """Whether the run was stopped (it ended CANCELED)."""
    return any(event.event_type == dg.DagsterEventType.RUN_CANCELED for event in result.all_events)


def day_outcomes(
    result: dg.ExecuteInProcessResult, partitions: Sequence[str]
) -> dict[str, DayOutcome]:
    """What a run of `partitions` did to each of them. A day succeeded when none of its checks
    failed and every asset the job selects for it was materialized (a ranged step that refused a
    day fails as a whole, having published the others); in a stopped run, a day that is neither
    is stopped, not refused."""
    outcomes = {day: DayOutcome(partition=day, success=True) for day in partitions}
    single = partitions[0] if len(partitions) == 1 else None
    failed_steps = []
    for event in result.all_events:
        if event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            outcome = outcomes[materialization.partition or single or ""]
            outcome.materialized.add(materialization.asset_key.to_user_string())
            rows = materialization.metadata.get("dagster/row_count")
            if isinstance(rows, dg.IntMetadataValue) and rows.value is not None:
                outcome.rows[materialization.asset_key.to_user_string()] = rows.value
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            outcome = outcomes[evaluation.partition or single or ""]
            quarantined = evaluation.metadata.get("quarantined_rows")
            if not evaluation.passed:
                outcome.success = False
                outcome.problems.append(evaluation.description or evaluation.check_name)
            elif isinstance(quarantined, dg.IntMetadataValue) and quarantined.value:
                outcome.quarantines.append(evaluation.description or evaluation.check_name)
        elif event.is_step_failure:
            error = event.step_failure_data.error
            failed_steps.append(
                f"step {event.step_key} failed: {error.message.strip() if error else 'unknown'}"
            )
    selected = {key.to_user_string() for key in result.job_def.asset_layer.selected_asset_keys}
    stopped = canceled(result)
    for outcome in outcomes.values():
        if stopped:
            # Published before the stop, refused by its checks, or else interrupted.
            if outcome.success and not selected <= outcome.materialized:
                outcome.success, outcome.stopped = False, True
        elif single is not None:
            outcome.success = result.success
            outcome.problems += failed_steps
        elif outcome.success and not selected <= outcome.materialized:
            # No check refused it, yet it is not published: a step failed before reaching it.
            outcome.success = False
            outcome.problems += failed_steps or ["not materialized"]
    return outcomes


@dataclass
class AssetRun:
    """What a run of assets produced, for the summary."""

    success: bool
    window: str
    """The training window or the partition it ran on."""
    assets: dict[str, dict[str, object]] = field(default_factory=dict)
    """Metadata of each materialized asset, by its key (as the UI writes it)."""
    checks: list[tuple[str, bool, str]] = field(default_factory=list)
    """(check, passed, description) of every asset check that ran."""
    problem: str = ""
    stopped: str = ""
    """The step a stop interrupted (the run ended CANCELED); empty when not stopped."""
    ran: bool = True
    """False for a run that never started (an earlier step failed, or the command stopped)."""


def run_assets(
    job: dg.JobDefinition,
    instance: dg.DagsterInstance,
    window: str = "",
    ops: Mapping[str, object] | None = None,
    partition: str | None = None,
    stops: Stops | None = None,
) -> AssetRun:
    """One run of `job` (of `partition`, with the `ops` config), in this process."""
    result = execute(
        job,
        instance,
        stops,
        partition_key=partition,
        run_config={**QUIET, "ops": dict(ops or {})},
        tags=run_tags(),
    )
    outcome = AssetRun(result.success, window)
    stopped = canceled(result)
    for event in result.all_events:
        if event.is_step_materialization:
            materialization = event.step_materialization_data.materialization
            outcome.assets[materialization.asset_key.to_user_string()] = {
                key: getattr(v, "value", v) for key, v in materialization.metadata.items()
            }
        elif event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
            evaluation = event.asset_check_evaluation_data
            outcome.checks.append(
                (evaluation.check_name, evaluation.passed, evaluation.description or "")
            )
        elif event.is_step_failure and event.step_failure_data.error:
            outcome.problem = event.step_failure_data.error.message.strip()
            if stopped:
                outcome.stopped = event.step_key or job.name
    if stopped and not outcome.stopped:
        outcome.stopped = "between its steps"
    return outcome


@dataclass(frozen=True)
class Stop:
    """The signal that stopped `make run`, and the job whose run it stopped (empty: between
    runs)."""

    signum: int
    job: str = ""

    def __str__(self) -> str:
        during = f" during a run of {self.job}" if self.job else " between runs"
        return f"STOPPED by {signal.Signals(self.signum).name}{during}"


@dataclass
class Summary:
    """What `make run` did for one use case, as the terminal shows it: never a placeholder; what
    did not happen says so and why."""

    case: UseCase
    days: list[DayOutcome]
    training: AssetRun
    model: AssetRun
    scored: dict[str, AssetRun]
    """The `score_day` run of each test day."""
    seconds: float
    ahead: dict[str, AssetRun] = field(default_factory=dict)
    """The `predict_day` run of the day after the window (a use case that predicts ahead)."""
    planned: Sequence[str] = ()
    """Every day the command was to process (default: those of `days`)."""
    to_score: Sequence[str] = ()
    """The test days the command was to score (default: those of `scored`)."""
    stop: Stop | None = None
    split: str = ""
    """Where the training set's days begin each part, and where those dates came from."""

    def metadata(self, run: AssetRun, asset: str) -> dict[str, object] | None:
        """The metadata of `asset` (the use case's asset of that name) that `run` materialized."""
        return run.assets.get(asset_key(self.case, asset).to_user_string())

    def total(self, asset: str) -> int:
        """The rows of `asset` over every day."""
        name = asset_key(self.case, asset).to_user_string()
        return sum(day.rows.get(name, 0) for day in self.days)

    def lines(self) -> list[str]:
        return [
            *self.day_lines(),
            *self.training_lines(),
            *self.model_lines(),
            *self.scoring_lines(),
            *self.ahead_lines(),
        ]

    def day_lines(self) -> list[str]:
        case = self.case
        published = sum(day.success for day in self.days)
        stopped = [day.partition for day in self.days if day.stopped]
        refused = len(self.days) - published - len(stopped)
        planned = len(self.planned) or len(self.days)
        online = asset_key(case, "online_features").to_user_string()
        if self.stop is None:
            head = (
                f"Ran {len(self.days)} day(s) of {case.name}, a training set, training, the gates"
                f" and scoring in {self.seconds:.1f} s: {published} day(s) published,"
                f" {refused} refused."
            )
        else:
            head = (
                f"{self.stop} after {self.seconds:.1f} s; of {planned} day(s) of {case.name}:"
                f" {published} published, {refused} refused, {len(stopped)} interrupted,"
                f" {planned - len(self.days)} not started. The next `make run` takes up the rest."
            )
        lines = [
            head,
            *(
                f"  {t}: {self.total(f'raw_{t}')} received, {self.total(f'validated_{t}')}"
                f" published, {self.total(f'quarantined_{t}')} quarantined"
                for t in (table.name for table in case.event_tables)
            ),
            "  features: "
            + ", ".join(f"{s.name} {self.total(s.name)} rows" for s in case.feature_tables),
            f"  online store: {sum(online in day.materialized for day in self.days)} day(s)"
            " materialized",
        ]
        if stopped:
            lines.append(
                f"  interrupted (partly written; redone by the next run): {_days(stopped)}"
            )
        for day in self.days:
            for line in day.quarantines + day.problems:
                lines.append("  " + line.replace("\n", "\n  "))
        return lines

    def not_run(self, what: str, run: AssetRun, before: AssetRun | None = None) -> str:
        """Why `what` (whose run is `run`) did not happen, `before` being the run it needed."""
        if run.stopped:
            return f"  {what}: STOPPED during {run.stopped} (its run CANCELED)"
        if self.stop is not None and not run.ran:
            return f"  {what}: not run (stopped before it)"
        if before is not None and before.stopped:
            return f"  {what}: not run (stopped before it)"
        if before is not None and not before.success:
            return f"  {what}: not run (the step before it failed)"
        return f"  {what}: FAILED: {run.problem or 'see `make dev` → Runs'}"

    def training_lines(self) -> list[str]:
        case, training = self.case, self.training
        label = case.label
        meta = self.metadata(training, "training_set")
        if not training.success or meta is None:
            lines = [self.not_run(f"training set {training.window}", training)]
            refused = [d.partition for d in self.days if not d.success and not d.stopped]
            if training.ran and not training.stopped and refused:
                # A step reading a table of those days finds none: say which days to look at.
                lines.append(
                    f"    {len(refused)} day(s) were refused, so their tables were not published"
                    f" for it to read: {', '.join(refused)} (why: above)"
                )
            return lines
        parts = []
        for part in ("train", "validation", "test"):
            rate = meta.get(f"positive_rate_{part}")
            positive = f" ({_percent(rate)} positive)" if label.task == "binary" else ""
            parts.append(f"{part} {meta.get(f'rows_{part}')} rows{positive}")
        return [
            f"  training set {training.window}: {', '.join(parts)}",
            *([f"    split: {self.split}"] if self.split else []),
            f"    {case.registered_model} predicts {label.column} of {label.view} ({label.task})"
            f" from {meta.get('features')} features of {meta.get('feature_service')};"
            f" {meta.get('unlabelled_rows_left_out')} rows without a label left out;"
            f" fingerprint {str(meta.get('dataset_fingerprint'))[:12]}",
        ]

    def model_lines(self) -> list[str]:
        model, lines = self.model, []
        if not model.ran or model.stopped:
            lines.append(self.not_run("training", model, self.training))
            if model.stopped:
                lines.append(
                    "    the next `make run` resumes it from its last committed checkpoint"
                )
        if trained := self.metadata(model, "trained_model"):
            weights = Path(str(trained.get("weights")))
            lines += [
                f"  model: {trained.get('world_size')} process(es), {trained.get('precision')},"
                f" best epoch {trained.get('best_epoch')} of {trained.get('epochs')},"
                f" {_number(trained.get('samples_per_s'), '.0f')} samples/s",
                f"    layout:   {trained.get('layout')}",
                f"    weights:  {weights}",
                f"    manifest: {weights.parent / 'manifest.json'}",
                f"    MLflow:   {trained.get('mlflow_run')} (after `make mlflow`)",
            ]
        evaluation = self.metadata(model, "model_evaluation")
        if evaluation:
            shown = BINARY_EVALUATION if self.case.label.task == "binary" else REGRESSION_EVALUATION
            metrics = "".join(
                f", {key} {_number(evaluation[key], '.4f')}" for key in shown if key in evaluation
            )
            lines += [
                f"  evaluation on {evaluation.get('test_rows')} test rows{metrics};"
                f" against champion: {evaluation.get('champion')}",
                "    " + str(evaluation.get("comparison", "")).replace("\n", "\n    "),
                *baseline_lines(self.case, evaluation),
                f"  gate: {str(evaluation.get('decision')).upper()}: {evaluation.get('reasons')}",
                *(
                    f"    [{'pass' if passed else 'FAIL'}] {name}: {description}"
                    for name, passed, description in model.checks
                ),
            ]
        if exported := self.metadata(model, "onnx_model"):
            lines.append(
                f"  ONNX:     {exported.get('path')} (sha256 {str(exported.get('sha256'))[:12]})"
            )
        registered = self.metadata(model, "registered_model")
        if registered and registered.get("unchanged"):
            lines.append(
                f"  registered: nothing new; {registered.get('model')}: {registered['unchanged']}"
            )
        elif registered:
            lines += [
                f"  registered: {registered.get('model')}, now champion"
                f" (before: {registered.get('champion_before')})",
                f"    MLflow:   {registered.get('mlflow_model_version')}",
            ]
        elif evaluation:
            lines.append(f"  registered: nothing; {self.case.registered_model}'s champion stays")
        if model.ran and not model.success and not model.stopped:
            lines.append(f"  training/deployment FAILED: {model.problem or 'see `make dev`'}")
        return lines

    def why_not_scored(self) -> str:
        """Why a scoring run that succeeded made no predictions: there was no champion, and
        what this command's training did about it."""
        model = self.model
        evaluation = self.metadata(model, "model_evaluation") or {}
        if model.stopped or not model.ran:
            because = "training was stopped" if self.stop else "training did not run"
        elif decision := evaluation.get("decision"):
            because = f"the gate's decision: {decision}: {evaluation.get('reasons')}"
        elif not model.success:
            because = f"training failed: {model.problem or 'see `make dev`'}"
        else:
            because = "no model was registered"
        return f"not scored: no champion of {self.case.registered_model}; {because}"

    def scoring_lines(self) -> list[str]:
        sensor = definition_name(self.case, "drift_retrain")
        decay = definition_name(self.case, "decay_retrain")
        lines = []
        unscored = [day for day in self.to_score if day not in self.scored]
        if unscored:
            never = AssetRun(False, "", ran=False)
            lines.append(self.not_run(f"predictions {_days(unscored)}", never, self.model))
        for day, outcome in self.scored.items():
            meta = self.metadata(outcome, "batch_predictions")
            if outcome.stopped or not outcome.success:
                lines.append(self.not_run(f"predictions {day}", outcome))
            elif meta is None:
                lines.append(f"  predictions {day}: {self.why_not_scored()}")
            else:
                mean = ""
                if self.case.label.task == "binary" and "mean_probability" in meta:
                    mean = f", mean probability {_number(meta['mean_probability'], '.3f')}"
                lines.append(
                    f"  predictions {day}: {meta.get('dagster/row_count')} rows"
                    f" by {meta.get('model')}{mean},"
                    f" {meta.get('rows_with_missing_features')} with missing features"
                    f" → {meta.get('path')}"
                )
            if drift := self.metadata(outcome, "feature_drift"):
                failed = drift.get("failed_features")  # a count
                event = (
                    f"a DRIFT EVENT (the {sensor} sensor requests a retrain)"
                    if drift.get("drift_event")
                    else "no drift event"
                )
                lines.append(
                    f"  drift {day}: window {drift.get('window')}: score PSI"
                    f" {_number(drift.get('score_psi'), '.3f')}, {event};"
                    f" {failed if isinstance(failed, int) else '?'} features past their"
                    f" fail line (check: {drift.get('level')})"
                )
            if real := self.metadata(outcome, "realized_performance"):
                metric = real.get("metric")
                found = real.get(f"window_{metric}_interval")
                interval = found if isinstance(found, list) and len(found) == 2 else [None, None]
                window = _measured(real, "window", interval)
                lines.append(
                    f"  realized {day}: {_measured(real, 'day')}; window {real.get('window')}:"
                    f" {window} vs {_number(real.get('tested'), '.3f')}"
                    f" tested: {real.get('verdict')}{_why_not_judged(real)}"
                    + (
                        f", a DECAY EVENT (the {decay} sensor requests a retrain)"
                        if real.get("decay_event")
                        else ""
                    )
                )
        return lines

    def ahead_lines(self) -> list[str]:
        case, lines = self.case, []
        for day, outcome in self.ahead.items():
            meta = self.metadata(outcome, "batch_predictions")
            if outcome.stopped or not outcome.success:
                lines.append(self.not_run(f"next day {day}: prediction", outcome))
                continue
            if meta is None:
                lines.append(f"  next day {day}: {self.why_not_scored()}")
                continue
            lines.append(
                f"  next day {day}: predicted before it, from {', '.join(case.ahead_tables)}"
                f" and the days before: {meta.get('dagster/row_count')} rows by"
                f" {meta.get('model')} → {meta.get('path')}"
            )
        return lines


def stage_link(case: UseCase, stage: str) -> str:
    """The UI's page of one stage of `case` (its asset group), drawn in full."""
    return f"{UI}/locations/{LOCATION}/asset-groups/{case.group(stage)}"


def where_lines(case: UseCase, home: Path) -> list[str]:
    """Where `make run` left its results, and where to look at them."""
    lake = home / "lake"

    def folder(asset: str) -> Path:  # the lake's layout: a folder per asset key
        return lake.joinpath(*asset_key(case, asset).path)

    def name(base: str) -> str:
        return definition_name(case, base)

    last = dt.date.fromisoformat(case.partitions.end) - dt.timedelta(days=1)
    return [
        f"Results (all under {home}):",
        f"  lake (Parquet, one file per asset partition): {lake}",
        f"  training set:                                 {folder('training_set')}",
        f"  models (weights, manifest, ONNX, gate report): {home / 'models'}",
        f"  predictions (Parquet, one file per day):      {folder('batch_predictions')}",
        f"  MLflow runs (SQLite) and artifacts:           {home / 'mlflow'}",
        f"  Feast registry and online store (SQLite):     {home / 'feast'}",
        f"  GX Data Docs:                                 {home / 'gx' / 'data_docs'}",
        f"  Dagster runs and events (SQLite):             {os.environ.get('DAGSTER_HOME')}",
        f"  the champion's lineage, back to raw days:     make lineage"
        f' ARGS="model --use-case {case.name}"',
        "",
        f"Open the UI: `make dev`, then {UI}. There you find:",
        f"  the lifecycle a stage at a time, e.g. its features: {stage_link(case, 'features')}",
        "    each asset drawn with its state, linked to the stages before and after it;",
        "    Lineage in the sidebar has every stage as a box, opened from the list on its left;",
        "    an asset's page shows its partitions, metadata (row counts, metrics, plots) and",
        "    check results (contracts, gate, ONNX parity, drift, realized performance).",
        "  Runs: every run this command made, step by step, with logs.",
        f"  Automation: {name('nightly_daily_partition')}, {name('nightly_retrain')}, the"
        f" {name('drift_retrain')}, {name('decay_retrain')}"
        + (f" and {name('predict_next_day')}" if case.predicts_ahead else "")
        + " sensors",
        "    (off until you switch them on; `make dev` runs the daemon that acts on them).",
        f"  Jobs → {name('daily_partition')} → Materialize / Backfill: any day or range from"
        f" {case.partitions.start} to {last};",
        f"    {name('retrain')}: train now; {name('rollback_champion_job')}: move the champion"
        " back.",
        f"MLflow: `make mlflow`, then {MLFLOW_UI} (runs, Models → {case.registered_model}).",
    ]


def _measured(realized: Mapping[str, object], scope: str, interval: list | None = None) -> str:
    """The `day` or `window` figure of a `realized_performance` materialization, with its
    interval when given; "too few rows" below the declared minimum, never a placeholder."""
    metric, rows = realized.get("metric"), realized.get(f"{scope}_rows")
    least, value = realized.get("min_rows"), realized.get(f"{scope}_{metric}")
    if isinstance(rows, int) and isinstance(least, int) and rows < least:
        return f"{metric}: too few rows ({rows} < {least})"
    if value is None:
        return f"{metric} not measurable on {rows} rows"
    spread = ""
    if interval and None not in interval:
        spread = f" [{_number(interval[0], '.3f')}, {_number(interval[1], '.3f')}]"
    return f"{metric} {_number(value, '.3f')}{spread} on {rows} rows"


def _days(days: Sequence[str]) -> str:
    """Days as a reader takes them in: one, or the first and last of several, with the count."""
    if len(days) == 1:
        return days[0]
    return f"{days[0]} .. {days[-1]} ({len(days)} days)"


def _why_not_judged(realized: Mapping[str, object]) -> str:
    """Why a realized window was not judged (its reason up to the figures), or nothing."""
    if realized.get("verdict") != "not_judged":
        return ""
    return f" ({str(realized.get('reason', '')).split(':')[0]})"


def _number(value: object, spec: str) -> str:
    return "n/a" if value is None else format(float(str(value)), spec)


def _percent(rate: object) -> str:
    return f"{rate:.1%}" if isinstance(rate, float) else "n/a"


def _day(text: str) -> dt.date:
    """A `--start`/`--end` value: a YYYY-MM-DD day, or a clean usage error naming it."""
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YYYY-MM-DD day") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a use case's lifecycle on its bundled data.")
    parser.add_argument(
        "--use-case", metavar="NAME", help="the declared use case to run (default: the first)"
    )
    parser.add_argument(
        "--start",
        type=_day,
        help="first day of the training set (YYYY-MM-DD; default: the use case's default window);"
        " the days its trailing features read back are processed too",
    )
    parser.add_argument("--end", type=_day, help="last day, inclusive (YYYY-MM-DD)")
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="torchrun workers (DDP over gloo); 0 lets the launcher measure the fastest layout",
    )
    args = parser.parse_args(argv)
    if STOP_FD not in os.environ:  # the command itself: the work runs in a worker it can stop
        return supervise_worker("cli.run", sys.argv[1:] if argv is None else argv)
    if args.processes:  # read when the definitions are built, below
        os.environ["ML_LIFECYCLE_TRAIN_PROCESSES"] = str(args.processes)

    # Feast installs a DeprecationWarning filter of its own when imported, ahead of any set
    # before; importing it first lets the filter below hold. The warning is pydantic 2's about
    # dagster-shared's v1-style attribute access: not ours to change.
    import feast  # noqa: F401

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    from pipelines.definitions import USE_CASES, defs, environment, instance_file, local_home
    from pipelines.run_health import release_dead_runs

    try:
        case = choose_use_case(USE_CASES, args.use_case)
    except ValueError as error:
        parser.error(str(error))
    try:
        window, split_from = training_split(case, args.start, args.end)
    except ValueError as error:
        parser.error(f"{error} (train/validation/test)")
    start = dt.date.fromisoformat(window["start"])
    end = dt.date.fromisoformat(window["end"]) - dt.timedelta(days=1)
    first = start - dt.timedelta(days=history_days(case))
    partitions = [
        key
        for key in case.partitions.definition().get_partition_keys()
        if first <= dt.date.fromisoformat(key) <= end
    ]
    if not partitions:
        parser.error(f"no partitions of {case.name} between {first} and {end}")

    def job(base: str) -> dg.JobDefinition:
        return defs.resolve_job_def(definition_name(case, base))

    home = local_home()
    ensure_dagster_home(home, instance_file(environment()))
    began = time.perf_counter()
    outcomes: dict[str, DayOutcome] = {}
    training = AssetRun(False, f"[{window['start']}, {window['end']})", ran=False)
    split = (
        f"validation from {window['validation_start']}, test from {window['test_start']};"
        f" {split_from}"
    )
    model = AssetRun(False, "", ran=False)
    scored: dict[str, AssetRun] = {}
    ahead: dict[str, AssetRun] = {}
    with dg.DagsterInstance.get() as instance, Stops(instance) as stops:
        try:
            # A run an earlier, killed `make run` left unfinished would hold its pool slots.
            for released in release_dead_runs(instance):
                print(f"run {released.run_id} ({released.job_name}): {released.reason}", flush=True)
            setups = [("apply_feature_registry", "Applying the Feast registry")]
            if case.dimensions:
                setups.insert(0, ("load_dimensions", "Loading the dimension tables"))
            for setup, what in setups:
                if not run_assets(job(setup), instance, stops=stops).success:
                    stops.check()
                    print(f"{what} failed; see `make dev` → Runs.", file=sys.stderr)
                    return 1
            # Every day is ingested and validated first, a backfill run's worth of days at a
            # time (GX imported and each source read once); then the window's published days
            # get their feature tables and online store in one run of each unbroken stretch. The
            # lead-in days only feed the window's trailing features: their own would need a
            # lead-in of their own.
            ingest, per_run = job("ingest_and_validate"), case.partitions.days_per_run
            for at in range(0, len(partitions), per_run):
                outcomes |= run_days(ingest, instance, partitions[at : at + per_run], stops)
            stops.check()
            lead_in = len([p for p in partitions if dt.date.fromisoformat(p) < start])
            window_days = partitions[lead_in:]
            for stretch in published_stretches(window_days, outcomes):
                for step in ("build_features", "write_online_store"):
                    for day, done in run_days(job(step), instance, stretch, stops).items():
                        outcomes[day] = outcomes[day].merged(done)
                    stretch = [day for day in stretch if outcomes[day].success]
                    if not stretch:
                        break
            stops.check()
            for partition, outcome in outcomes.items():
                status = "published" if outcome.success else "REFUSED"
                lead = " (history lead-in)" if partition not in window_days else ""
                print(f"{partition}: {status}{lead}", flush=True)
            training = run_assets(
                job("build_training_set"),
                instance,
                training.window,
                ops={asset_key(case, "training_set").to_python_identifier(): {"config": window}},
                stops=stops,
            )
            following = (end + dt.timedelta(days=1)).isoformat()
            if training.success:
                model = run_assets(job("train_model"), instance, stops=stops)
                # The test days: the champion (new, or kept when the gate refused) scores them.
                scoring = job("score_day")
                for day in partitions:
                    if day >= window["test_start"]:
                        scored[day] = run_assets(scoring, instance, day, partition=day, stops=stops)
                # The day after: predicted as the nightly run would, before any of it is known.
                if case.predicts_ahead and following <= str(
                    case.partitions.definition().get_last_partition_key()
                ):
                    ahead[following] = run_assets(
                        job("predict_day"), instance, following, partition=following, stops=stops
                    )
            stops.check()
        except Stopped:
            pass
    test_days = [day for day in partitions if day >= window["test_start"]]
    summary = Summary(
        case,
        list(outcomes.values()),
        training,
        model,
        scored,
        time.perf_counter() - began,
        ahead,
        planned=partitions,
        to_score=test_days,
        stop=Stop(stops.signum, stops.stage) if stops.signum is not None else None,
        split=split,
    )
    print()
    print("\n".join(summary.lines()))
    print()
    print("\n".join(where_lines(case, home)))
    if stops.signum is not None:
        return exit_code(stops.signum)
    scoring_ok = bool(scored) and all(s.success for s in [*scored.values(), *ahead.values()])
    return 0 if training.success and model.success and scoring_ok else 1


if __name__ == "__main__":
    sys.exit(main())
