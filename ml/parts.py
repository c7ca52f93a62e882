"""A training set as Parquet parts: a folder with a file per split and row range, and a manifest.

    training_set/
      manifest.json
      train/part-00000-<fingerprint>.parquet, train/part-00001-<fingerprint>.parquet, ...
      validation/part-00000-<fingerprint>.parquet
      test/part-00000-<fingerprint>.parquet

    manifest = write_parts(frame, folder, "split", fit=stats)   # the training_set asset
    data = TrainingSetFiles.open(folder)                          # a rank, the probes, preflight
    for chunk in data.frames("train"): ...                    # a row group at a time

The manifest lists every part: its split, the range of rows it holds, its file's sha256 and the
fingerprint of its rows (`ml.dataset.fingerprint`), and the fingerprint of the whole set, taken
over the parts' rows in order (the splits in `SPLITS` order, each by row range). That is the
rows' fingerprint, not the files': the same rows written by any engine, or read back from one
Parquet file, have it. `fit` holds what a `Preprocessor` is fitted from (`ml.data.FitStats`),
gathered from the train split as the parts were written, so a rank fits without reading it.

The manifest is the commit: the parts are written first, each under a name of its content,
and the manifest replaces the previous one whole; parts no manifest names are removed after.
A reader opens the manifest, then the parts it names.

`TrainingSetFiles` reads a folder of parts or one Parquet file (as `python -m ml.train` was always
given, and as a team may still give it): a file's row groups are read one at a time, and what a
manifest records is computed from it in one pass.
"""

import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Union

import pandas as pd

from ml.dataset import SPLITS, Fingerprint
from ml.files import FILE_MODE, atomic_put, atomic_write, make_folders

if TYPE_CHECKING:
    import pyarrow as pa
    from upath import UPath

    from ml.data import FitStats
    from ml.task import Task

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
ROWS_PER_PART = 262_144
"""Rows of a part file; a split's last part holds the rest."""
ROWS_PER_GROUP = 32_768
"""Rows of a Parquet row group: the most a reader holds of a part at once."""

Folder = Union[Path, "UPath"]


@dataclass(frozen=True)
class Part:
    """One part file: rows [first_row, first_row + rows) of its split."""

    split: str
    path: str
    """Relative to the folder."""
    first_row: int
    rows: int
    sha256: str
    """Of the file's bytes."""
    fingerprint: str
    """Of its rows (`ml.dataset.fingerprint`)."""


@dataclass(frozen=True)
class Manifest:
    """What a folder of parts holds."""

    fingerprint: str
    """Of every part's rows, in the manifest's order."""
    rows: int
    split_column: str
    columns: list[list[str]]
    """[name, dtype] of each column, as pandas reads them back."""
    parts: list[Part]
    fit: dict[str, Any] | None = None
    """`ml.data.FitStats.to_dict()` of the train split; None: not gathered."""
    format: int = FORMAT

    def rows_of(self, split: str) -> int:
        return sum(part.rows for part in self.parts if part.split == split)

    def parts_of(self, split: str | None) -> list[Part]:
        return [part for part in self.parts if split is None or part.split == split]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        values = json.loads(text)
        if values.get("format") != FORMAT:
            raise ValueError(f"a manifest of format {values.get('format')!r}; {FORMAT} is read")
        parts = [Part(**part) for part in values.pop("parts")]
        return cls(**values, parts=parts)


def write_parts(
    frame: pd.DataFrame,
    folder: Folder,
    split_column: str,
    *,
    fit: "FitStats | None" = None,
    rows_per_part: int = ROWS_PER_PART,
    permissions: int = FILE_MODE,
) -> Manifest:
    """Write `frame` to `folder` as parts by split (`SPLITS` order) and row range, with its
    manifest; `fit`, given, takes in the train split's rows as they go by and is recorded.
    A split with no rows has no part. Rows of one split keep their order; a frame whose splits
    are interleaved is stored grouped by split (the fingerprint is of the stored order)."""
    folder = _local(folder)
    unknown = sorted(set(frame[split_column].dropna().unique()) - set(SPLITS))
    missing = int(frame[split_column].isna().sum())
    if unknown or missing:
        raise ValueError(
            f"{missing} row(s) without a split and split(s) {unknown} outside {list(SPLITS)}"
        )
    whole, parts = Fingerprint(), []
    for split in SPLITS:
        rows = frame[frame[split_column] == split].reset_index(drop=True)
        for first in range(0, len(rows), rows_per_part):
            chunk = rows.iloc[first : first + rows_per_part].reset_index(drop=True)
            whole.update(chunk)
            if fit is not None and split == SPLITS[0]:
                fit.update(chunk)
            parts.append(_write_part(chunk, folder, split, len(parts), first, permissions))
    if not parts:
        raise ValueError("a training set without rows has no parts to write")
    manifest = Manifest(
        fingerprint=whole.hexdigest(),
        rows=len(frame),
        split_column=split_column,
        columns=[[str(c), str(t)] for c, t in frame.dtypes.items()],
        parts=parts,
        fit=None if fit is None or fit.numeric is None else fit.to_dict(),
    )
    _put(folder / MANIFEST, manifest.to_json().encode(), permissions)
    _remove_unnamed(folder, manifest)
    return manifest


def _write_part(
    chunk: pd.DataFrame, folder: Folder, split: str, number: int, first: int, permissions: int
) -> Part:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = Fingerprint().update(chunk).hexdigest()
    buffer = io.BytesIO()
    table = pa.Table.from_pandas(chunk, preserve_index=False)
    pq.write_table(table, buffer, row_group_size=ROWS_PER_GROUP)
    data = buffer.getvalue()
    relative = f"{split}/part-{number:05d}-{rows[:16]}.parquet"
    path = folder / relative
    sha256 = hashlib.sha256(data).hexdigest()
    if not (path.exists() and _sha256_of(path) == sha256):  # the same part: left as it is
        _put(path, data, permissions)
    return Part(split, relative, first, len(chunk), sha256, rows)


def _local(folder: Folder) -> Folder:
    """A `file://` location as the local path it is: written with the local file's modes."""
    if not isinstance(folder, Path) and folder.protocol in ("file", "local"):
        return Path(folder.path)
    return folder


def _put(path: Folder, data: bytes, permissions: int) -> None:
    """`path` written whole (a temp file renamed; one upload to an object store)."""
    if isinstance(path, Path):
        make_folders(path.parent, permissions)
        with atomic_write(path, "wb", permissions) as sink:
            sink.write(data)
    else:
        with atomic_put(path, "wb") as sink:
            sink.write(data)


def _sha256_of(path: Folder) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _remove_unnamed(folder: Folder, manifest: Manifest) -> None:
    """Remove the part files of earlier writes that `manifest` does not name."""
    named = {part.path for part in manifest.parts}
    for split in SPLITS:
        where = folder / split
        if not where.exists():
            continue
        for path in where.iterdir():
            if f"{split}/{path.name}" not in named and path.name.endswith(".parquet"):
                path.unlink()


def is_parts(path: Folder) -> bool:
    """Whether `path` is a folder of parts (it holds a manifest)."""
    return (path / MANIFEST).exists()


class TrainingSetFiles:
    """A training set to read a row group at a time: a folder of parts or one Parquet file."""

    def __init__(self, path: Folder, manifest: Manifest | None):
        self.path, self.manifest = path, manifest

    @classmethod
    def open(cls, path: Folder | str) -> "TrainingSetFiles":
        """The training set at `path`; a FileNotFoundError names a path that is neither."""
        path = Path(path) if isinstance(path, str) else path
        if is_parts(path):
            return cls(path, Manifest.from_json((path / MANIFEST).read_text()))
        if not path.is_file():
            raise FileNotFoundError(
                f"training set {path} does not exist (neither a folder of parts nor a file)"
            )
        return cls(path, None)

    @property
    def schema(self) -> "pa.Schema":
        import pyarrow.parquet as pq

        if self.manifest is None:
            return pq.read_schema(self.path)
        with (self.path / self.manifest.parts[0].path).open("rb") as source:
            return pq.read_schema(source)

    def rows(self, split: str | None, split_column: str = "split") -> int:
        """Rows of `split` (None: all)."""
        if self.manifest is not None:
            return self.manifest.rows if split is None else self.manifest.rows_of(split)
        if split is None:
            import pyarrow.parquet as pq

            return pq.read_metadata(self.path).num_rows
        return sum(len(chunk) for chunk in self.frames(split, [split_column], split_column))

    def frames(
        self,
        split: str | None = None,
        columns: Sequence[str] | None = None,
        split_column: str = "split",
    ) -> Iterator[pd.DataFrame]:
        """The rows of `split` (None: all) in order, a row group at a time, each frame indexed
        from 0 (only `columns`, if given)."""
        import pyarrow.parquet as pq

        names = list(columns) if columns is not None else None
        if self.manifest is not None:
            if not self.manifest.parts_of(split):  # a split without rows: its columns
                yield self.schema.empty_table().select(names or self.schema.names).to_pandas()
            for part in self.manifest.parts_of(split):
                with (self.path / part.path).open("rb") as source:
                    parquet = pq.ParquetFile(source)
                    for group in range(parquet.metadata.num_row_groups):
                        yield parquet.read_row_group(group, columns=names).to_pandas()
            return
        parquet = pq.ParquetFile(self.path)
        wanted = None if names is None or split is None else [*names, split_column]
        for group in range(parquet.metadata.num_row_groups):
            rows = parquet.read_row_group(
                group, columns=list(dict.fromkeys(wanted)) if wanted else names
            ).to_pandas()
            if split is not None:
                rows = rows[rows[split_column] == split].reset_index(drop=True)
                rows = rows if names is None else rows[names]
            yield rows

    def read(
        self,
        split: str | None = None,
        columns: Sequence[str] | None = None,
        split_column: str = "split",
    ) -> pd.DataFrame:
        """The rows of `split` (None: all) whole, in order."""
        frames = list(self.frames(split, columns, split_column))
        if not frames:
            names = list(columns) if columns is not None else self.schema.names
            return self.schema.empty_table().select(names).to_pandas()
        return frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)

    def largest_row_group(self) -> int:
        """Rows of the largest Parquet row group: the most `frames` gives at once."""
        import pyarrow.parquet as pq

        files = (
            [self.path]
            if self.manifest is None
            else [self.path / part.path for part in self.manifest.parts]
        )
        largest = 0
        for path in files:
            with path.open("rb") as source:
                metadata = pq.read_metadata(source)
            for group in range(metadata.num_row_groups):
                largest = max(largest, metadata.row_group(group).num_rows)
        return largest

    def fit(self, task: "Task", label: str, split_column: str = "split") -> "FitStats":
        """What the preprocessor of `task` and `label` is fitted from: the manifest's, or one
        pass over the train split."""
        from ml.data import FitStats  # torch: not for a reader of rows only

        recorded = self.manifest.fit if self.manifest is not None else None
        if recorded is not None:
            stats = FitStats.from_dict(recorded)
            if stats.fits(task, label):
                return stats
        stats = FitStats.for_task(task, label)
        for chunk in self.frames(SPLITS[0], split_column=split_column):
            stats.update(chunk)
        return stats

    def fingerprint(self) -> str:
        """Of the rows (`ml.dataset.fingerprint` of the whole set in order)."""
        if self.manifest is not None:
            return self.manifest.fingerprint
        digest = Fingerprint()
        for chunk in self.frames():
            digest.update(chunk)
        return digest.hexdigest()

    def digest(self) -> str:
        """sha256 of what was written: the manifest (which names each part's sha256), or the
        file."""
        return _sha256_of(self.path / MANIFEST if self.manifest is not None else self.path)
