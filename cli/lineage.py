"""Lineage of a registered model version, or of one prediction: the chain back to the raw
partitions, their data versions, the feature service, the code commit and the environment lock.

    python -m cli.lineage model [--use-case NAME] [--name MODEL] [--version N] [--json]
    python -m cli.lineage prediction DAY KEY=VALUE [KEY=VALUE ...] [--use-case NAME] [--json]

e.g. `prediction 2013-01-07 customer_id=42` where the FeatureService joins on `customer_id`: a
prediction is found by the values of its row's entity keys (the FeatureService's join keys and
`event_timestamp`, the columns `batch_predictions` keeps), all of them or enough to name one row.

Nothing here is a hand-kept list of what was used. The model version comes from the MLflow
registry (its tags name the Dagster run that registered it, its files' sha256); the run manifest
is the copy registered with the version, fetched sha256-verified; every materialization below
`registered_model` is found in Dagster's event log by walking the asset graph's parents of each
recorded materialization: an unpartitioned parent through the `dagster/input_event_pointer/<key>`
tag Dagster wrote, a partitioned parent as the latest materialization of each mapped partition
recorded before the child's. Dagster also records, per input, one data version for the mapped
partitions together (sha256 of their versions in partition order); where it did, the walk
recomputes it from the partitions it found and marks the input verified or not.

A partitioned parent of an unpartitioned child (the feature tables of `training_set`, which
Dagster maps with "all partitions") is narrowed to the days of the child's `window` metadata.
"""

import argparse
import bisect
import dataclasses
import datetime as dt
import gc
import hashlib
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Nothing heavy is imported when this module loads (not `assets` either: the package imports
# Dagster), so that the command can set the garbage collector up first (the end of the file).
if TYPE_CHECKING:
    import dagster as dg

    from assets.usecase import UseCase
    from resources.registry import MlflowRegistry, ModelVersion

MANIFEST_FILE = "manifest.json"
ONNX_FILE = "model.onnx"
PREDICTION_COLUMNS = ("probability", "prediction")
"""The predicted value in a `batch_predictions` file: a probability (binary) or a number."""
OUTPUT_COLUMNS = (*PREDICTION_COLUMNS, "predicted", "model_name", "model_version", "predicted_at")
"""The columns of a `batch_predictions` file that are not the scored row's keys."""
NAMED_ASSETS = ("training_set", "feature_registry")
"""The use case's assets the text view names (by their role in the lifecycle)."""
MANIFEST_FIELDS = (
    "git_commit",
    "lock_sha256",
    "seed",
    "world_size",
    "feature_service",
    "data_fingerprint",
    "shards_fingerprint",
    "dagster_run_id",
    "image_tag",
    "python",
    "host",
    "devices",
    "libraries",
)
"""The manifest's facts a lineage reports (its training config stays in the registered file)."""
SHOWN_METADATA = (
    "model",
    "decision",
    "onnx_sha256",
    "sha256",
    "data_fingerprint",
    "mlflow_run_id",
    "window",
    "dataset_fingerprint",
    "feature_service",
    "feature_services",
    "declarations_version",
)
"""Metadata entries the text view prints when a materialization has them (JSON keeps all)."""
_WINDOW = re.compile(r"\[(\d{4}-\d{2}-\d{2}), (\d{4}-\d{2}-\d{2})\)")
_SHORT = 12


class LineageError(RuntimeError):
    """The lineage cannot be traced: an unknown version or prediction, a missing record."""


# --- The document: plain data, no Dagster -------------------------------------------------------


@dataclass(frozen=True)
class Input:
    """What one materialization read from one parent asset."""

    asset: str
    partitions: list[str] | None
    """The parent's partitions read, in partition order; None for an unpartitioned parent."""
    storage_ids: list[int]
    """The parent materializations found, one per partition (or one)."""
    recorded_data_version: str | None
    """The data version Dagster recorded for this input; None when it recorded none."""
    verified: bool | None
    """Whether the found materializations give the recorded data version; None when Dagster's
    record cannot tell (it kept only the newest partition's version, as for `deps`)."""


@dataclass(frozen=True)
class Materialization:
    """One materialization of one asset (partition), as the event log records it."""

    asset: str
    partition: str | None
    storage_id: int
    run_id: str
    timestamp: str
    code_version: str | None
    data_version: str | None
    metadata: dict[str, Any]
    """Its small scalar metadata (no plots, schemas or JSON documents)."""
    inputs: list[Input] = field(default_factory=list)


@dataclass(frozen=True)
class ModelFacts:
    """The registered version, as the registry describes it."""

    name: str
    version: str
    champion: bool
    aliases: list[str]
    gate_decision: str | None
    weights_sha256: str | None
    onnx_sha256: str | None
    manifest_sha256: str | None
    registered_by_run: str | None
    """The Dagster run whose `registered_model` step registered it."""
    mlflow_training_run: str | None
    created_at: str
    link: str


@dataclass(frozen=True)
class Prediction:
    """One row of `batch_predictions`."""

    day: str
    keys: dict[str, str]
    """The values it was looked up by, by column (its entity keys, as given)."""
    column: str
    """The predicted column: `probability` (binary) or `prediction` (regression)."""
    value: float
    predicted: bool | None
    """Binary: whether the probability clears the model's threshold; None for other tasks."""
    model_name: str
    model_version: str
    predicted_at: str
    file: str
    file_matches_data_version: bool
    """Whether the file read still has the sha256 its materialization recorded."""


@dataclass(frozen=True)
class Lineage:
    """A model version (and optionally a prediction it made) traced back to raw partitions."""

    model: ModelFacts
    manifest: dict[str, Any]
    """The run manifest's facts (MANIFEST_FIELDS), from the copy registered with the version."""
    materializations: list[Materialization]
    """The model's chain, `registered_model` first, then parents before grandparents."""
    prediction: Prediction | None = None
    prediction_materializations: list[Materialization] = field(default_factory=list)
    """The prediction's day: `batch_predictions` and its non-model ancestry."""
    assets: dict[str, str] = field(default_factory=dict)
    """The key (as `Materialization.asset` writes it) of each use case asset the text view names
    (NAMED_ASSETS), by its name in the lifecycle."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> "Lineage":
        def materializations(items: Iterable[Mapping[str, Any]]) -> list[Materialization]:
            return [
                Materialization(
                    **{**m, "inputs": [Input(**i) for i in m.get("inputs", [])]}  # type: ignore[arg-type]
                )
                for m in items
            ]

        prediction = document.get("prediction")
        return cls(
            model=ModelFacts(**document["model"]),
            manifest=dict(document["manifest"]),
            materializations=materializations(document["materializations"]),
            prediction=Prediction(**prediction) if prediction else None,
            prediction_materializations=materializations(
                document.get("prediction_materializations", [])
            ),
            assets=dict(document.get("assets", {})),
        )

    def find(self, asset: str) -> list[Materialization]:
        """Every materialization of `asset` in the chain (the prediction's day included)."""
        return [
            m
            for m in [*self.prediction_materializations, *self.materializations]
            if m.asset == asset
        ]

    def partitions(self, asset: str) -> dict[str, str | None]:
        """Partition → data version of `asset` in the model's chain."""
        return {
            m.partition: m.data_version
            for m in self.materializations
            if m.asset == asset and m.partition is not None
        }

    def render(self) -> str:
        lines: list[str] = []
        if self.prediction is not None:
            lines += _render_prediction(self.prediction)
        lines += _render_model(self.model)
        lines += _render_manifest(self.manifest, self.materializations, self.assets)
        if self.prediction_materializations:
            lines.append(f"the prediction's day ({len(self.prediction_materializations)} records)")
            lines += _render_materializations(self.prediction_materializations)
        lines.append(f"the model's chain in the event log ({len(self.materializations)} records)")
        lines += _render_materializations(self.materializations)
        return "\n".join(lines) + "\n"


def _render_prediction(p: Prediction) -> list[str]:
    state = "file matches its data version" if p.file_matches_data_version else "FILE CHANGED"
    keys = " ".join(f"{k}={v}" for k, v in p.keys.items())
    predicted = (
        "" if p.predicted is None else f" predicted={'positive' if p.predicted else 'negative'}"
    )
    return [
        f"prediction {p.day} {keys}: {p.column}={p.value:.4f}{predicted} at {p.predicted_at}",
        f"  by {p.model_name} v{p.model_version}; {p.file} ({state})",
    ]


def _render_model(m: ModelFacts) -> list[str]:
    role = "champion" if m.champion else f"not champion (aliases: {m.aliases or 'none'})"
    return [
        f"model {m.name} v{m.version} ({role}), gate {m.gate_decision}, registered {m.created_at}",
        f"  weights sha256   {m.weights_sha256}",
        f"  {ONNX_FILE} sha256 {m.onnx_sha256}",
        f"  {MANIFEST_FILE}    {m.manifest_sha256}",
        f"  registered by Dagster run {m.registered_by_run};"
        f" MLflow training run {m.mlflow_training_run}",
        f"  {m.link}",
    ]


def _render_manifest(
    manifest: Mapping[str, Any], chain: Sequence[Materialization], assets: Mapping[str, str]
) -> list[str]:
    libraries = ", ".join(f"{k} {v}" for k, v in sorted(manifest.get("libraries", {}).items()))
    registries = [m for m in chain if m.asset == assets.get("feature_registry")]
    declarations = (
        f" (feature_registry declarations {registries[0].code_version})" if registries else ""
    )
    sets = [m for m in chain if m.asset == assets.get("training_set")]
    fingerprint = manifest.get("data_fingerprint")
    same = ""
    if sets:
        same = (
            " = training_set's data version"
            if sets[0].data_version == fingerprint
            else (f" ≠ training_set's data version {_short(sets[0].data_version)}")
        )
    return [
        f"run manifest (the registered {MANIFEST_FILE}, sha256-verified)",
        f"  git commit       {manifest.get('git_commit')}",
        f"  lock sha256      {manifest.get('lock_sha256')}",
        f"  feature service  {manifest.get('feature_service')}{declarations}",
        f"  seed {manifest.get('seed')}, world size {manifest.get('world_size')},"
        f" devices {manifest.get('devices')}, python {manifest.get('python')},"
        f" image {manifest.get('image_tag')}, host {manifest.get('host')}",
        f"  data fingerprint {fingerprint}{same}",
        f"  trained in Dagster run {manifest.get('dagster_run_id')}",
        f"  libraries        {libraries}",
    ]


def _render_materializations(chain: Sequence[Materialization]) -> list[str]:
    lines: list[str] = []
    by_asset: dict[str, list[Materialization]] = {}
    for m in chain:
        by_asset.setdefault(m.asset, []).append(m)
    for asset, records in by_asset.items():
        if len(records) == 1 and records[0].partition is None:
            m = records[0]
            lines.append(f"  {asset}  {_facts(m)}")
            shown = {k: m.metadata[k] for k in SHOWN_METADATA if k in m.metadata}
            if shown:
                lines.append("      " + "  ".join(f"{k}={_short(v)}" for k, v in shown.items()))
            if m.inputs:
                lines.append("      ← " + ", ".join(_render_input(i) for i in m.inputs))
            continue
        plural = "" if len(records) == 1 else "s"
        lines.append(f"  {asset}  ({len(records)} partition{plural})")
        for m in sorted(records, key=lambda r: r.partition or ""):
            inputs = ", ".join(_render_input(i) for i in m.inputs)
            lines.append(f"    {m.partition}  {_facts(m)}" + (f"  ← {inputs}" if inputs else ""))
    return lines


def _facts(m: Materialization) -> str:
    return (
        f"data {_short(m.data_version)}  code {m.code_version}  run {m.run_id[:8]}  {m.timestamp}"
    )


def _render_input(i: Input) -> str:
    mark = {True: " ✓", False: " ≠ recorded", None: ""}[i.verified]
    if i.partitions is None:
        return f"{i.asset}{mark}"
    return f"{i.asset}[{_span(i.partitions)}]{mark}"


def _span(partitions: Sequence[str]) -> str:
    if not partitions:
        return "none materialized"
    if len(partitions) == 1:
        return partitions[0]
    return f"{partitions[0]}..{partitions[-1]} ({len(partitions)})"


def _short(value: Any) -> str:
    text = str(value)
    return text[:_SHORT] if re.fullmatch(r"[0-9a-f]{40,64}", text) else text


def partitions_version(data_versions: Sequence[str]) -> str:
    """The one data version Dagster records for several input partitions: sha256 of their data
    versions joined in partition order (dagster's `_get_partitions_data_version_from_keys`)."""
    return hashlib.sha256("".join(data_versions).encode()).hexdigest()


def window_days(window: str) -> list[str]:
    """The days of a `[YYYY-MM-DD, YYYY-MM-DD)` window (training_set's `window` metadata)."""
    found = _WINDOW.fullmatch(window.strip())
    if not found:
        raise LineageError(f"window {window!r} is not '[YYYY-MM-DD, YYYY-MM-DD)'")
    start, end = (dt.date.fromisoformat(d) for d in found.groups())
    return [(start + dt.timedelta(days=n)).isoformat() for n in range((end - start).days)]


# --- Building it from the registry and the event log ------------------------------------------


def model_lineage(
    instance: "dg.DagsterInstance",
    defs: "dg.Definitions",
    registry: "MlflowRegistry",
    case: "UseCase",
    version: str | None = None,
    name: str | None = None,
) -> Lineage:
    """The lineage of `case`'s registered model (or the model `name`) version `version` (the
    champion when None), walked through the asset graph of `defs` in `instance`'s event log."""
    from assets import asset_key

    name = name or case.registered_model
    model = _model_version(registry, name, version)
    run_id = model.tags.get("dagster_run_id")
    if not run_id:
        raise LineageError(f"{name} v{model.version}: no dagster_run_id tag; not registered by us")
    start = _registration(instance, case, run_id, name, model.version)
    chain = _walk(instance, defs.resolve_asset_graph(), [start])
    return Lineage(
        model=_model_facts(model),
        manifest=_manifest(registry, model),
        materializations=chain,
        assets={asset: asset_key(case, asset).to_user_string() for asset in NAMED_ASSETS},
    )


def prediction_lineage(
    instance: "dg.DagsterInstance",
    defs: "dg.Definitions",
    registry: "MlflowRegistry",
    case: "UseCase",
    day: str,
    keys: Mapping[str, str],
) -> Lineage:
    """The lineage of the prediction on `day` whose row has the values `keys` (column → value):
    its row of `case`'s `batch_predictions`, that day's materialization and feature partitions,
    and the model version that scored it."""
    import dagster as dg

    from assets import asset_key

    key = asset_key(case, "batch_predictions")
    asset = key.to_user_string()
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
    ).records
    if not records:
        raise LineageError(f"{asset} has no materialization for day {day!r}")
    record = records[0]
    path_value = record.asset_materialization.metadata.get("path")  # type: ignore[union-attr]
    if path_value is None:
        raise LineageError(f"{asset} {day}: its materialization records no path")
    prediction = read_prediction(
        Path(str(path_value.value)), day, keys, _data_version(record), asset
    )
    model = model_lineage(
        instance, defs, registry, case, prediction.model_version, prediction.model_name
    )
    day_chain = _walk(
        instance, defs.resolve_asset_graph(), [record], stop={asset_key(case, "registered_model")}
    )
    return dataclasses.replace(model, prediction=prediction, prediction_materializations=day_chain)


def _model_version(registry: "MlflowRegistry", name: str, version: str | None) -> "ModelVersion":
    from resources.registry import RegistryError

    try:
        if version is None:
            found = registry.champion(name)
            if found is None:
                raise LineageError(f"{name} has no champion; name a version with --version")
            return found
        return registry.version(name, version)
    except RegistryError as error:
        raise LineageError(str(error)) from error


def _model_facts(model: "ModelVersion") -> ModelFacts:
    from resources.registry import CHAMPION

    return ModelFacts(
        name=model.name,
        version=model.version,
        champion=CHAMPION in model.aliases,
        aliases=list(model.aliases),
        gate_decision=model.gate_decision,
        weights_sha256=model.tags.get("weights_sha256"),
        onnx_sha256=model.files.get(ONNX_FILE),
        manifest_sha256=model.files.get(MANIFEST_FILE),
        registered_by_run=model.tags.get("dagster_run_id"),
        mlflow_training_run=model.tags.get("training_run_id"),
        created_at=model.created_at.isoformat(timespec="seconds"),
        link=model.link,
    )


def _manifest(registry: "MlflowRegistry", model: "ModelVersion") -> dict[str, Any]:
    if MANIFEST_FILE not in model.files:
        raise LineageError(f"{model.name} v{model.version}: no {MANIFEST_FILE} was registered")
    with tempfile.TemporaryDirectory(prefix="lineage-") as cache:
        path = registry.fetch(model, MANIFEST_FILE, Path(cache))  # sha256-verified
        document = json.loads(path.read_text())
    return {k: document[k] for k in MANIFEST_FIELDS if k in document}


def _registration(
    instance: "dg.DagsterInstance", case: "UseCase", run_id: str, name: str, version: str
):
    """The `registered_model` materialization of `run_id` that registered `name` `version`, as
    the asset's records have it (a run's own records number their events apart in SQLite, so
    their storage ids are not the ones the walk compares)."""
    import dagster as dg

    from assets import asset_key

    registered = asset_key(case, "registered_model")
    if instance.get_run_by_id(run_id) is None:
        raise LineageError(
            f"{name} v{version} was registered by Dagster run {run_id}, which this instance"
            f" ({instance.root_directory}) does not know; set DAGSTER_HOME to its instance"
        )
    records_filter = dg.AssetRecordsFilter(asset_key=registered)
    cursor = None
    while True:  # newest first: one page unless the model was registered a thousand times since
        page = instance.fetch_materializations(records_filter, limit=PAGE, cursor=cursor)
        for record in page.records:
            materialization = record.asset_materialization
            if (
                record.run_id == run_id
                and materialization is not None
                and _value(materialization.metadata.get("model")) == f"{name} v{version}"
            ):
                return record
        if not page.has_more:
            break
        cursor = page.cursor
    raise LineageError(
        f"Dagster run {run_id} has no {registered.to_user_string()} materialization of {name}"
        f" v{version}"
    )


PAGE = 1000
"""Event log records fetched per query (and partitions named per query)."""


@dataclass(frozen=True)
class _Read:
    """What one materialization read from one parent asset, as the asset graph and the
    materialization's tags tell."""

    parent: "dg.AssetKey"
    partitions: list[str] | None
    """The parent's partitions mapped to the materialization's; None for an unpartitioned parent."""
    recorded: str | None
    """The data version Dagster recorded for this input."""
    pointer: int | None
    """The storage id of the parent materialization Dagster recorded for this input."""


class _EventLog:
    """The parent materializations a walk looks up, fetched one query per asset for many
    partitions, storage ids or readers (a query per partition made a lineage take over a minute)
    and kept for the rest of the walk."""

    def __init__(self, instance: "dg.DagsterInstance") -> None:
        self._instance = instance
        self._partitions: dict[tuple[dg.AssetKey, str], tuple[int, list]] = {}
        """(asset, partition) → (a storage id, every materialization before it in storage order)."""
        self._ids: dict[tuple[dg.AssetKey, int], Any] = {}
        """(asset, storage id) → its materialization; None where there is none."""
        self._latest: dict[tuple[dg.AssetKey, int], list] = {}
        """(unpartitioned asset, storage id) → its latest materialization before it, as a list of
        none or one."""

    def prefetch(self, reads: Iterable[tuple[int, _Read]]) -> None:
        """Fetches what the lookups of `reads` (by a materialization's storage id, what it read)
        will need: per parent, the partitions read before the latest reader, the pointers of the
        unpartitioned parents, and the latest materialization of those read without a pointer
        (a partitioned asset's `deps`) before each reader."""
        partitions: dict[dg.AssetKey, tuple[set[str], int]] = {}
        pointers: dict[dg.AssetKey, set[int]] = {}
        readers: dict[dg.AssetKey, set[int]] = {}
        for storage_id, read in reads:
            if read.partitions is not None:
                days, before = partitions.get(read.parent, (set(), 0))
                partitions[read.parent] = (days | set(read.partitions), max(before, storage_id))
            elif read.pointer is not None:
                pointers.setdefault(read.parent, set()).add(read.pointer)
            else:
                readers.setdefault(read.parent, set()).add(storage_id)
        for key, (days, before) in partitions.items():
            self._fetch_partitions(key, days, before)
        for key, storage_ids in pointers.items():
            self._fetch_ids(key, storage_ids)
        for key, storage_ids in readers.items():
            self._fetch_latest(key, storage_ids)

    def latest_before(self, key: "dg.AssetKey", partition: str | None, storage_id: int) -> list:
        """The latest materialization of `key`'s `partition` (of `key` when None) before
        `storage_id`, as a list of none or one."""
        if partition is None:
            self._fetch_latest(key, {storage_id})
            return self._latest[key, storage_id]
        self._fetch_partitions(key, {partition}, storage_id)
        _, records = self._partitions[key, partition]
        before = bisect.bisect_left([r.storage_id for r in records], storage_id)
        return records[before - 1 : before]

    def pointed(self, key: "dg.AssetKey", storage_id: int) -> list:
        """The materialization of `key` with `storage_id`, as a list of none or one."""
        self._fetch_ids(key, {storage_id})
        record = self._ids[key, storage_id]
        return [] if record is None else [record]

    def _fetch_partitions(self, key: "dg.AssetKey", partitions: set[str], before: int) -> None:
        missing = sorted(p for p in partitions if self._partitions.get((key, p), (0,))[0] < before)
        import dagster as dg

        for start in range(0, len(missing), PAGE):
            chunk = missing[start : start + PAGE]
            found: dict[str, list] = {p: [] for p in chunk}
            records_filter = dg.AssetRecordsFilter(
                asset_key=key, asset_partitions=chunk, before_storage_id=before
            )
            for record in self._records(records_filter):
                found[record.asset_materialization.partition].append(record)
            self._partitions.update({(key, p): (before, found[p]) for p in chunk})

    def _fetch_latest(self, key: "dg.AssetKey", storage_ids: set[int]) -> None:
        """The latest materialization of the unpartitioned `key` before each of `storage_ids`:
        one query from the newest reader answers every reader after what it finds, so readers
        of one materialization (every partition of a child) cost one query together."""
        pending = sorted((i for i in storage_ids if (key, i) not in self._latest), reverse=True)
        while pending:
            found = _latest_before(self._instance, key, None, pending[0])
            made = found[0].storage_id if found else -1
            self._latest.update({(key, i): found for i in pending if i > made})
            pending = [i for i in pending if i <= made]

    def _fetch_ids(self, key: "dg.AssetKey", storage_ids: set[int]) -> None:
        missing = sorted(i for i in storage_ids if (key, i) not in self._ids)
        import dagster as dg

        for start in range(0, len(missing), PAGE):
            chunk = missing[start : start + PAGE]
            self._ids.update(dict.fromkeys(((key, i) for i in chunk), None))
            records_filter = dg.AssetRecordsFilter(asset_key=key, storage_ids=chunk)
            self._ids.update({(key, r.storage_id): r for r in self._records(records_filter)})

    def _records(self, records_filter: "dg.AssetRecordsFilter") -> Iterator:
        """Every record `records_filter` matches, in storage order, a page at a time."""
        cursor = None
        while True:
            page = self._instance.fetch_materializations(
                records_filter, limit=PAGE, cursor=cursor, ascending=True
            )
            yield from page.records
            if not page.has_more:
                return
            cursor = page.cursor


def _walk(
    instance: "dg.DagsterInstance", asset_graph, starts, stop: Iterable["dg.AssetKey"] = ()
) -> list[Materialization]:
    """Every materialization the `starts` were made from, breadth first, each once: a level of
    the graph at a time, the parents of a whole level fetched together."""
    stop = set(stop)
    log = _EventLog(instance)
    found: dict[int, Materialization] = {}
    level = list(starts)
    while level:
        records: dict[int, Any] = {}
        for record in level:
            if record.storage_id not in found:
                records.setdefault(record.storage_id, record)
        reads = {i: _reads(asset_graph, record, stop) for i, record in records.items()}
        log.prefetch((i, read) for i, these in reads.items() for read in these)
        level = []
        for i, record in records.items():
            inputs = []
            for read in reads[i]:
                parents, described = _parents(log, record, read)
                inputs.append(described)
                level.extend(parents)
            found[i] = _materialization(record, inputs)
    return list(found.values())


def _reads(asset_graph, record, stop: set["dg.AssetKey"]) -> list[_Read]:
    """What `record` read from each of its parents in the asset graph (but those in `stop`)."""
    from assets.tags import INPUT_POINTER_TAG, INPUT_VERSION_TAG

    materialization = record.asset_materialization
    key = materialization.asset_key
    if not asset_graph.has(key):
        return []
    tags = materialization.tags or {}
    reads = []
    for parent in sorted(asset_graph.get(key).parent_keys, key=lambda k: k.path):
        if parent in stop:
            continue
        name = parent.to_user_string()
        pointer = tags.get(INPUT_POINTER_TAG + name)
        partitioned = asset_graph.get(parent).partitions_def is not None
        reads.append(
            _Read(
                parent,
                _parent_partitions(asset_graph, record, parent) if partitioned else None,
                tags.get(INPUT_VERSION_TAG + name),
                None if pointer is None else int(pointer),
            )
        )
    return reads


def _parents(log: _EventLog, record, read: _Read):
    """The parent's materializations `record` was made from, and the Input describing them."""
    name = read.parent.to_user_string()
    recorded = read.recorded
    if read.partitions is None:
        if read.pointer is not None:
            parents = log.pointed(read.parent, read.pointer)
        else:
            parents = log.latest_before(read.parent, None, record.storage_id)
        versions = [_data_version(p) for p in parents]
        verified = None if recorded is None else versions == [recorded]
        return parents, Input(name, None, [p.storage_id for p in parents], recorded, verified)
    parents = [
        p for day in read.partitions for p in log.latest_before(read.parent, day, record.storage_id)
    ]
    versions = [_data_version(p) or "" for p in parents]
    verified = None
    if recorded is not None:
        if partitions_version(versions) == recorded:
            verified = True
        elif read.pointer is None or recorded != _pointed_version(log, read.parent, read.pointer):
            verified = False  # else Dagster kept only the newest partition's version: no check
    described = Input(
        name,
        [p.asset_materialization.partition for p in parents],
        [p.storage_id for p in parents],
        recorded,
        verified,
    )
    return parents, described


def _parent_partitions(asset_graph, record, parent) -> list[str]:
    materialization = record.asset_materialization
    key = materialization.asset_key
    parent_partitions = asset_graph.get(parent).partitions_def
    if materialization.partition is None:
        window = _value(materialization.metadata.get("window"))
        if window is None:
            raise LineageError(
                f"{key.to_user_string()} (storage id {record.storage_id}) reads every partition"
                f" of {parent.to_user_string()} and records no window to narrow them to"
            )
        days = window_days(str(window))
        return [d for d in days if parent_partitions.has_partition_key(d)]
    mapped = asset_graph.get_parent_partition_keys_for_child(materialization.partition, parent, key)
    return sorted(mapped.partitions_subset.get_partition_keys())


def _latest_before(instance, key, partition: str | None, storage_id: int) -> list:
    import dagster as dg

    return list(
        instance.fetch_materializations(
            dg.AssetRecordsFilter(
                asset_key=key,
                asset_partitions=[partition] if partition is not None else None,
                before_storage_id=storage_id,
            ),
            limit=1,
        ).records
    )


def _pointed_version(log: _EventLog, key: "dg.AssetKey", storage_id: int) -> str | None:
    records = log.pointed(key, storage_id)
    return _data_version(records[0]) if records else None


def _data_version(record) -> str | None:
    from assets.tags import DATA_VERSION_TAG

    return (record.asset_materialization.tags or {}).get(DATA_VERSION_TAG)


def _materialization(record, inputs: list[Input]) -> Materialization:
    from assets.tags import CODE_VERSION_TAG, DATA_VERSION_TAG

    m = record.asset_materialization
    tags = m.tags or {}
    return Materialization(
        asset=m.asset_key.to_user_string(),
        partition=m.partition,
        storage_id=record.storage_id,
        run_id=record.run_id,
        timestamp=dt.datetime.fromtimestamp(record.timestamp, tz=dt.UTC).isoformat(
            timespec="seconds"
        ),
        code_version=tags.get(CODE_VERSION_TAG),
        data_version=tags.get(DATA_VERSION_TAG),
        metadata={
            k: value
            for k, v in m.metadata.items()
            if not k.startswith("dagster/") and _is_small(value := _value(v))
        },
        inputs=inputs,
    )


def _value(entry) -> Any:
    return None if entry is None else entry.value


def _is_small(value: Any) -> bool:
    if isinstance(value, bool | int | float):
        return True
    return isinstance(value, str) and len(value) <= 200 and "\n" not in value


def read_prediction(
    path: Path,
    day: str,
    keys: Mapping[str, str],
    data_version: str | None,
    asset: str = "batch_predictions",
) -> Prediction:
    """The one row of the predictions file `path` (of `asset` on `day`, recorded with
    `data_version`) whose columns have the values `keys`, each given as text and read as its
    column's type."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if not path.is_file():
        raise LineageError(f"{asset} {day}: {path} is gone")
    schema = pq.read_schema(path)
    key_columns = [name for name in schema.names if name not in OUTPUT_COLUMNS]
    wanted = ", ".join(f"{k}={v!r}" for k, v in keys.items())
    if not keys:
        raise LineageError(f"name the prediction by its keys: {', '.join(key_columns)}")
    unknown = [k for k in keys if k not in key_columns]
    if unknown:
        raise LineageError(
            f"{asset} {day}: {unknown} are not key columns of its predictions;"
            f" use {', '.join(key_columns)}"
        )
    condition = None
    for column, text in keys.items():
        kind = schema.field(column).type
        try:
            value = pa.scalar(text).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise LineageError(f"{column}={text!r} is not a value of type {kind}") from None
        test = pc.field(column) == value
        condition = test if condition is None else condition & test
    rows = pq.read_table(path, filters=condition).to_pylist()
    if not rows:
        raise LineageError(f"{asset} {day} has no prediction for {wanted}")
    if len(rows) > 1:
        raise LineageError(
            f"{asset} {day} holds {len(rows)} predictions for {wanted};"
            f" name more of its keys: {', '.join(key_columns)}"
        )
    row = rows[0]
    column = next((c for c in PREDICTION_COLUMNS if c in row), None)
    if column is None:
        raise LineageError(f"{path} has none of the prediction columns {PREDICTION_COLUMNS}")
    with path.open("rb") as source:
        digest = hashlib.file_digest(source, "sha256").hexdigest()
    return Prediction(
        day=day,
        keys=dict(keys),
        column=column,
        value=float(row[column]),
        predicted=bool(row["predicted"]) if "predicted" in row else None,
        model_name=str(row["model_name"]),
        model_version=str(row["model_version"]),
        predicted_at=row["predicted_at"].isoformat(timespec="seconds"),
        file=str(path),
        file_matches_data_version=digest == data_version,
    )


# --- The command line ---------------------------------------------------------------------------


def _pair(text: str) -> tuple[str, str]:
    """A `KEY=VALUE` argument."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cli.lineage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument("--use-case", metavar="NAME", help="default: the first declared")
    commands = parser.add_subparsers(dest="command", required=True)
    model = commands.add_parser("model", help="the lineage of a registered model version")
    model.add_argument("--name", help="registered model name (default: the use case's)")
    model.add_argument("--version", help="version number (default: the champion)")
    prediction = commands.add_parser("prediction", help="the lineage of one batch prediction")
    prediction.add_argument("day", help="the batch_predictions partition, YYYY-MM-DD")
    prediction.add_argument(
        "keys", nargs="+", type=_pair, metavar="KEY=VALUE", help="the prediction row's keys"
    )
    for sub in (model, prediction):  # accepted after the command as well
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        sub.add_argument("--use-case", metavar="NAME", default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    keys = dict(args.keys) if args.command == "prediction" else {}
    if len(keys) < len(getattr(args, "keys", ())):
        parser.error("a key is given twice")

    import dagster as dg

    from cli.run import choose_use_case
    from pipelines.definitions import USE_CASES, defs
    from resources.registry import MlflowRegistry

    try:
        case = choose_use_case(USE_CASES, args.use_case)
    except ValueError as error:
        parser.error(str(error))
    home = os.environ.get("DAGSTER_HOME")
    if not home or not Path(home).is_dir():
        sys.stderr.write(
            f"lineage: DAGSTER_HOME={home!r} is not the folder of a Dagster instance\n"
        )
        return 2
    registry = (defs.resources or {}).get("mlflow")
    if not isinstance(registry, MlflowRegistry):
        sys.stderr.write("lineage: the definitions have no MLflow registry (resource `mlflow`)\n")
        return 2
    try:
        with (
            dg.DagsterInstance.get() as instance,
            # Its EnvVar settings, read now; on the open instance (alone, it would start an
            # ephemeral one: a second or more).
            dg.build_resources({"mlflow": registry}, instance=instance) as resources,
        ):
            registry = resources.mlflow
            if args.command == "model":
                lineage = model_lineage(instance, defs, registry, case, args.version, args.name)
            else:
                lineage = prediction_lineage(instance, defs, registry, case, args.day, keys)
    except LineageError as error:
        sys.stderr.write(f"lineage: {error}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(lineage.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(lineage.render())
    return 0


if __name__ == "__main__":
    # A one-shot command. Dagster's and MLflow's imports create ~400,000 objects that live until
    # exit; with the cyclic collector on, Python scans them ~1,000 times while they load and again
    # at exit: 3 s of CPU in a 7 s lineage. What the command creates and drops is freed by
    # reference counting. Frozen, the objects are skipped by the collections at exit.
    gc.disable()
    try:
        sys.exit(main())
    finally:
        gc.freeze()
