"""Write-audit-publish of an event table's days, the work of `assets.validation` without
Dagster: a day's drop written to the lake as received, audited against its contract by GX
(`ContractAudit`), and published without the rows broken by row rules, beside those rows and the
rules they broke. A day its source, its contract or its table's revisions refuse raises
`DayRefused`, naming its partition, rule and count; its last published version is never touched.

`EventDays` does the work of one step: `one` day, or `many` days, ingested first and then
screened together by GX, each day validated alone only where screening did not pass it. It
yields what it wrote and found as it goes (`Written`, `Audited`), so that a refused day still
has its raw partition and its check recorded; the step turns them into Dagster's events. The lake
reaches it as a `TableLake`, which names a use case's assets by name (`raw_<table>`,
`validated_<table>`, `quarantined_<table>`).
"""

import dataclasses
import datetime as dt
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from declare import EventTable, partition_day
from declare.contracts import TableContract
from ml import holds
from ml.results import Link
from resources.contract_frames import StorageError, as_stored, typed_empty
from resources.expectations import GreatExpectations
from resources.lake import Chunks, LakeTable, Stored, stored_hash
from resources.revisions import (
    Counter,
    HeldBack,
    Version,
    against_last_good,
    against_same_events,
    published_version,
)
from resources.sources import RawChunks, RawSource, SourceError
from resources.validation_report import ValidationReport

if TYPE_CHECKING:
    import pandas as pd

HOLD_IN_PUBLISHING = "ML_LIFECYCLE_HOLD_IN_PUBLISHING"
"""For tests that stop a day's ingestion mid-way: a file path. Once the first day a process
publishes is audited, and before any of its rows are published, the step holds there
(`ml.holds`), in its own thread: a stop reaches it at once, and nothing of the day is published."""

REJECTED_BY = "rejected_by"
"""Column of a quarantined row that names the rule(s) that rejected it."""


class DayRefused(Exception):
    """A day that is not published, and why: the message names its partition, rule and count."""

    def __init__(self, partition_key: str, rule: str, message: str):
        super().__init__(message)
        self.partition_key, self.rule = partition_key, rule


def read_drop(source: RawSource, contract: TableContract, partition_key: str) -> RawChunks:
    """The day's drop, handed to the lake a chunk at a time (an empty day typed as its contract
    says: its `min_rows` decides its fate). Nothing is written unless every chunk is read: the
    lake keeps the last drop that could be."""
    day = partition_day(partition_key)
    try:
        drop = source.read_day_chunks(
            contract.table,
            day,
            timestamp_columns=contract.timestamp_columns,
            missing_values=contract.missing_values_by_column,
        )
    except SourceError as exc:
        raise _refused(partition_key, exc) from exc

    def frames() -> "Iterator[pd.DataFrame]":
        try:
            for chunk in drop.frames():
                yield typed_empty(contract, chunk) if drop.rows == 0 else chunk
        except SourceError as exc:
            raise _refused(partition_key, exc) from exc

    return dataclasses.replace(drop, frames=frames)


def drop_metadata(drop: RawChunks) -> dict[str, Any]:
    """What a raw partition's materialization records of the drop it was read from: the real
    file, the sha256 of the bytes read, and its rows."""
    return {"source": Link(drop.uri), "source_sha256": drop.sha256, "source_rows": drop.rows}


def _refused(partition_key: str, exc: SourceError) -> DayRefused:
    return DayRefused(
        partition_key, exc.rule, f"partition {partition_key}: rule {exc.rule} failed: {exc}"
    )


SCREEN_TOGETHER_ROWS = 1_000_000
"""Most rows a range's days are screened with in one GX pass (`ContractAudit.screen`); more days
are screened in several passes, fewer rows each, so that a range of large days is never held
whole."""


@dataclass(frozen=True)
class ContractAudit:
    """An event table's days audited against its contract by GX."""

    expectations: GreatExpectations
    contract: TableContract
    timezone: str
    window: Callable[[str], tuple[dt.datetime, dt.datetime]]
    """A day's bounds in UTC, by its partition key."""
    references: "Mapping[str, pd.DataFrame]" = field(default_factory=dict)
    """The dimension tables the contract's `allowed_from` rules name."""

    def day(
        self, partition_key: str, raw: LakeTable, *, data_docs: bool = True
    ) -> ValidationReport:
        """Validate one raw partition against its contract, a row group of the lake file at a
        time."""
        return self.expectations.validate_chunks(
            self.contract,
            raw.frames,
            partition=partition_key,
            window=self.window(partition_key),
            timezone=self.timezone,
            references=self._reference_sets(),
            data_docs=data_docs,
        )

    def screen(self, days: Mapping[str, LakeTable]) -> dict[str, ValidationReport]:
        """The reports of the raw `days` that pass their contract whole, screened together a
        batch of consecutive days at a time (`GreatExpectations.screen_days`): the usual day of
        a backfill pays GX's fixed cost once a batch instead of once a day. A day missing from
        the result (one with a failed rule, one of a batch with one, a day stored in several row
        groups) is for `day` to validate alone."""
        from resources.gx_screening import DayFrame

        batches: list[list[DayFrame]] = [[]]
        rows = 0
        for key, raw in days.items():
            if raw.row_groups != 1:
                continue
            frame = next(raw.frames())
            if rows + len(frame) > SCREEN_TOGETHER_ROWS and batches[-1]:
                batches.append([])
                rows = 0
            batches[-1].append(DayFrame(key, frame, self.window(key)))
            rows += len(frame)
        sets = self._reference_sets()
        reports: dict[str, ValidationReport] = {}
        for batch in batches:
            reports |= self.expectations.screen_days(
                self.contract, batch, timezone=self.timezone, references=sets
            )
        return reports

    def _reference_sets(self) -> dict[str, list[Any]]:
        """The values of each reference set the contract's `allowed_from` rules name."""
        sets = {}
        for reference in self.contract.references:
            table, column = reference.split(".", 1)
            sets[reference] = self.references[table][column].dropna().tolist()
        return sets


def split(raw: LakeTable, report: ValidationReport) -> tuple[Chunks, Chunks]:
    """(published rows, quarantined rows with the rules that rejected them), a row group of the
    raw partition at a time; refuses a day that failed its contract."""
    if not report.passed:
        rule = report.failed_rules[0].rule if report.failed_rules else "contract"
        raise DayRefused(report.partition, rule, f"not published: {report.summary()}")
    reasons = report.rejection_reasons()

    def parts(keep: bool) -> "Iterator[pd.DataFrame]":
        import numpy as np
        import pandas as pd

        positions = np.array(sorted(reasons), dtype=np.int64)
        offset = 0
        for chunk in raw.frames():
            start, end = np.searchsorted(positions, [offset, offset + len(chunk)])
            rejected = np.zeros(len(chunk), dtype=bool)
            rejected[positions[start:end] - offset] = True
            offset += len(chunk)
            if keep:
                yield chunk.loc[~rejected].reset_index(drop=True)
                continue
            why = pd.Series([reasons[p] for p in positions[start:end]], dtype="string")
            yield chunk.loc[rejected].reset_index(drop=True).assign(**{REJECTED_BY: why})

    return Chunks(lambda: parts(True)), Chunks(lambda: parts(False))


class TableLake(Protocol):
    """The lake, as a use case's step writes and reads its assets: by asset name."""

    def write(self, asset: str, partition_key: str, rows: "pd.DataFrame | Chunks") -> Stored: ...

    def table(self, asset: str, partition_key: str) -> LakeTable:
        """The stored file of one day; raises FileNotFoundError for one never materialized."""
        ...


@dataclass(frozen=True)
class Selection:
    """What a step records of each of its days: which of the table's assets, and whether its
    contract check."""

    raw: bool
    check: bool
    validated: bool
    quarantined: bool

    @property
    def publishing(self) -> bool:
        return self.validated or self.quarantined

    @property
    def auditing(self) -> bool:
        """Whether the day must be audited: for its check, or for its published rows."""
        return self.check or self.publishing


@dataclass(frozen=True)
class Written:
    """A day of an asset the lake wrote, to be recorded as its materialization."""

    asset: str
    partition_key: str
    stored: Stored
    metadata: Mapping[str, Any] = field(default_factory=dict)
    """What the step adds to the lake's own metadata of the file (`stored.metadata`)."""
    parent: str | None = None
    """The data version of the raw day a published day was made from."""


@dataclass(frozen=True)
class Audited:
    """A day's contract check: its report."""

    partition_key: str
    report: ValidationReport


@dataclass(frozen=True)
class RawDay:
    """A raw day in the lake, and its data version (its content hash)."""

    partition_key: str
    table: LakeTable
    version: str


@dataclass(frozen=True)
class EventDays:
    """One event table's days, as a step ingests, audits and publishes them."""

    table: EventTable
    same_events: Sequence[str]
    """The event tables declared to describe the same events (`UseCase.same_events`)."""
    step: str
    """The step's name, which the run config that accepts a held-back version names."""
    lake: TableLake
    source: RawSource
    audit: ContractAudit
    selection: Selection
    accepted: Set[str] = frozenset()
    """Days whose new version is published although the table's revisions would hold it back."""

    def one(self, partition_key: str) -> Iterator[Written | Audited]:
        """Ingest, audit and publish one day, as far as the selection asks; raises DayRefused
        (after yielding the raw day and its check) for a day that is not published."""
        raw = yield from self.ingest(partition_key, write=self.selection.raw)
        yield from self.publish(raw, ranged=False)

    def many(
        self, days: Sequence[str], raw_recorded: Set[str] = frozenset()
    ) -> Iterator[Written | Audited | DayRefused]:
        """Each of `days` ingested, then audited and published as far as the selection asks; a
        day refused is refused alone, yielded once the others' work is done. The raw days of
        `raw_recorded` (an earlier try recorded them) are read back from the lake."""
        refused: list[DayRefused] = []
        ingested: dict[str, RawDay] = {}
        for key in days:
            write = self.selection.raw and key not in raw_recorded
            try:
                ingested[key] = yield from self.ingest(key, write=write)
            except DayRefused as exc:
                refused.append(exc)
        screened = {}
        if len(ingested) > 1 and self.selection.auditing:
            screened = self.audit.screen({key: raw.table for key, raw in ingested.items()})
        for key, raw in ingested.items():
            try:
                yield from self.publish(raw, ranged=True, screened=screened.get(key))
            except DayRefused as exc:
                refused.append(exc)
        yield from refused

    def ingest(self, partition_key: str, *, write: bool) -> Generator[Written, None, RawDay]:
        """The day's raw table: written from its drop (`write`) and yielded, or read back from
        the lake; raises DayRefused for a drop the source refuses."""
        raw = f"raw_{self.table.name}"
        if not write:
            table = self.lake.table(raw, partition_key)
            return RawDay(partition_key, table, stored_hash(table.path) or "")
        drop = read_drop(self.source, self.table.contract, partition_key)
        stored = self.lake.write(raw, partition_key, Chunks(drop.frames))
        yield Written(raw, partition_key, stored, drop_metadata(drop))
        return RawDay(partition_key, stored.table, stored.data_version.value)

    def audited(
        self, raw: RawDay, *, ranged: bool, screened: ValidationReport | None = None
    ) -> ValidationReport:
        """The raw day's report: `screened`'s, or its own validation."""
        if screened is not None:
            return screened
        checking, key = self.selection.check, raw.partition_key
        # A range renders Data Docs for its refused days only: a page is the place to read a
        # refusal from, and one for every passing day of a year would double the backfill's time.
        report = self.audit.day(key, raw.table, data_docs=checking and not ranged)
        if checking and ranged and not report.passed:
            report = self.audit.day(key, raw.table)
        return report

    def publish(
        self, raw: RawDay, *, ranged: bool, screened: ValidationReport | None = None
    ) -> Iterator[Written | Audited]:
        """Audit the raw day (unless `screened` already holds its report), yield its check, and
        publish its rows, as far as the selection asks; raises DayRefused for a day that is not
        published."""
        chosen, key, name = self.selection, raw.partition_key, self.table.name
        if not chosen.auditing:
            return
        report = self.audited(raw, ranged=ranged, screened=screened)
        if chosen.check:
            yield Audited(key, report)
        holds.hold(HOLD_IN_PUBLISHING)
        published, rejected = split(raw.table, report)  # refuses a day that failed its contract
        if not chosen.publishing:
            return
        revision = self.revision(key) if chosen.validated else None
        for asset, rows, wanted in (
            (f"validated_{name}", self.stored_rows(key, published, revision), chosen.validated),
            (f"quarantined_{name}", rejected, chosen.quarantined),
        ):
            if wanted:
                stored = self.lake.write(asset, key, rows)
                yield Written(asset, key, stored, parent=raw.version)

    def stored_rows(
        self, partition_key: str, published: Chunks, revision: "Revision | None"
    ) -> Chunks:
        """The published rows as the lake stores them: typed as the contract declares, through
        the table's `publish`, its flags counted (reported once the lake has written them) and,
        for a new version, held to its revisions before the lake commits the file."""
        table, counts = self.table, dict.fromkeys(self.table.counted_flags, 0)

        def rows() -> "Iterator[pd.DataFrame]":
            for chunk in published.frames():
                try:
                    chunk = as_stored(table.contract, chunk)
                except StorageError as exc:
                    raise DayRefused(
                        partition_key, exc.rule, f"partition {partition_key}: not published: {exc}"
                    ) from exc
                if table.publish is not None:
                    chunk = table.publish(chunk)
                for flag in table.counted_flags:
                    counts[flag] += int(chunk[flag].sum())
                if revision is not None:
                    revision.counter.add(chunk)
                yield chunk
            # Raised before the lake commits the file: the last good version stays published.
            if revision is not None:
                revision.check()

        return Chunks(rows, metadata=lambda: counts)

    def revision(self, partition_key: str) -> "Revision":
        """A new version of the day, to be counted as it is written and held to the last good
        version and to the published days of the same events."""
        last = self._published(f"validated_{self.table.name}", partition_key)
        others = {}
        for other in self.same_events:
            table = self._published(f"validated_{other}", partition_key)
            if table is not None:
                others[other] = table.rows
        version = last and published_version(last)
        return Revision(self, partition_key, version, others)

    def _published(self, asset: str, partition_key: str) -> LakeTable | None:
        """The published file of one day, None before its first publication."""
        try:
            return self.lake.table(asset, partition_key)
        except FileNotFoundError:
            return None


@dataclass
class Revision:
    """A new version of a published day, counted as it is written, and what it is held to: the
    last good version of the day, and the published days of the tables declared to describe
    the same events (`resources.revisions`)."""

    days: EventDays
    partition_key: str
    last: Version | None
    same_events: dict[str, int]
    counter: Counter = field(default_factory=Counter)

    def check(self) -> None:
        """Raises DayRefused for a new version its table's declared revisions hold back, unless
        a person accepted the day."""
        key = self.partition_key
        if key in self.days.accepted:
            return
        table, new = self.days.table, self.counter.version
        revisions = table.revisions
        held: list[HeldBack | None] = [
            against_same_events(table.name, new.rows, other, rows, revisions)
            for other, rows in sorted(self.same_events.items())
        ]
        if self.last is not None:
            held.insert(0, against_last_good(table.name, new, self.last, revisions))
        reason = next((h for h in held if h is not None), None)
        if reason is None:
            return
        raise DayRefused(
            key,
            reason.rule,
            f"partition {key}: held back, rule {reason.rule} failed: {reason.message}. The"
            " published version stays; if the new one is right, publish it with the run config"
            f" ops: {{{self.days.step}: {{config: {{accept_revisions: ['{key}']}}}}}}",
        )
