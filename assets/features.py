"""Features: leak-free daily feature tables in the lake (Feast's offline store), the Feast
registry, the online store, and point-in-time training sets.

The work is in `ml/feature_days.py` (a table's days from their inputs' partitions, built by a
use case's Dagster-free feature functions) and `ml/training_set.py` (the point-in-time join and
the split, `ml/dataset.py`); Feast sits behind `FeastFeatureStore`.
"""

import datetime as dt
import hashlib
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import dagster as dg
from pydantic import create_model

from assets import EXTERNAL_RETRY, asset_key, dagster_metadata, daily_partitions, refusing
from assets.pods import FEATURES as FEATURES_POD
from assets.tags import CODE_VERSION_TAG, DATA_VERSION_TAG, INPUT_POINTER_TAG, INPUT_VERSION_TAG
from declare import SPLIT_DAYS, FeatureTableSpec, Lookup, UseCase, partition_day
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore, declarations_version
from resources.lake import Chunks, LakePartitions, ParquetLake, Parts, stored_hash

if TYPE_CHECKING:
    import pandas as pd

    from ml.feature_days import FeatureDay, FeatureInputs
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


def feature_assets(case: UseCase, days_per_run: int) -> list[dg.AssetsDefinition]:
    """The use case's daily feature tables, the Feast registry, the online store (a backfill
    writes it `days_per_run` days a run) and the training set."""
    tables = [_feature_table(case, spec) for spec in case.feature_tables]
    online = _online_features(case, days_per_run)
    return [*tables, _feature_registry(case), online, _training_set(case)]


def _slot(table: str) -> str:
    """The step input that carries an event table's published partitions."""
    return f"{table}_published"


def table_inputs(case: UseCase, spec: FeatureTableSpec) -> dict[str, dg.AssetIn]:
    """The step's inputs: one per dimension table, and one per published event table, however
    many of the declared inputs read it (Dagster keys a step's inputs by asset, so the day and a
    trailing window of one table are one input: the window with the day at its end)."""
    ins: dict[str, dg.AssetIn] = {
        name: dg.AssetIn(asset_key(case, source.table))
        for name, source in spec.inputs.items()
        if isinstance(source, Lookup)
    }
    for table, (days, today) in spec.reach().items():
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


def feature_inputs(spec: FeatureTableSpec, inputs: dict[str, Any]) -> "FeatureInputs":
    """The step's inputs (`table_inputs`) as the feature days read them."""
    from ml.feature_days import FeatureInputs

    return FeatureInputs(
        {table: inputs[_slot(table)] for table in spec.reach()},
        {name: inputs[name] for name, s in spec.inputs.items() if isinstance(s, Lookup)},
    )


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
        from ml.feature_days import build_day

        if not context.has_partition_key:
            yield from _feature_days(context, case, spec, inputs)
            return
        built = build_day(spec, feature_inputs(spec, inputs), context.partition_key)
        yield dg.Output(_rows(built), metadata=dagster_metadata(built.metadata()))

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
    from ml.feature_days import MissingInput, build_days

    lake: ParquetLake = context.resources.lake
    key, days = asset_key(case, spec.name), context.partition_keys
    lookups = _lookup_tags(context, case, spec)
    hashes: dict[str, str] = {}  # each input file's content hash, read once for the range
    refused: list[str] = []
    for built in build_days(spec, feature_inputs(spec, inputs), days, case.partitions.timezone):
        if isinstance(built, MissingInput):
            refused.append(f"{built.day}: {built.error}")
            continue
        stored = lake.write(key, built.day, _rows(built))
        tags = {DATA_VERSION_TAG: stored.data_version.value, CODE_VERSION_TAG: CODE_VERSION}
        tags |= _input_tags(case, built.inputs, lookups, hashes)
        metadata = {**dagster_metadata(built.metadata()), **stored.metadata}
        yield dg.AssetMaterialization(key, partition=built.day, metadata=metadata, tags=tags)
    if refused:
        raise dg.Failure(
            description=f"{key.to_user_string()}: {len(refused)} of"
            f" {len(days)} days not built, their input is not published:\n" + "\n".join(refused),
            metadata={"refused_partitions": [r.split(":", 1)[0] for r in refused]},
            allow_retries=False,
        )


def _rows(day: "FeatureDay") -> "pd.DataFrame | Chunks":
    """A day's table as the lake writes it: whole, or a chunk at a time as it is built."""
    from ml.features import FeatureTable

    return day.built.frame if isinstance(day.built, FeatureTable) else _streamed(day.built)


def _input_tags(
    case: UseCase,
    share: "FeatureInputs",
    lookups: dict[str, str],
    hashes: dict[str, str],
) -> dict[str, str]:
    """The input versions Dagster records for a step of one day: for each event table the day
    read, sha256 of the read partitions' data versions (their content hashes) in partition
    order; for each dimension table, its latest materialization's version and storage id."""
    tags = dict(lookups)
    for table, window in share.published.items():
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
        with refusing("feature_registry"):  # a names file out of date is refused, not retried
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


def feature_table_keys(case: UseCase) -> list[dg.AssetKey]:
    """What a training set is joined from: the Feast registry and the feature tables."""
    return [
        asset_key(case, "feature_registry"),
        *(asset_key(case, t.name) for t in case.feature_tables),
    ]


def _online_features(case: UseCase, days_per_run: int) -> dg.AssetsDefinition:
    partitions_def = daily_partitions(case)

    @dg.asset(
        key=asset_key(case, "online_features"),
        partitions_def=partitions_def,
        deps=feature_table_keys(case),
        backfill_policy=_online_backfill(days_per_run),
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
        yield from _each_day(context, metadata)

    return online_features


def _each_day(
    context: dg.AssetExecutionContext, metadata: dict[str, Any]
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    """What a step that yields no output records: its result for one day, or an event for each
    day of its range, tagged with the code version as Dagster tags a step of one day."""
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


def _online_backfill(days_per_run: int) -> dg.BackfillPolicy:
    """Runs of `days_per_run` days (a month by default), each one Feast materialization, after
    the tables' run: their ranged steps record each day themselves and yield no output, so a
    child in their run would be skipped, and Dagster keeps a child out of its parent's run when
    their policies differ."""
    return dg.BackfillPolicy.multi_run(days_per_run)


def _watermark(
    context: dg.AssetExecutionContext, partitions_def: dg.DailyPartitionsDefinition
) -> dt.datetime | None:
    """The end of the newest day already in the online store, from this asset's own record."""
    done = context.instance.get_materialized_partitions(context.asset_key)
    if not done:
        return None
    newest = max(done, key=partition_day)
    return partitions_def.time_window_for_partition_key(newest).end.astimezone(dt.UTC)


def training_set_config(case: UseCase) -> type[dg.Config]:
    """The `training_set` config of a use case: which days go into the training set and how
    they are split (local calendar days; each bound is the first day of its part, `end` the
    first day after the test part), by default the declared window, and the FeatureService."""
    window = dict(case.window.default) or _latest_window(case)
    fields: dict[str, Any] = {name: (str, window[name]) for name in SPLIT_DAYS}
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
    config_class = training_set_config(case)

    @dg.asset(
        key=asset_key(case, "training_set"),
        deps=feature_table_keys(case),
        group_name=case.group(FEATURES),
        kinds={"pandas", "parquet", "feast"},
        io_manager_key="lake",
        code_version="1",
        retry_policy=EXTERNAL_RETRY,
        op_tags=FEATURES_POD,
    )
    def training_set(
        config: config_class,  # type: ignore[valid-type]  # a class built for the use case
        feature_store: FeastFeatureStore,
    ):
        """Labelled entity rows joined point-in-time through the FeatureService, split by
        date."""
        from ml.data import FitStats
        from ml.dataset import SPLIT_COLUMN, LabelSpec
        from ml.task import task_named
        from ml.training_set import assemble_training_set, time_split

        label = LabelSpec(view=case.label.view, label=case.label.column, task=case.label.task)
        split = time_split(config.model_dump(), case.timezone)  # type: ignore[attr-defined]
        service = config.feature_service  # type: ignore[attr-defined]
        store = feature_store.for_use_case(case.name)
        with refusing("training_set"):
            built = assemble_training_set(store, label, service, split, case.prediction.at)
        metadata = {**built.metadata(), "engine": feature_store.engine}
        # Parts by split and row range, with the train split's preprocessing statistics in
        # their manifest: what a training rank streams (`ml.parts`, `ml.streaming`).
        fit = FitStats.for_task(task_named(label.task), label.label)
        parts = Parts(built.frame, SPLIT_COLUMN, fit=fit)
        return dg.Output(parts, metadata=dagster_metadata(metadata))

    return training_set
