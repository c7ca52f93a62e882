"""A lineage's walk through Dagster's event log: every materialization below
`registered_model`, found by walking the asset graph's parents of each recorded materialization:
an unpartitioned parent through the `dagster/input_event_pointer/<key>` tag Dagster wrote, a
partitioned parent as the latest materialization of each mapped partition recorded before the
child's. Dagster also records, per input, one data version for the mapped partitions together
(sha256 of their versions in partition order); where it did, the walk recomputes it from the
partitions it found and marks the input verified or not.

A partitioned parent of an unpartitioned child (the feature tables of `training_set`, which
Dagster maps with "all partitions") is narrowed to the days of the child's `window` metadata.
"""

import bisect
import datetime as dt
import hashlib
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cli.lineage_document import Input, LineageError, Materialization

# Nothing heavy is imported when this module loads (not `assets` either: the package imports
# Dagster), so that `make lineage` can set the garbage collector up first (cli/lineage.py).
if TYPE_CHECKING:
    import dagster as dg

    from declare import UseCase

PAGE = 1000
"""Event log records fetched per query (and partitions named per query)."""
_WINDOW = re.compile(r"\[(\d{4}-\d{2}-\d{2}), (\d{4}-\d{2}-\d{2})\)")


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


def registration(
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


def walk(
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
        versions = [data_version_of(p) for p in parents]
        verified = None if recorded is None else versions == [recorded]
        return parents, Input(name, None, [p.storage_id for p in parents], recorded, verified)
    parents = [
        p for day in read.partitions for p in log.latest_before(read.parent, day, record.storage_id)
    ]
    versions = [data_version_of(p) or "" for p in parents]
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
    return data_version_of(records[0]) if records else None


def data_version_of(record) -> str | None:
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
