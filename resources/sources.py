"""Where raw data comes from: a use case's bundled data set (its own `RawSource`), or a folder of
daily drops.

Both sources hand back a table exactly as received (pandas' own type inference, no cleaning), so
that validation sees what arrived. In a CSV drop only the text a contract declares as missing
(`missing_values`) becomes a missing value: pandas would otherwise also take `NULL`, `null`,
`N/A`, `nan` and more for one, and a value sent as `NULL` would pass as a legitimately empty one.

The one thing a source does decide is how timestamp columns are parsed, because it must not hide
a missing timezone: ISO strings with an offset become UTC-aware values; strings without one stay
timezone-naive for validation to refuse; anything else stays text.

A drop folder is a boundary: a drop or table folder that is a link is refused by name, and a
table records the real file it was read from with the sha256 of its bytes.

A drop is read a chunk of rows at a time (`read_day_chunks`), so that a day's size bounds the
time it takes, not the memory: a first pass over the file hashes its bytes and learns the type
pandas gives each column in each chunk, a second pass parses it again with the types of the
whole file (a column that is a number in one chunk and text in another is text in all), so the
chunks concatenate to the frame one whole read would give. A drop of one chunk, the usual case,
is parsed once.

A drop is taken only once it has stopped moving: one modified less than `settle_s` ago is watched
until it is that old, and refused as still being written if its size or modification time changed
meanwhile; where the producer writes a completion marker (`completion_suffix`), a drop without one
is refused instead. Every read then checks that the file it parsed is the file as it was when the
read began (its size and modification time, and the count of bytes hashed): comparing the two
passes with each other alone let a drop still being appended to through, because a day of one
chunk has no second pass, and a producer that pauses between writes leaves a truncated file that
reads the same twice.
"""

import datetime as dt
import hashlib
import io
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

import dagster as dg
from pydantic import Field

from resources.timestamps import (
    TimestampForm,
    apply_timestamp_forms,
    combined_form,
    parsed_form,
)

if TYPE_CHECKING:
    import pandas as pd

_TABLE_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
DROP_SUFFIXES = (".csv", ".parquet")


class SourceError(Exception):
    """A drop that cannot be read as a table; the message names the table, the day and the file,
    and `rule` the refusal's rule."""

    def __init__(self, message: str, rule: str = "readable_drop") -> None:
        super().__init__(message)
        self.rule = rule


DEFAULT_MAX_DROP_MIB = 256
"""A real day of the bundled data sets is about 0.1 MiB of CSV. Ingestion, validation,
publishing and the feature tables read a drop in chunks, but the online store's materialization
holds a view's rows of the day as one Arrow table, and scoring and drift a day's keys and scores:
a day of 96 MB of CSV peaks at 1.2 GiB there (docs/benchmarks.md, the large drop), so a 256 MiB
drop keeps a day's run near 3 GiB."""

DEFAULT_SETTLE_S = 2.0
"""A producer that writes a drop in place, rather than renaming it in whole, pauses between its
writes for milliseconds; a drop left unchanged for 2 s is taken as finished. A slower producer
needs a longer settle time, or a completion marker (`completion_suffix`)."""

COMPRESSED = {
    b"\x1f\x8b": "gzip-compressed",
    b"PK\x03\x04": "a zip archive",
    b"BZh": "bzip2-compressed",
    b"\xfd7zXZ\x00": "xz-compressed",
    b"\x28\xb5\x2f\xfd": "zstd-compressed",
}
"""How a compressed file begins, and what it is called in a refusal."""

DEFAULT_CHUNK_MIB = 4
"""A chunk of 4 MiB of CSV is about 40,000 rows of 19 columns; reading, validating and publishing
one costs about 19 times that in memory (docs/benchmarks.md, the large drop)."""


@dataclass(frozen=True)
class RawTable:
    """One table as received, and where it was read from."""

    frame: "pd.DataFrame"
    uri: str
    """The real file the rows were read from (never a link to it)."""
    sha256: str
    """sha256 of that file's bytes, as read."""


@dataclass(frozen=True)
class RawChunks:
    """One table as received, handed over a chunk of rows at a time. Each call of `frames`
    reads the table again from the start; a drop whose bytes are no longer the ones `sha256`
    names is refused there, by a SourceError."""

    uri: str
    """The real file the rows are read from (never a link to it)."""
    sha256: str
    """sha256 of that file's bytes, as read."""
    rows: int
    frames: Callable[[], Iterator["pd.DataFrame"]] = field(repr=False)
    """The chunks, in order, each with its own index from 0; at least one, empty for a table
    of no rows. Every chunk has the same columns and dtypes."""

    def whole(self) -> RawTable:
        """All the chunks as one frame."""
        import pandas as pd

        frames = list(self.frames())
        frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
        return RawTable(frame=frame, uri=self.uri, sha256=self.sha256)


class RawSource(dg.ConfigurableResource, ABC):
    """Where raw tables come from: daily event tables and unpartitioned dimension tables."""

    @abstractmethod
    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        """The rows of `table` for one local calendar day, as received. `missing_values` maps a
        column to the text that means missing in it (a column not named has none); None keeps
        pandas' default list."""

    def read_day_chunks(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawChunks:
        """`read_day`'s rows a chunk at a time. A source whose days fit in memory needs nothing
        more than `read_day`: its day is one chunk."""
        drop = self.read_day(
            table, day, timestamp_columns=timestamp_columns, missing_values=missing_values
        )
        return RawChunks(drop.uri, drop.sha256, len(drop.frame), lambda: iter([drop.frame]))

    @abstractmethod
    def read_table(self, table: str) -> RawTable:
        """A whole dimension table, as received."""

    @abstractmethod
    def table_columns(self) -> Mapping[str, tuple[str, ...]] | None:
        """The tables this source delivers, each with its columns in order, known without
        reading a row: a use case's contracts are checked against its declared source's schema
        when the code location loads (`declare.references.check_source`). None: known only once
        the data arrives."""


class DropFolderSource(RawSource):
    """A folder of drops: `<root>/<table>/<YYYY-MM-DD>.csv|.parquet` for daily tables and
    `<root>/<table>.csv|.parquet` for dimension tables. This is how a real user's data arrives."""

    root: str = Field(description="Folder that holds the drops.")
    max_drop_mib: float = Field(
        default=DEFAULT_MAX_DROP_MIB,
        gt=0,
        description="Largest drop file read, in MiB: a larger one is refused before it is"
        " parsed, naming its size and this limit (parsing takes a multiple of the file's size"
        " in memory).",
    )

    chunk_mib: float = Field(
        default=DEFAULT_CHUNK_MIB,
        gt=0,
        description="Size of the part of a drop parsed at a time, in MiB of the file: a day's"
        " ingestion, validation and publication hold about one chunk's rows at a time.",
    )

    settle_s: float = Field(
        default=DEFAULT_SETTLE_S,
        ge=0,
        description="How long a drop must stay unchanged (size and modification time) before it"
        " is read: a younger one is watched until it is that old, and refused as still being"
        " written if it changed meanwhile. Not waited when `completion_suffix` is set.",
    )
    completion_suffix: str | None = Field(
        default=None,
        pattern=r"^\.[A-Za-z0-9_.-]+$",
        description="Where the producer declares a drop complete by writing a marker beside it:"
        " the marker's suffix to the drop's name (`.done`: `2013-01-02.csv.done`). A drop"
        " without its marker is refused as not complete.",
    )

    def read_day(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawTable:
        chunks = self.read_day_chunks(
            table, day, timestamp_columns=timestamp_columns, missing_values=missing_values
        )
        return chunks.whole()

    def read_day_chunks(
        self,
        table: str,
        day: dt.date,
        *,
        timestamp_columns: Sequence[str] = (),
        missing_values: Mapping[str, Sequence[str]] | None = None,
    ) -> RawChunks:
        what = f"table {table!r}, day {day}"
        root = Path(self.root).resolve()
        folder = _not_a_link(root, root / checked_table_name(table), what=what)
        path = _single_drop(root, folder, day.isoformat(), what=what)
        self._settled(root, path, what)
        return _Drop(path, what, self._limit, self._chunk, missing_values).scan(timestamp_columns)

    def read_table(self, table: str) -> RawTable:
        what = f"table {table!r}"
        root = Path(self.root).resolve()
        path = _single_drop(root, root, checked_table_name(table), what=what)
        self._settled(root, path, what)
        return _Drop(path, what, self._limit, self._chunk).scan().whole()

    def table_columns(self) -> None:
        """Unknown until the drops arrive: a use case that declares a drop folder as its source
        (a scaffolded one) has its contracts' columns checked only as each drop is validated. A
        deployment that reads a drop folder in place of a use case's bundled data set expects in
        every drop the columns of the bundled source's schema, which the contracts were checked
        against at load; there is no second schema. Either way a drop that lacks a contract's
        column, or carries one it does not declare, is refused when it is validated (the
        contract's `columns.match_contract` rule), naming the missing and unexpected columns."""
        return None

    def _settled(self, root: Path, path: Path, what: str) -> None:
        """Refuses a drop that is not complete: without its completion marker where the source
        declares one, else changed during the settle time (waited only for a drop modified less
        than `settle_s` ago)."""
        if self.completion_suffix is not None:
            marker = path.with_name(path.name + self.completion_suffix)
            _not_a_link(root, marker, what=what)
            if not marker.is_file():
                raise SourceError(
                    f"{what}: {path} has no completion marker {marker.name}: the producer has"
                    " not declared it complete; it is read once the marker is written",
                    rule=STILL_BEING_WRITTEN,
                )
            return
        before = _state(path)
        age_s = time.time() - before[1] / 1e9
        if age_s >= self.settle_s:
            return
        settle_wait(self.settle_s - max(age_s, 0.0))
        after = _state(path)
        if after != before:
            raise SourceError(
                f"{what}: {path} is still being written: {_moved(before, after)} within the"
                f" settle time of {self.settle_s:g} s (settle_s); it is read once it stops"
                " changing",
                rule=STILL_BEING_WRITTEN,
            )

    @property
    def _limit(self) -> int:
        return int(self.max_drop_mib * 2**20)

    @property
    def _chunk(self) -> int:
        return max(int(self.chunk_mib * 2**20), 1)


STILL_BEING_WRITTEN = "drop_complete"
"""The rule a drop that is still moving, or not declared complete, is refused by."""


def settle_wait(seconds: float) -> None:
    """Let a young drop age to the settle time before it is looked at again."""
    time.sleep(seconds)


def _state(path: Path) -> tuple[int, int]:
    """A file's size in bytes and modification time in ns."""
    status = path.stat()
    return status.st_size, status.st_mtime_ns


def _moved(before: tuple[int, int], after: tuple[int, int]) -> str:
    """How a file changed between two looks at it."""
    if after[0] != before[0]:
        return f"it grew from {before[0]} to {after[0]} bytes"
    return f"it was rewritten ({before[0]} bytes, modified again)"


def checked_table_name(table: str) -> str:
    if not _TABLE_NAME.fullmatch(table):
        raise ValueError(f"table name {table!r} must match {_TABLE_NAME.pattern}")
    return table


def _not_a_link(root: Path, entry: Path, *, what: str) -> Path:
    """`entry`, refused by name if it is a link: a drop folder must not read files from elsewhere
    on the machine. With `root` resolved and neither the table folder nor the drop a link, a drop
    cannot resolve outside the root."""
    if entry.is_symlink():
        raise SourceError(f"{what}: {entry.relative_to(root)} is a link; drops must be real files")
    return entry


def _single_drop(root: Path, folder: Path, stem: str, *, what: str) -> Path:
    entries = [folder / f"{stem}{suffix}" for suffix in DROP_SUFFIXES]
    # A link counts as found, dangling or not, so that it is refused rather than reported missing.
    found = [_not_a_link(root, e, what=what) for e in entries if e.is_symlink() or e.is_file()]
    if not found:
        raise SourceError(f"{what}: no drop at {folder}/{stem}{{{','.join(DROP_SUFFIXES)}}}")
    if len(found) > 1:
        raise SourceError(f"{what}: ambiguous drop, both {found[0].name} and {found[1].name}")
    return found[0]


class _HashingReader(io.RawIOBase):
    """A binary file read through, hashing every byte handed out."""

    def __init__(self, file: IO[bytes]) -> None:
        self._file = file
        self.digest = hashlib.sha256()
        self.size = 0

    def readable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._file.fileno()

    def readinto(self, buffer: Any) -> int:
        data = self._file.read(len(buffer))
        buffer[: len(data)] = data
        self.digest.update(data)
        self.size += len(data)
        return len(data)


@dataclass(frozen=True)
class _Opened:
    """A drop file open for one pass, and how it was when the pass began."""

    file: Any
    """What the parser reads: the file through a hash (CSV), or the file itself (Parquet)."""
    start: tuple[int, int]
    """Its size in bytes and modification time in ns when it was opened."""
    descriptor: int


@dataclass(frozen=True)
class _Drop:
    """One drop file, parsed a chunk at a time (see the module's docstring)."""

    path: Path
    what: str
    limit: int
    chunk_bytes: int
    missing_values: Mapping[str, Sequence[str]] | None = None

    def scan(self, timestamp_columns: Sequence[str] = ()) -> RawChunks:
        """First pass: the file's sha256, row count, and what every column holds across all
        chunks; the chunks come from a second pass (none if the file is one chunk)."""
        dtypes: dict[str, set[Any]] = {}
        forms: dict[str, set[TimestampForm | None]] = {c: set() for c in timestamp_columns}
        first, count, rows = None, 0, 0
        with self._open() as opened:
            for chunk in self._parse(opened.file, {}):
                count, rows, parsed = count + 1, rows + len(chunk), {}
                for column, dtype in chunk.dtypes.items():
                    dtypes.setdefault(str(column), set()).add(dtype)
                for column in forms.keys() & set(chunk.columns):
                    form, values = parsed_form(chunk[column])
                    forms[column].add(form)
                    if values is not None:
                        parsed[column] = values
                first = chunk.assign(**parsed) if parsed else chunk
            sha256 = self._hexdigest(opened)
        settled: dict[str, TimestampForm] = {}
        for column, found in forms.items():
            form = combined_form(found)
            if form is not None:
                settled[column] = form
        if count == 1:  # parsed already: its forms are the file's
            assert first is not None
            return RawChunks(self.uri, sha256, rows, lambda: iter([first]))
        common = {c: _common_dtype(s) for c, s in dtypes.items() if len(s) > 1}

        def frames() -> Iterator["pd.DataFrame"]:
            with self._open() as opened:
                for chunk in self._parse(opened.file, common):
                    yield apply_timestamp_forms(chunk, settled)
                if self._hexdigest(opened) != sha256:
                    raise SourceError(
                        f"{self.what}: {self.path} changed while it was read (sha256 was"
                        f" {sha256[:12]}); drops must be replaced whole, by a rename"
                    )

        return RawChunks(self.uri, sha256, rows, frames)

    @property
    def uri(self) -> str:
        return self.path.as_uri()

    @contextmanager
    def _open(self) -> Iterator[_Opened]:
        """The file, checked against the size limit, read through a hash (CSV; a Parquet file is
        read from its footer, so it is hashed whole on its own); a CSV file that is compressed is
        refused by name."""
        try:
            # O_NOFOLLOW: a link swapped in after the checks above is still not followed.
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError as exc:
            raise SourceError(f"{self.what}: {self.path} cannot be read: {exc}") from exc
        with os.fdopen(descriptor, "rb") as file:
            status = os.fstat(descriptor)
            size = status.st_size
            if size > self.limit:
                raise SourceError(
                    f"{self.what}: {self.path} is {size / 2**20:.3g} MiB ({size} bytes), over"
                    f" the limit of {self.limit / 2**20:.3g} MiB ({self.limit} bytes,"
                    " max_drop_mib); refused before parsing."
                    " Split the drop or raise the limit where the run has the memory for it",
                    rule="drop_within_size_limit",
                )
            if size == 0:
                raise SourceError(
                    f"{self.what}: {self.path} is an empty file (0 bytes, not even a header)"
                )
            start = (size, status.st_mtime_ns)
            if self.path.suffix == ".parquet":
                yield _Opened(file, start, descriptor)
                return
            self._not_compressed(descriptor)
            yield _Opened(_HashingReader(file), start, descriptor)

    def _not_compressed(self, descriptor: int) -> None:
        head = os.pread(descriptor, 8, 0)
        for magic, what in COMPRESSED.items():
            if head.startswith(magic):
                raise SourceError(
                    f"{self.what}: {self.path} is {what}, not a plain CSV file; drops are"
                    f" uncompressed {' or '.join(DROP_SUFFIXES)} files (a Parquet file compresses"
                    " itself)"
                )

    def _hexdigest(self, opened: _Opened) -> str:
        """The sha256 of the file's bytes, reading what the parser left unread; refuses a file
        that is not, at the end of the pass, the file it was when the pass began."""
        file = opened.file
        if isinstance(file, _HashingReader):
            while file.read(1 << 20):  # whatever the parser left unread
                pass
            digest, hashed = file.digest, file.size
        else:
            file.seek(0)
            digest, hashed = hashlib.sha256(), 0
            for block in iter(lambda: file.read(1 << 20), b""):
                digest.update(block)
                hashed += len(block)
        status = os.fstat(opened.descriptor)
        end = (max(status.st_size, hashed), status.st_mtime_ns)
        if end != opened.start:
            raise SourceError(
                f"{self.what}: {self.path} is still being written: {_moved(opened.start, end)}"
                " while it was read; a drop must be complete before it lands (written elsewhere"
                " and renamed in, or followed by its completion marker)",
                rule=STILL_BEING_WRITTEN,
            )
        return digest.hexdigest()

    def _parse(self, file: Any, dtypes: Mapping[str, Any]) -> Iterator["pd.DataFrame"]:
        """The chunks; `dtypes` are the columns' types where the chunks differ."""
        import pandas as pd
        import pyarrow as pa

        try:
            if self.path.suffix == ".parquet":
                for chunk in self._parquet_chunks(file):
                    yield chunk.astype(dict(dtypes)) if dtypes else chunk
                return
            with pd.read_csv(
                file,
                chunksize=self._csv_rows_per_chunk(file.fileno()),
                dtype=cast(Any, dict(dtypes)),
                low_memory=False,
                **_na_options(self.missing_values),
            ) as chunks:
                for chunk in chunks:
                    yield chunk.reset_index(drop=True)
        except (
            pd.errors.ParserError,
            pd.errors.EmptyDataError,
            pa.ArrowException,
            UnicodeDecodeError,
            OSError,
        ) as exc:
            raise SourceError(f"{self.what}: {self.path} is corrupt or truncated: {exc}") from exc

    def _csv_rows_per_chunk(self, descriptor: int) -> int:
        """Rows in `chunk_bytes` of the file, judged by the lines of its first block (read
        without moving the file's position)."""
        block = os.pread(descriptor, min(self.chunk_bytes, 1 << 20), 0)
        lines = max(block.count(b"\n"), 1)
        return max(self.chunk_bytes * lines // max(len(block), 1), 1)

    def _parquet_chunks(self, file: Any) -> Iterator["pd.DataFrame"]:
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(file)
        metadata = parquet.metadata
        size = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        rows = max(self.chunk_bytes * metadata.num_rows // max(size, 1), 1)
        empty = True
        for batch in parquet.iter_batches(batch_size=rows):
            empty = False
            yield batch.to_pandas().reset_index(drop=True)
        if empty:
            yield parquet.schema_arrow.empty_table().to_pandas()


def _common_dtype(dtypes: set[Any]) -> Any:
    """The dtype a whole read gives a CSV column whose chunks were read as `dtypes`: numbers
    with a missing value or a fraction anywhere are floats everywhere; anything else is text."""
    import numpy as np
    import pandas as pd

    if all(pd.api.types.is_numeric_dtype(d) and not pd.api.types.is_bool_dtype(d) for d in dtypes):
        return np.float64
    return object


def _na_options(missing_values: Mapping[str, Sequence[str]] | None) -> dict[str, Any]:
    """`read_csv` options under which exactly the declared text is missing."""
    if missing_values is None:
        return {}
    return {
        "keep_default_na": False,
        "na_values": {column: list(tokens) for column, tokens in missing_values.items()},
    }
