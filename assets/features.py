"""Features: leak-free daily feature tables in the lake (Feast's offline store), the Feast
registry, the online store, and point-in-time training sets.

The logic is in `ml/features.py` and `ml/dataset.py`; Feast sits behind `FeastFeatureStore`.
"""

import datetime as dt
import hashlib
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import create_model

from assets import EXTERNAL_RETRY, asset_key, daily_partitions
from assets.pods import FEATURES as FEATURES_POD
from assets.tags import CODE_VERSION_TAG, DATA_VERSION_TAG, INPUT_POINTER_TAG, INPUT_VERSION_TAG
from declare import Day, FeatureTableSpec, Lookup, Trailing, UseCase, partition_day
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore, declarations_version
from resources.lake import Chunks, LakePartitions, ParquetLake, stored_hash

if TYPE_CHECKING:
    import pandas as pd

    from ml.features import TableStream

FEATURES = "features"
KINDS = {"pandas", "parquet", "feast"}
REGISTRY_POOL = "feast_registry"
"""Dagster concurrency pool around every write to the Feast registry (limit 1, dagster.yaml)."""

# Days before the first partition do not exist: early days get a shorter history, not an error.
warnings.filterwarnings(
    "ignore", message=".*allow_nonexistent_upstream_partitions", category=dg.BetaWarning
)
# Ranged steps are what let a backfill build a year of features in one run (FEATURES_BACKFILL).
warnings.filterwarnings(
    "ignore", message="Parameter `backfill_policy` of function `asset`", category=dg.BetaWarning
)


def feature_assets(case: UseCase) -> list[dg.AssetsDefinition]:
    """The use case's daily feature tables, the Feast registry, the online store and the
    training set."""
    tables = [_feature_table(case, spec) for spec in case.feature_tables]
    return [*tables, _feature_registry(case), _online_features(case), _training_set(case)]


def _slot(table: str) -> str:
    """The step input that carries an event table's published partitions."""
    return f"{table}_published"


def _reach(spec: FeatureTableSpec) -> dict[str, tuple[int, bool]]:
    """For each event table `spec` reads: how many days before the day it reads back, and
    whether it reads the day itself."""
    reach: dict[str, tuple[int, bool]] = {}
    for source in spec.inputs.values():
        if isinstance(source, Lookup):
            continue
        days, today = reach.get(source.table, (0, False))
        if isinstance(source, Trailing):
            reach[source.table] = (max(days, source.days), today)
        else:
            reach[source.table] = (days, True)
    return reach


def table_inputs(case: UseCase, spec: FeatureTableSpec) -> dict[str, dg.AssetIn]:
    """The step's inputs: one per dimension table, and one per published event table, however
    many of the declared inputs read it (Dagster keys a step's inputs by asset, so the day and a
    trailing window of one table are one input: the window with the day at its end)."""
    ins: dict[str, dg.AssetIn] = {
        name: dg.AssetIn(asset_key(case, source.table))
        for name, source in spec.inputs.items()
        if isinstance(source, Lookup)
    }
    for table, (days, today) in _reach(spec).items():
        window = None
        if days:
            window = dg.TimeWindowPartitionMapping(
                start_offset=-days,
                end_offset=0 if today else -1,
                # before the first day: a shorter window
                allow_nonexistent_upstream_partitions=True,
            )
        ins[_slot(table)] = dg.AssetIn(
            asset_key(case, f"validated_{table}"),
            partition_mapping=window,
            dagster_type=LakePartitions,
        )
    return ins


def _shifted(day: str, days: int) -> str:
    return (partition_day(day) + dt.timedelta(days=days)).isoformat()


def day_share(spec: FeatureTableSpec, inputs: dict[str, Any], day: str) -> dict[str, Any]:
    """The inputs of one day of a step that runs a range: each event table's partitions cut
    to what that day reads; raises the not-materialized error of a day it needs and lacks."""
    share = dict(inputs)
    for table, (days, today) in _reach(spec).items():
        value: LakePartitions = inputs[_slot(table)]
        share[_slot(table)] = value.between(_shifted(day, -days), _shifted(day, 0 if today else -1))
    return share


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


CODE_VERSION = "1"
FEATURES_BACKFILL = dg.BackfillPolicy.single_run()
"""A backfill builds its feature tables in one run, launched once their days are published.
Dagster puts a child in its parent's run only when both have the same policy, so they never
share an event table's run (`BackfillPolicy.multi_run`): a day refused there holds back only the
feature days that read it, not the rest of its range."""


def _feature_table(case: UseCase, spec: FeatureTableSpec) -> dg.AssetsDefinition:
    """A daily table in the lake, built by the declaration's Dagster-free `build` from the
    day's inputs: published rows a row group at a time, trailing days, dimension tables. A step
    of a range builds and records each day on its own (`_feature_days`)."""
    key = asset_key(case, spec.name)

    @dg.asset(
        key=key,
        description=spec.description,
        ins=table_inputs(case, spec),
        partitions_def=daily_partitions(case),
        backfill_policy=FEATURES_BACKFILL,
        code_version=CODE_VERSION,
        group_name=case.group(FEATURES),
        kinds=KINDS,
        io_manager_key="lake",
        output_required=False,
        required_resource_keys={"lake"},
        op_tags=FEATURES_POD,
    )
    def _table(context: dg.AssetExecutionContext, **inputs: Any):
        from ml.features import FeatureTable

        if not context.has_partition_key:
            yield from _feature_days(context, case, spec, inputs)
            return
        arguments, read = table_arguments(spec, inputs)
        context.add_output_metadata(read)
        built = spec.build(partition_day(context.partition_key), **arguments)
        if isinstance(built, FeatureTable):
            context.add_output_metadata(dict(built.counts))
            yield dg.Output(built.frame)
            return
        yield dg.Output(_streamed(built))

    return _table


def _feature_days(
    context: dg.AssetExecutionContext,
    case: UseCase,
    spec: FeatureTableSpec,
    inputs: dict[str, Any],
) -> Iterator[dg.AssetMaterialization]:
    """Each day of a range built, written and recorded as its own partition, with the versions
    Dagster records for a step of one day. A day whose published rows (or trailing days) are
    missing is refused alone; the step fails after the others, naming it."""
    from ml.features import FeatureTable

    lake: ParquetLake = context.resources.lake
    key = asset_key(case, spec.name)
    lookups = _lookup_tags(context, case, spec)
    together = _built_together(spec, inputs, context.partition_keys, case.partitions.timezone)
    hashes: dict[str, str] = {}  # each input file's content hash, read once for the range
    refused: list[str] = []
    for day in context.partition_keys:
        try:
            share = day_share(spec, inputs, day)
        except FileNotFoundError as missing:
            refused.append(f"{day}: {missing}")
            continue
        arguments, read = table_arguments(spec, share)  # the day's inputs, unread
        if day in together:
            table, counts = together[day]
        else:
            built = spec.build(partition_day(day), **arguments)
            table = built.frame if isinstance(built, FeatureTable) else _streamed(built)
            counts = dict(built.counts) if isinstance(built, FeatureTable) else {}
        stored = lake.write(key, day, table)
        tags = {DATA_VERSION_TAG: stored.data_version.value, CODE_VERSION_TAG: CODE_VERSION}
        tags |= _input_tags(case, spec, share, lookups, hashes)
        yield dg.AssetMaterialization(
            key, partition=day, metadata={**read, **counts, **stored.metadata}, tags=tags
        )
    if refused:
        raise dg.Failure(
            description=f"{key.to_user_string()}: {len(refused)} of"
            f" {len(context.partition_keys)} days not built, their input is not published:\n"
            + "\n".join(refused),
            metadata={"refused_partitions": [r.split(":", 1)[0] for r in refused]},
            allow_retries=False,
        )


def _built_together(
    spec: FeatureTableSpec, inputs: dict[str, Any], days: Sequence[str], timezone: str
) -> dict[str, tuple["pd.DataFrame", dict[str, int]]]:
    """The rows of each day of the range that `spec.build_days` built with the other days of
    its stretch (consecutive days whose inputs are all published), and the stretch's counts
    (named `range_<count>`): one call and one read of the shared history a stretch. Empty when
    the declaration has no `build_days`; a day left out is built alone (or refused alone)."""
    if spec.build_days is None:
        return {}
    stretches: list[list[str]] = [[]]
    for day in days:
        try:
            day_share(spec, inputs, day)
        except FileNotFoundError:
            stretches.append([])
            continue
        stretches[-1].append(day)
    built = {}
    for stretch in stretches:
        if len(stretch) > 1:
            built |= _build_stretch(spec, inputs, stretch, timezone)
    return built


def _build_stretch(
    spec: FeatureTableSpec, inputs: dict[str, Any], days: Sequence[str], timezone: str
) -> dict[str, tuple["pd.DataFrame", dict[str, int]]]:
    from ml.features import EVENT_TIMESTAMP

    assert spec.build_days is not None
    first, last = days[0], days[-1]
    arguments: dict[str, Any] = {}
    for name, source in spec.inputs.items():
        if isinstance(source, Lookup):
            arguments[name] = inputs[name]
            continue
        value: LakePartitions = inputs[_slot(source.table)]
        if isinstance(source, Day):
            arguments[name] = value.between(first, last).frames()
            continue
        window = value.between(_shifted(first, -source.days), _shifted(last, -1))
        arguments[name] = window.frames(list(source.columns))
    built = spec.build_days([partition_day(day) for day in days], **arguments)
    counts = {f"range_{name}": count for name, count in built.counts.items()}
    stamped = built.frame[EVENT_TIMESTAMP].dt.tz_convert(timezone).dt.strftime("%Y-%m-%d")
    # A day without rows is left to `build`, whose empty table has the declared schema.
    return {
        day: (rows.reset_index(drop=True), counts) for day, rows in built.frame.groupby(stamped)
    }


def _input_tags(
    case: UseCase,
    spec: FeatureTableSpec,
    share: dict[str, Any],
    lookups: dict[str, str],
    hashes: dict[str, str],
) -> dict[str, str]:
    """The input versions Dagster records for a step of one day: for each event table the day
    read, sha256 of the read partitions' data versions (their content hashes) in partition
    order; for each dimension table, its latest materialization's version and storage id."""
    tags = dict(lookups)
    for table in _reach(spec):
        window: LakePartitions = share[_slot(table)]
        for table_file in window.tables:
            if str(table_file.path) not in hashes:
                hashes[str(table_file.path)] = stored_hash(table_file.path) or ""
        versions = "".join(hashes[str(t.path)] for t in window.tables)
        parent = asset_key(case, f"validated_{table}").to_user_string()
        tags[INPUT_VERSION_TAG + parent] = hashlib.sha256(versions.encode()).hexdigest()
    return tags


def _lookup_tags(
    context: dg.AssetExecutionContext, case: UseCase, spec: FeatureTableSpec
) -> dict[str, str]:
    """The input version and event pointer of each dimension table a step reads, as Dagster
    records them for an unpartitioned input."""
    tags = {}
    for source in spec.inputs.values():
        if not isinstance(source, Lookup):
            continue
        key = asset_key(case, source.table)
        records = context.instance.fetch_materializations(key, limit=1).records
        materialization = records[0].asset_materialization if records else None
        if materialization is None:
            continue
        name = key.to_user_string()
        version = (materialization.tags or {}).get(DATA_VERSION_TAG)
        tags[INPUT_POINTER_TAG + name] = str(records[0].storage_id)
        if version:
            tags[INPUT_VERSION_TAG + name] = version
    return tags


def _streamed(stream: "TableStream") -> Chunks:
    """A table the lake writes a chunk at a time as `stream` builds it; its counts go into the
    output's metadata once it is written."""
    counts: dict[str, int] = {}

    def frames():
        counts.update((yield from stream))

    return Chunks(frames, metadata=lambda: counts)


def _feature_registry(case: UseCase) -> dg.AssetsDefinition:
    @dg.asset(
        key=asset_key(case, "feature_registry"),
        group_name=case.group(FEATURES),
        kinds={"feast"},
        code_version=declarations_version(DEFAULT_REPO / case.name),
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
                "declarations_version": declarations_version(feature_store.repo),
            }
        )

    return feature_registry


def _tables(case: UseCase) -> list[dg.AssetKey]:
    return [
        asset_key(case, "feature_registry"),
        *(asset_key(case, t.name) for t in case.feature_tables),
    ]


def _online_features(case: UseCase) -> dg.AssetsDefinition:
    partitions_def = daily_partitions(case)

    @dg.asset(
        key=asset_key(case, "online_features"),
        partitions_def=partitions_def,
        deps=_tables(case),
        # Runs of a month of days, each one Feast materialization, after the tables' run: their
        # ranged steps record each day themselves and yield no output, so a child in their run
        # would be skipped, and Dagster keeps a child out of its parent's run when their
        # policies differ.
        backfill_policy=dg.BackfillPolicy.multi_run(case.partitions.days_per_run),
        group_name=case.group(FEATURES),
        kinds={"feast", "sqlite"},
        code_version=CODE_VERSION,
        pool=REGISTRY_POOL,
        retry_policy=EXTERNAL_RETRY,
        output_required=False,
        op_tags=FEATURES_POD,
    )
    def online_features(context: dg.AssetExecutionContext, feature_store: FeastFeatureStore):
        """The day's latest feature values in Feast's online store; a range's days are written
        by one Feast materialization and recorded day by day."""
        feature_store = feature_store.for_use_case(case.name)
        window = context.partition_time_window
        watermark = _watermark(context, partitions_def)
        done = feature_store.materialize(
            window.start.astimezone(dt.UTC), window.end.astimezone(dt.UTC), watermark=watermark
        )
        metadata = {
            "start": done.start.isoformat(),
            "end": done.end.isoformat(),
            "watermark_before": watermark.isoformat() if watermark else "none",
            "feature_views": ", ".join(done.feature_views),
        }
        if context.has_partition_key:
            yield dg.MaterializeResult(metadata=metadata)
            return
        for day in context.partition_keys:
            yield dg.AssetMaterialization(
                context.asset_key,
                partition=day,
                metadata=metadata,
                tags={CODE_VERSION_TAG: CODE_VERSION},
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
        key=asset_key(case, "training_set"),
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
        from ml.dataset import LabelSpec, as_predicted, assemble, labelled_rows, repeated_keys

        feature_store = feature_store.for_use_case(case.name)

        split = _time_split(config, case.timezone)
        spec = LabelSpec(view=label.view, label=label.column, task=label.task)
        service = config.feature_service  # type: ignore[attr-defined]
        outcomes = feature_store.view_rows(
            spec.view, split.instant(split.start), split.instant(split.end)
        )
        entities = as_predicted(outcomes, case.prediction.at, case.timezone)
        # Rows the label view's key cannot tell apart would be joined to another event's rows.
        keys, tolerance = feature_store.join_tolerance(spec.view)
        if (repeated := repeated_keys(entities, spec.view, keys, tolerance)) is not None:
            raise dg.Failure(description=f"training_set: {repeated}", allow_retries=False)
        rows, unlabelled = labelled_rows(entities, spec, feature_store.join_keys(service))
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
