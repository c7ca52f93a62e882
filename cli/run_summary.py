"""What `make run` says when it is done: each stage's outcome (`Summary`), never a placeholder,
and where its results are (`where_lines`)."""

import datetime as dt
import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from assets import asset_key
from cli.run_jobs import AssetRun, DayOutcome
from declare import UseCase
from pipelines.jobs import definition_name
from resources.mlflow_runs import LOCAL_DAGSTER_UI, LOCAL_MLFLOW_UI, ML_VIEW

UI = LOCAL_DAGSTER_UI
LOCATION = "ml-lifecycle"
"""The code location's name in the UI (workspace.yaml's `location_name`; a test holds them
equal): a stage's page is `<UI>/locations/<LOCATION>/asset-groups/<group>`."""
MLFLOW_UI = f"{LOCAL_MLFLOW_UI}/#/?{ML_VIEW}"
"""`make mlflow`'s UI, on its machine-learning view (MLflow 3 opens on GenAI otherwise)."""
BINARY_EVALUATION = ("test_roc_auc", "test_threshold")
REGRESSION_EVALUATION = ("test_rmse", "test_mae", "test_r2")
MULTICLASS_EVALUATION = ("test_macro_f1", "test_macro_roc_auc", "test_accuracy", "test_log_loss")
"""`model_evaluation` metadata the summary shows, by task."""


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
            *([f"    joined by {meta['engine']}"] if "engine" in meta else []),
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
                *(
                    [
                        f"    config:   {trained['config']} from the catalog, the run changed"
                        f" {trained.get('config_overridden', 'none')}"
                    ]
                    if trained.get("config")
                    else []
                ),
                f"    layout:   {trained.get('layout')}",
                f"    weights:  {weights}",
                f"    manifest: {weights.parent / 'manifest.json'}",
                f"    MLflow:   {trained.get('mlflow_run')} (after `make mlflow`)",
            ]
        evaluation = self.metadata(model, "model_evaluation")
        if evaluation:
            shown = {"binary": BINARY_EVALUATION, "multiclass": MULTICLASS_EVALUATION}.get(
                self.case.label.task, REGRESSION_EVALUATION
            )
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
    """The UI's page of one stage of `case` (its asset group): its assets as full cards."""
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
