"""Features: leak-free daily feature tables in the lake (Feast's offline store), the Feast
registry, the online store, and point-in-time training sets.

The logic is in `ml/features.py` and `ml/dataset.py`; Feast sits behind `FeastFeatureStore`.
"""

import datetime as dt
import warnings
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import create_model

from assets import EXTERNAL_RETRY
from assets.pods import FEATURES as FEATURES_POD
from assets.usecase import Day, FeatureTableSpec, Lookup, Trailing, UseCase, partition_day
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore, declarations_version
from resources.lake import Chunks, LakePartitions, LakeTable

if TYPE_CHECKING:
    from ml.features import TableStream

FEATURES = "features"
KINDS = {"pandas", "parquet", "feast"}
REGISTRY_POOL = "feast_registry"
"""Dagster concurrency pool around every write to the Feast registry (limit 1, dagster.yaml)."""

# Days before the first partition do not exist: early days get a shorter history, not an error.
warnings.filterwarnings(
    "ignore", message=".*allow_nonexistent_upstream_partitions", category=dg.BetaWarning
)


def feature_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's daily feature tables, the Feast registry, the online store and the
    training set."""
    tables = [_feature_table(case, spec) for spec in case.feature_tables]
    return [*tables, _feature_registry(case), _online_features(case), _training_set(case)]


def _slot(table: str) -> str:
    """The step input that carries an event table's published partitions."""
    return f"{table}_published"


def table_inputs(case: UseCase, spec: FeatureTableSpec) -> dict[str, dg.AssetIn]:
    """The step's inputs: one per dimension table, and one per published event table, however
    many of the declared inputs read it (Dagster keys a step's inputs by asset, so the day and a
    trailing window of one table are one input: the window with the day at its end)."""
    ins: dict[str, dg.AssetIn] = {}
    tables: dict[str, list[Day | Trailing]] = {}
    for name, source in spec.inputs.items():
        if isinstance(source, Lookup):
            ins[name] = dg.AssetIn(case.key(source.table))
        else:
            tables.setdefault(source.table, []).append(source)
    for table, sources in tables.items():
        key = case.key(f"validated_{table}")
        days = max((s.days for s in sources if isinstance(s, Trailing)), default=0)
        today = any(isinstance(s, Day) for s in sources)
        if not days:
            ins[_slot(table)] = dg.AssetIn(key, dagster_type=LakeTable)
            continue
        window = dg.TimeWindowPartitionMapping(
            start_offset=-days,
            end_offset=0 if today else -1,
            allow_nonexistent_upstream_partitions=True,  # before the first day: a shorter window
        )
        ins[_slot(table)] = dg.AssetIn(key, partition_mapping=window, dagster_type=LakePartitions)
    return ins


def table_arguments(spec: FeatureTableSpec, inputs: dict[str, Any]) -> tuple[dict, dict]:
    """What `spec.build` gets for each declared input (chunks of the day, of its trailing days,
    or a dimension table), and the metadata of what was read."""
    arguments: dict[str, Any] = {}
    metadata: dict[str, int] = {}
    today = {s.table for s in spec.inputs.values() if isinstance(s, Day)}
    for name, source in spec.inputs.items():
        if isinstance(source, Lookup):
            arguments[name] = inputs[name]
            continue
        value = inputs[_slot(source.table)]
        if isinstance(source, Day):
            day = value.tables[-1] if isinstance(value, LakePartitions) else value
            arguments[name] = day.frames()
            continue
        before = value.tables[:-1] if source.table in today else value.tables
        window = LakePartitions(before[len(before) - source.days :] if source.days else ())
        arguments[name] = window.frames(list(source.columns))
        metadata[f"{name}_days_loaded"] = len(window)
    return arguments, metadata


def _feature_table(case: UseCase, spec: FeatureTableSpec) -> dg.AssetsDefinition:
    """A daily table in the lake, built by the declaration's Dagster-free `build` from the
    day's inputs: published rows a row group at a time, trailing days, dimension tables."""

    @dg.asset(
        key=case.key(spec.name),
        description=spec.description,
        ins=table_inputs(case, spec),
        partitions_def=case.partitions.definition(),
        code_version="1",
        group_name=case.group(FEATURES),
        kinds=KINDS,
        io_manager_key="lake",
        op_tags=FEATURES_POD,
    )
    def _table(context: dg.AssetExecutionContext, **inputs: Any):
        from ml.features import FeatureTable

        arguments, read = table_arguments(spec, inputs)
        context.add_output_metadata(read)
        built = spec.build(partition_day(context.partition_key), **arguments)
        if isinstance(built, FeatureTable):
            context.add_output_metadata(dict(built.counts))
            return built.frame
        return _streamed(built)

    return _table


def _streamed(stream: "TableStream") -> Chunks:
    """A table the lake writes a chunk at a time as `stream` builds it; its counts go into the
    output's metadata once it is written."""
    counts: dict[str, int] = {}

    def frames():
        counts.update((yield from stream))

    return Chunks(frames, metadata=lambda: counts)


def _feature_registry(case: UseCase) -> dg.AssetsDefinition:
    @dg.asset(
        key=case.key("feature_registry"),
        group_name=case.group(FEATURES),
        kinds={"feast"},
        code_version=declarations_version(DEFAULT_REPO, f"{case.name}.py"),
        pool=REGISTRY_POOL,
        retry_policy=EXTERNAL_RETRY,
        op_tags=FEATURES_POD,
    )
    def feature_registry(feature_store: FeastFeatureStore) -> dg.MaterializeResult:
        """The use case's Feast project: its module of feature_repo/ (entities, views,
        services), applied."""
        feature_store = feature_store.for_use_case(case.name)
        applied = feature_store.apply()
        return dg.MaterializeResult(
            metadata={
                "entities": ", ".join(applied.entities),
                "feature_views": ", ".join(applied.feature_views),
                "feature_services": ", ".join(applied.feature_services),
                "deleted": ", ".join(applied.deleted) or "none",
                "declarations_version": declarations_version(
                    feature_store.repo_path, feature_store.declarations
                ),
            }
        )

    return feature_registry


def _tables(case: UseCase) -> list[dg.AssetKey]:
    return [case.key("feature_registry"), *(case.key(t.name) for t in case.feature_tables)]


def _online_features(case: UseCase) -> dg.AssetsDefinition:
    partitions_def = case.partitions.definition()

    @dg.asset(
        key=case.key("online_features"),
        partitions_def=partitions_def,
        deps=_tables(case),
        group_name=case.group(FEATURES),
        kinds={"feast", "sqlite"},
        code_version="1",
        pool=REGISTRY_POOL,
        retry_policy=EXTERNAL_RETRY,
        op_tags=FEATURES_POD,
    )
    def online_features(
        context: dg.AssetExecutionContext, feature_store: FeastFeatureStore
    ) -> dg.MaterializeResult:
        """The day's latest feature values in Feast's online store."""
        feature_store = feature_store.for_use_case(case.name)
        window = context.partition_time_window
        watermark = _watermark(context, partitions_def)
        done = feature_store.materialize(
            window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC), watermark=watermark
        )
        return dg.MaterializeResult(
            metadata={
                "start": done.start.isoformat(),
                "end": done.end.isoformat(),
                "watermark_before": watermark.isoformat() if watermark else "none",
                "feature_views": ", ".join(done.feature_views),
            }
        )

    return online_features


def _watermark(
    context: dg.AssetExecutionContext, partitions_def: dg.DailyPartitionsDefinition
) -> dt.datetime | None:
    """The end of the newest day already in the online store, from this asset's own record."""
    done = context.instance.get_materialized_partitions(context.asset_key)
    if not done:
        return None
    newest = max(done, key=partition_day)
    return partitions_def.time_window_for_partition_key(newest).end.astimezone(dt.UTC)


WINDOW_FIELDS = ("start", "validation_start", "test_start", "end")


def training_set_config(case: UseCase) -> type[dg.Config]:
    """The `training_set` config of a use case: which days go into the training set and how
    they are split (local calendar days; each bound is the first day of its part, `end` the
    first day after the test part), by default the declared window, and the FeatureService."""
    window = dict(case.window.default) or _latest_window(case)
    fields: dict[str, Any] = {name: (str, window[name]) for name in WINDOW_FIELDS}
    fields["feature_service"] = (str, case.feature_service)
    return create_model(
        f"TrainingSetConfig_{case.name}",
        __base__=dg.Config,
        __doc__=training_set_config.__doc__,
        **fields,
    )


def _latest_window(case: UseCase) -> dict[str, str]:
    last = dt.date.fromisoformat(case.partitions.end) - dt.timedelta(days=1)
    return case.window.config(last - dt.timedelta(days=case.window.days - 1), last)


def _training_set(case: UseCase) -> dg.AssetsDefinition:
    label = case.label
    config_class = training_set_config(case)

    @dg.asset(
        key=case.key("training_set"),
        deps=_tables(case),
        group_name=case.group(FEATURES),
        kinds={"pandas", "parquet", "feast"},
        io_manager_key="lake",
        code_version="1",
        retry_policy=EXTERNAL_RETRY,
        op_tags=FEATURES_POD,
    )
    def training_set(
        context: dg.AssetExecutionContext,
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        feature_store: FeastFeatureStore,
    ):
        """Labelled entity rows joined point-in-time through the FeatureService, split by
        date."""
        from ml.dataset import LabelSpec, assemble, labelled_rows

        feature_store = feature_store.for_use_case(case.name)

        split = _time_split(config, case.timezone)
        spec = LabelSpec(view=label.view, label=label.column, task=label.task)
        service = config.feature_service  # type: ignore[attr-defined]
        outcomes = feature_store.view_rows(
            spec.view, split.instant(split.start), split.instant(split.end)
        )
        rows, unlabelled = labelled_rows(outcomes, spec, feature_store.join_keys(service))
        if rows.empty:
            raise dg.Failure(
                description=(
                    f"training_set: no labelled rows of {spec.view!r} in"
                    f" [{split.start}, {split.end}) ({unlabelled} unlabelled); materialize the"
                    " feature tables of those days first"
                ),
                allow_retries=False,
            )
        joined = feature_store.historical_features(rows, service)
        feature_columns = feature_store.feature_columns(service)
        frame, summary = assemble(joined, spec, split, feature_columns, unlabelled)
        days = frame[spec.event_timestamp].dt.tz_convert(case.timezone).dt.date.nunique()
        metadata: dict[str, Any] = {
            "dataset_fingerprint": summary.fingerprint,
            "feature_service": service,
            "features": len(feature_columns),
            "unlabelled_rows_left_out": summary.unlabelled_rows,
            "window": f"[{split.start}, {split.end})",
            "days_with_rows": f"{days} of {(split.end - split.start).days}",
        }
        for part in summary.rows:
            metadata[f"rows_{part}"] = summary.rows[part]
            if label.task == "binary":
                rate = summary.positive_rate(part)
                metadata[f"positive_rate_{part}"] = round(rate, 4) if rate is not None else "n/a"
        if summary.null_features:
            metadata["null_features"] = dg.MetadataValue.json(summary.null_features)
        context.add_output_metadata(metadata)
        return frame

    return training_set


def _time_split(config: dg.Config, timezone: str):
    from ml.dataset import TimeSplit

    days = {}
    for name in WINDOW_FIELDS:
        try:
            days[name] = dt.date.fromisoformat(getattr(config, name))
        except ValueError:
            raise ValueError(
                f"training_set config {name}={getattr(config, name)!r} is not YYYY-MM-DD"
            ) from None
    return TimeSplit(**days, timezone=timezone)
