"""Monitoring: `feature_drift`, how far the days up to a partition have moved from what the
champion was trained on, per feature and for its score.

The comparison covers a trailing window of days (a single day's conditions and calendar are too
narrow to stand for a season), scored by the champion itself, against the drift reference that
was registered with it: training rows with the served file's scores. A drift event (the score
fails its thresholds) is recorded in the materialization's metadata, where the `drift_retrain`
sensor reads it. The logic is in `ml/drift.py`.
"""

import dataclasses
import datetime as dt
import json
import math
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import Field

from assets import EXTERNAL_RETRY, asset_key, daily_partitions, figure, markdown_image
from assets.config import config_class
from assets.pods import EVALUATION as EVALUATION_POD
from declare import DecayPolicy, DriftSettings, UseCase
from resources.feature_store import FeastFeatureStore
from resources.lake import LakeFiles, ParquetLake, write_text_atomically
from resources.serving import DATA_THROUGH_TAG, ModelServing

if TYPE_CHECKING:
    import pandas as pd

MONITORING = "monitoring"
DRIFT_CHECK = "drift_within_thresholds"
DRIFT_EVENT = "drift_event"
"""Metadata key of `feature_drift` materializations: true when the window drifted."""
REALIZED_CHECK = "realized_within_tested"
DECAY_EVENT = "decay_event"
"""Metadata key of `realized_performance` materializations: true when the window's realized
figure is worse than the model's tested one by more than the configured drop."""
CHAMPION_VERSION = "champion_version"
"""Metadata key: the model version judged: whose reference the window was compared with
(`feature_drift`), or which made the predictions (`realized_performance`)."""
CHAMPION_DATA_THROUGH = "champion_data_through"
"""Metadata key: the last day of that version's training data ("" when not recorded)."""


DECLARED_ONLY = ("rule", "warn_at", "fail_at", "calendar")
"""Drift settings that are not the launchpad's: the rule sets a model's measured lines when it is
exported, and which features are calendar ones is the use case's to say."""


def drift_config(case: UseCase) -> type[dg.Config]:
    """`feature_drift`'s config for a use case: the window compared and the lines that make a
    column warn or fail (`declare.DriftSettings`, the use case's as defaults)."""
    chunk_rows = Field(default=50_000, description="Entity rows per feature retrieval.")
    return config_class(
        DriftSettings,
        f"FeatureDriftConfig_{case.name}",
        case.drift,
        skip=DECLARED_ONLY,
        extra={"chunk_rows": (int, chunk_rows)},
    )


def _drift_settings(case: UseCase, config: dg.Config) -> DriftSettings:
    """The drift settings a run's config gives; refused by field if wrong."""
    chosen = config.model_dump(exclude={"chunk_rows"})
    settings = dataclasses.replace(case.drift, **chosen)
    if (problem := settings.problem()) is not None:
        raise dg.Failure(f"feature_drift: config {problem[0]}: {problem[1]}", allow_retries=False)
    return settings


def monitoring_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    return [_feature_drift(case), _realized_performance(case)]


def _monitor(
    case: UseCase,
    name: str,
    deps: list[dg.AssetKey],
    kinds: set[str],
    description: str,
    check: dg.AssetCheckSpec,
):
    """The decorator of a daily monitoring asset and its check. Before the first champion, or on
    a day nobody predicted, there is nothing to measure: the step says so and records neither
    the asset nor its check (a check that ran on nothing would read as passed). Dagster makes a
    check's output optional only in a subsettable multi-asset, hence this form."""
    return dg.multi_asset(
        name=asset_key(case, name).to_python_identifier(),
        specs=[
            dg.AssetSpec(
                asset_key(case, name),
                deps=deps,
                description=description,
                group_name=case.group(MONITORING),
                kinds=kinds,
                code_version="1",
                skippable=True,
            )
        ],
        check_specs=[check],
        can_subset=True,
        partitions_def=daily_partitions(case),
        retry_policy=EXTERNAL_RETRY,
        op_tags=EVALUATION_POD,
    )


def _feature_drift(case: UseCase) -> dg.AssetsDefinition:
    model_name, entity_view = case.registered_model, case.label.view
    config_class = drift_config(case)

    @_monitor(
        case,
        "feature_drift",
        # The window it measures ends with the day's rows: in the day's run it comes after the
        # day's features are published (the online store, written after every feature table);
        # in a run of a range, where those steps are skipped, it is skipped with them.
        deps=[asset_key(case, "batch_predictions"), asset_key(case, "online_features")],
        kinds={"pandas", "onnx", "feast"},
        description=(
            "PSI and Kolmogorov-Smirnov of the window's features and champion scores vs its"
            " training reference; a table and a plot in metadata."
        ),
        check=dg.AssetCheckSpec(
            DRIFT_CHECK,
            asset=asset_key(case, "feature_drift"),
            description=(
                "Warns when features drift past their thresholds; fails when the champion's"
                " score drifts (a drift event: the drift_retrain sensor requests a retrain)."
            ),
        ),
    )
    def feature_drift(
        context: dg.AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        feature_store: FeastFeatureStore,
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        import pandas as pd

        from ml.dataset import as_predicted
        from ml.drift import SCORE, DriftThresholds, compare
        from ml.plots import drift_bars
        from ml.score import feature_chunks

        day = context.partition_key
        settings = _drift_settings(case, config)
        served = serving.champion(model_name)
        if served is None:
            context.log.info(f"feature_drift {day}: no champion of {model_name} yet; skipped")
            return
        reference = pd.read_parquet(serving.drift_reference(served.version))
        window = context.partition_time_window
        start = window.end - dt.timedelta(days=settings.window_days)
        service = served.scorer.properties["feature_service"]
        feature_store = feature_store.for_use_case(case.name)
        rows = feature_store.view_rows(
            entity_view, start.astimezone(dt.UTC), window.end.astimezone(dt.UTC)
        )
        keys = [*feature_store.join_keys(service), "event_timestamp"]
        # Predicted at the day's start, from what was known then (as the model was trained).
        entities = (
            as_predicted(rows[keys], case.prediction.at, case.timezone)
            .sort_values(keys)
            .reset_index(drop=True)
        )
        frames = [
            chunk.assign(**{SCORE: served.scorer.predict(chunk)})
            for chunk in feature_chunks(feature_store, entities, service, config.chunk_rows)
        ]
        current = pd.concat(frames, ignore_index=True) if frames else reference.iloc[:0]
        thresholds = DriftThresholds(
            psi_warn=settings.psi_warn,
            psi_fail=settings.psi_fail,
            ks_warn=settings.ks_warn,
            ks_fail=settings.ks_fail,
            min_rows=settings.min_rows,
            calendar=settings.calendar,
        )
        measured = serving.drift_lines(served.version) if settings.lines == "natural" else None
        if measured is not None:
            thresholds = thresholds.with_columns(measured.columns)
            lines = measured.describe()
        elif settings.lines == "natural":
            lines = f"absolute: {served.label} was registered without measured lines"
        else:
            lines = "absolute, as configured"
        unserved = sorted(set(case.drift.calendar) - set(served.scorer.features))
        if unserved:
            context.log.warning(
                f"feature_drift {day}: calendar column(s) {unserved} (drift.calendar) are no"
                f" features of {served.label}"
            )
        report = compare(
            reference,
            current,
            served.scorer.numeric_features,
            served.scorer.categorical_features,
            thresholds,
        )
        days_with_rows = (
            int(current["event_timestamp"].dt.tz_convert(window.start.tzinfo).dt.date.nunique())
            if len(current)
            else 0
        )
        span = f"[{start.date()}, {window.end.date()})"
        document = {
            "partition": day,
            "window": span,
            "days_with_rows": days_with_rows,
            "model": served.label,
            "lines": lines,
            **report.to_dict(),
        }
        path = lake_files.path_for(context.asset_key, day).with_suffix(".json")
        write_text_atomically(json.dumps(document, indent=2), path, lake_files.file_mode)

        level = report.level
        yield dg.AssetCheckResult(
            check_name=DRIFT_CHECK,
            passed=level == "ok",
            severity=dg.AssetCheckSeverity.ERROR if level == "fail" else dg.AssetCheckSeverity.WARN,
            description=f"{day}, window {span}: {report.summary()}",
            metadata={
                "score_psi": figure(report.score.psi if report.score else None),
                "failed_features": len(report.failed),
            },
        )
        metadata: dict[str, Any] = {
            DRIFT_EVENT: report.drift_event,
            CHAMPION_VERSION: served.version.version,
            CHAMPION_DATA_THROUGH: served.version.tags.get(DATA_THROUGH_TAG, ""),
            "level": level,
            "window": span,
            "days_with_rows": f"{days_with_rows} of {settings.window_days}",
            "rows": report.current_rows,
            "reference_rows": report.reference_rows,
            "score_psi": figure(report.score.psi if report.score else None),
            "score_ks": figure(report.score.ks_statistic if report.score else None),
            "lines": lines,
            # Counts, which the Plots tab draws across days; the names are in the table.
            "failed_features": len(report.failed),
            "warned_features": len(report.warned),
            "failed": _names(report.failed),
            "drift_table": dg.MetadataValue.md(report.table()),
            "drift_plot": markdown_image(
                "PSI per column",
                drift_bars(
                    {c.name: c.psi for c in report.columns},
                    {c.name: c.level for c in report.columns},
                    thresholds.psi_warn,
                    thresholds.psi_fail,
                ),
            ),
            "path": dg.MetadataValue.path(str(path)),
        }
        yield dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(_digest(path)))

    return feature_drift


def _names(names: list[str], shown: int = 5) -> str:
    """The first `shown` names and how many more: a line, not a list that fills the table."""
    if not names:
        return "none"
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" … and {more} more (drift_table)" if more > 0 else "")


def _digest(path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def realized_config(case: UseCase) -> type[dg.Config]:
    """`realized_performance`'s config for a use case: its declared `declare.DecayPolicy`."""
    return config_class(
        DecayPolicy, f"RealizedPerformanceConfig_{case.name}", case.realized, skip=("metric",)
    )


def _realized_performance(case: UseCase) -> dg.AssetsDefinition:
    label = case.label
    key = asset_key(case, "realized_performance")
    config_type = realized_config(case)

    @_monitor(
        case,
        "realized_performance",
        deps=[asset_key(case, "batch_predictions"), asset_key(case, label.table)],
        kinds={"pandas"},
        description=(
            "The day's predictions joined with what happened, once its outcomes are published:"
            " the task's metrics for the day and its trailing window, with bootstrap intervals,"
            " against the test figures of the model version that made the predictions."
        ),
        check=dg.AssetCheckSpec(
            REALIZED_CHECK,
            asset=key,
            description=(
                "Warns when the trailing window's realized performance is worse than the"
                " model's test figure beyond its bootstrap interval; fails when worse by more"
                " than the configured drop (a decay event)."
            ),
        ),
    )
    def realized_performance(
        context: dg.AssetExecutionContext,
        config: config_type,  # type: ignore[valid-type]  # a class built for the use case
        serving: ModelServing,
        lake_files: LakeFiles,
    ):
        import pandas as pd

        from ml import plots
        from ml.metrics import SliceSpec
        from ml.realized import realized

        day = dt.date.fromisoformat(context.partition_key)
        lake = ParquetLake(root=lake_files.root)
        predictions_key = asset_key(case, "batch_predictions")
        today = predicted_outcomes(lake, lake_files, predictions_key, case, day)
        if today is None:
            context.log.info(f"realized_performance {day}: no predictions of that day; skipped")
            return
        versions = sorted(set(today["model_version"].astype(str)))
        if len(versions) != 1:
            raise dg.Failure(f"realized_performance {day}: predictions by {versions}, expected one")
        (version,) = versions
        model = serving.registry.version(case.registered_model, version)
        tested = serving.test_metrics(model)
        threshold = tested.get("threshold") if label.task == "binary" else None
        try:
            policy = dataclasses.replace(case.realized, **config.model_dump())
        except ValueError as error:
            raise dg.Failure(f"realized_performance config: {error}", allow_retries=False) from None
        metric = policy.metric_for(label.task)
        earlier = [day - dt.timedelta(days=n) for n in range(policy.window_days - 1, 0, -1)]
        frames = [
            f
            for d in earlier
            if (f := predicted_outcomes(lake, lake_files, predictions_key, case, d)) is not None
        ]
        window = pd.concat([*frames, today], ignore_index=True)
        window = window[window["model_version"].astype(str) == version]
        covered = 1 + sum(bool((f["model_version"].astype(str) == version).any()) for f in frames)
        output = "probability" if label.task == "binary" else "prediction"

        # The declared slices whose columns the predictions carry (`batch_predictions` keeps them).
        slices = [
            SliceSpec(s.name, s.column, s.edges, s.labels)
            for s in case.slices
            if s.column in window.columns
        ]

        def judged(rows: "pd.DataFrame", slices: "list[SliceSpec]"):
            return realized(
                rows[label.column].to_numpy(dtype="float64"),
                rows[output].to_numpy(dtype="float64"),
                label.task,
                tested,
                policy,
                threshold=threshold,
                frame=rows.reset_index(drop=True),
                slices=slices,
            )

        of_day, of_window = judged(today, []), judged(window, slices)
        if covered < policy.window_days:
            # A test figure pools several days, and a pooled figure mixes the days' differences
            # in: it is not comparable with fewer days than the window, nor is one day's.
            of_window = dataclasses.replace(
                of_window,
                overall=dataclasses.replace(
                    of_window.overall,
                    verdict="not_judged",
                    reason=f"{covered} of {policy.window_days} days predicted by v{version}: "
                    + of_window.overall.reason,
                ),
            )
        first = (day - dt.timedelta(days=policy.window_days - 1)).isoformat()
        span = f"[{first}, {day + dt.timedelta(days=1)})"
        document = {
            "partition": day.isoformat(),
            "model": f"{case.registered_model} v{version}",
            "window": span,
            "tested": {metric: tested.get(metric)},
            "day": of_day.to_dict(),
            "trailing_window": of_window.to_dict(),
        }
        path = lake_files.path_for(key, day.isoformat()).with_suffix(".json")
        write_text_atomically(json.dumps(document, indent=2), path, lake_files.file_mode)
        history = _realized_history(lake_files, key, day, document)
        verdict = of_window.overall.verdict
        yield dg.AssetCheckResult(
            check_name=REALIZED_CHECK,
            passed=verdict in ("ok", "not_judged"),
            severity=dg.AssetCheckSeverity.ERROR
            if verdict == "failed"
            else dg.AssetCheckSeverity.WARN,
            description=f"{day}, window {span}: {verdict}: {of_window.overall.reason}",
        )
        measured_day, measured = of_day.overall.measured, of_window.overall.measured
        yield dg.MaterializeResult(
            metadata={
                DECAY_EVENT: verdict == "failed",
                CHAMPION_VERSION: version,
                CHAMPION_DATA_THROUGH: model.tags.get(DATA_THROUGH_TAG, ""),
                "model": f"{case.registered_model} v{version}",
                "metric": metric,
                "tested": figure(tested.get(metric)),
                "day_rows": measured_day.rows,
                "min_rows": policy.min_rows,  # fewer: the figure is not judged (nor shown)
                f"day_{metric}": figure(measured_day.value),
                f"day_{metric}_interval": dg.MetadataValue.json(
                    [figure(measured_day.low), figure(measured_day.high)]
                ),
                "window": span,
                "window_rows": measured.rows,
                f"window_{metric}": figure(measured.value),
                f"window_{metric}_interval": dg.MetadataValue.json(
                    [figure(measured.low), figure(measured.high)]
                ),
                "verdict": verdict,
                "reason": of_window.overall.reason,
                "over_time_plot": markdown_image(
                    f"{metric} over time",
                    plots.realized_over_time(history, tested.get(metric), metric),
                ),
                "slices": dg.MetadataValue.md(_slice_table(of_window.slices, metric)),
                **(
                    {
                        "slices_plot": markdown_image(
                            f"{metric} per slice",
                            plots.realized_slices(of_window.slices, tested.get(metric), metric),
                        )
                    }
                    if of_window.slices
                    else {}
                ),
                "path": dg.MetadataValue.path(str(path)),
            },
            data_version=dg.DataVersion(_digest(path)),
        )

    return realized_performance


HISTORY_DAYS = 28
"""Days of realized figures the plot over time shows, up to the partition's."""


def _realized_history(
    lake_files: LakeFiles, key: dg.AssetKey, day: dt.date, document: dict
) -> list[dict]:
    """The realized documents of the `HISTORY_DAYS` days up to `day` that were measured, in
    order: each day's figure and its window's, for the plot over time."""
    found = []
    for n in range(HISTORY_DAYS - 1, 0, -1):
        path = lake_files.path_for(key, (day - dt.timedelta(days=n)).isoformat())
        path = path.with_suffix(".json")
        if path.exists():
            found.append(json.loads(path.read_text()))
    return [*found, document]


def _slice_table(rows: list[dict], metric: str) -> str:
    """The window's figure per slice value, as a Markdown table (not judged: reported)."""
    if not rows:
        return "no declared slice column in the predictions"
    lines = [f"| slice | value | rows | {metric} | interval |", "|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['slice']} | {row['group']} | {row['rows']} | {_cell(row['value'])} |"
            f" [{_cell(row['low'])}, {_cell(row['high'])}] |"
        )
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "—" if value is None or not math.isfinite(value) else f"{value:.3f}"


def predicted_outcomes(
    lake: ParquetLake,
    lake_files: LakeFiles,
    predictions_key: dg.AssetKey,
    case: UseCase,
    day: dt.date,
) -> "pd.DataFrame | None":
    """A day's predictions joined with its published outcomes (labelled rows only); None when
    the day was not predicted. Joined on every key column the two share (a missing key matches
    a missing key); an unpublished outcome day is refused by name."""
    import pandas as pd

    path = lake_files.path_for(predictions_key, day.isoformat())
    if not path.exists():
        return None
    predictions = pd.read_parquet(str(path))
    label = case.label
    try:
        outcomes = pd.concat(
            list(lake.table(asset_key(case, label.table), day.isoformat()).frames()),
            ignore_index=True,
        )
    except FileNotFoundError:
        raise dg.Failure(
            f"realized_performance {day}: {label.table} partition {day} has not been"
            " materialized; its outcomes are needed",
            allow_retries=False,
        ) from None
    keys = [
        c
        for c in predictions.columns
        if c in outcomes.columns and c not in (label.event_timestamp, label.column)
    ]
    missing = "\x00missing"
    left = predictions.assign(
        **{k: predictions[k].astype(object).where(predictions[k].notna(), missing) for k in keys}
    )
    right = outcomes[[*keys, label.column]]
    right = right.assign(
        **{k: right[k].astype(object).where(right[k].notna(), missing) for k in keys}
    )
    joined = left.merge(right, on=keys, how="inner", validate="one_to_one")
    return joined[joined[label.column].notna()].reset_index(drop=True)
