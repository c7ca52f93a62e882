"""The lake: a Parquet IO manager that owns every table's path, per asset and partition.

Each write goes to a temporary file in the destination folder and is renamed into place, so a
reader sees the previous file or the new one, never half of one. Every table carries a content
hash (of its columns, types and values, not of the file's bytes) in its Parquet metadata, and the
hash is reported to Dagster as the asset's data version: re-materializing identical data keeps
the version, so nothing downstream turns stale for no reason.

A training set is stored as a folder of Parquet parts by split and row range with a manifest
(`ml.parts`): an asset returns `Parts`, a step reading it as a DataFrame gets its rows in order,
and one reading it through `LakePaths` gets the folder, which a rank streams its share from.

A table too large to hold whole travels in chunks: an asset returns `Chunks`, written as one
Parquet row group per chunk with its hash taken chunk by chunk, and a step whose input is
annotated `LakeTable` gets the file to read a row group at a time instead of its rows
(`LakePartitions` for an input of several partitions, such as a trailing window of days).

The root is a folder, or a URL of an fsspec filesystem (through universal-pathlib):
`file:///srv/lake` is a local folder, written the same way; on an object store
(`s3://bucket/lake`, or fsspec's `memory://` in tests) a file is written locally, then uploaded
in one request, which makes the object appear whole (an object store has no rename). The store's
credentials and options come from its fsspec implementation's usual sources (environment, fsspec
config), never from here.

Local files get the mode `file_mode` (default 0o640: the owner reads and writes, its group reads)
whatever the umask, and the folders created for them the same bits plus search where read is
granted (0o750); see `ml.files`. An object store has no modes: its access is the store's policy.
"""

import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Annotated, Any, Union

import dagster as dg
from pydantic import AfterValidator, Field, model_validator

from ml.files import (
    FILE_MODE,
    atomic_put,
    atomic_write,
    check_file_mode,
    make_folders,
    staged_file,
    staged_upload,
)

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa
    from upath import UPath

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")
HASH_METADATA_KEY = b"ml_lifecycle.content_hash"
_LOCAL_PROTOCOLS = ("file", "local")

LakePath = Union[Path, "UPath"]  # UPath is imported where it is used: ~0.1 s of every load
"""Where a lake file lives: a local Path when the root is a folder, else a UPath (its URL)."""

FileMode = Annotated[
    int,
    Field(
        description="Mode of the files written on this machine's filesystem (default 0o640,"
        " group-readable); folders created for them get search where read is granted (0o750).",
    ),
    AfterValidator(check_file_mode),
]
"""The `file_mode` field of every resource that publishes files (`ML_LIFECYCLE_FILE_MODE`)."""


class LakePathError(ValueError):
    """An asset key or partition key that would name a path outside the lake."""


def safe_component(name: str, *, what: str) -> str:
    """`name` if it is a single, harmless path component; raises LakePathError otherwise."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise LakePathError(f"{what} {name!r} is not a safe path component ({_SAFE_NAME.pattern})")
    return name


def lake_root(root: str) -> LakePath:
    """The lake's root: a resolved folder, or the URL of an fsspec filesystem (a `file://` one
    resolved like a folder)."""
    if "://" not in root:
        return Path(root).resolve()
    from upath import UPath

    url = UPath(root)
    if url.protocol in _LOCAL_PROTOCOLS:
        return UPath(Path(url.path).resolve().as_uri())
    return url


def local_path(path: LakePath) -> Path | None:
    """`path` on this machine's filesystem (a folder's or a `file://` URL's), else None."""
    if isinstance(path, Path):
        return Path(path)
    return Path(path.path) if path.protocol in _LOCAL_PROTOCOLS else None


def open_atomically(
    path: LakePath, mode: str = "wb", permissions: int = FILE_MODE
) -> AbstractContextManager[IO[Any]]:
    """A file for writing that replaces `path` whole when the block ends without error: temp
    file + rename on a local filesystem (the file gets `permissions`), one upload to an object
    store (see ml/files.py)."""
    local = local_path(path)
    if local is None:
        from upath import UPath

        return atomic_put(UPath(path), mode)
    return atomic_write(local, mode, permissions)


def content_hash(frame: "pd.DataFrame") -> str:
    """sha256 over column names, dtypes and values; independent of the file format's bytes."""
    from ml.dataset import fingerprint

    return fingerprint(frame)


def write_parquet_atomically(
    frame: "pd.DataFrame", path: LakePath, permissions: int = FILE_MODE
) -> str:
    """Write `frame` whole to `path` (see `open_atomically`); returns its content hash."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    digest = content_hash(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), HASH_METADATA_KEY: digest.encode()}
    )
    with open_atomically(path, permissions=permissions) as sink:
        pq.write_table(table, sink)
    return digest


@dataclass(frozen=True)
class Chunks:
    """A table handed to the lake a chunk of rows at a time: an asset returns it instead of a
    DataFrame when the table may not fit in memory. `frames` is called once, when the lake
    writes the table; every chunk must have the first one's columns and dtypes. `metadata`,
    called once the table is written, adds to the output's metadata what was counted while the
    chunks went by."""

    frames: Callable[[], Iterator["pd.DataFrame"]]
    metadata: Callable[[], Mapping[str, Any]] = dict


@dataclass(frozen=True)
class Parts:
    """A table the lake stores as a folder of parts by split and row range with a manifest
    (`ml.parts.write_parts`), at the asset's path without `.parquet`: a training set. `fit`,
    given, gathers the train split's preprocessing statistics as the parts are written."""

    frame: "pd.DataFrame"
    split_column: str
    fit: Any = None
    """An `ml.data.FitStats`, or None."""


@dataclass(frozen=True)
class LakeTable:
    """A lake file to read a row group at a time: what a step gets for an input annotated
    `LakeTable` instead of the file's rows. Tables the lake wrote from `Chunks` have a row group
    per chunk; a table written whole has one per million rows."""

    path: LakePath

    def frames(self, columns: Sequence[str] | None = None) -> Iterator["pd.DataFrame"]:
        """The rows, a row group at a time, each frame indexed from 0 (only `columns`, if
        given); an empty table gives one empty frame."""
        import pyarrow.parquet as pq

        with self.path.open("rb") as source:
            parquet = pq.ParquetFile(source)
            names = list(columns) if columns is not None else None
            if parquet.metadata.num_row_groups == 0:
                yield (
                    parquet.schema_arrow.empty_table()
                    .select(names or parquet.schema_arrow.names)
                    .to_pandas()
                )
                return
            for group in range(parquet.metadata.num_row_groups):
                yield parquet.read_row_group(group, columns=names).to_pandas()

    @property
    def rows(self) -> int:
        import pyarrow.parquet as pq

        with self.path.open("rb") as source:
            return pq.read_metadata(source).num_rows

    @property
    def columns(self) -> list[str]:
        import pyarrow.parquet as pq

        with self.path.open("rb") as source:
            return pq.read_schema(source).names

    @property
    def row_groups(self) -> int:
        """How many frames `frames` gives (one for a table of no row groups)."""
        import pyarrow.parquet as pq

        with self.path.open("rb") as source:
            return max(pq.read_metadata(source).num_row_groups, 1)


@dataclass(frozen=True)
class LakePartitions:
    """The files of several partitions of one asset, unread: what a step gets for an input
    annotated `LakePartitions` (a trailing window of days, say). `tables` holds the partitions
    the input maps to, in their order; a window reaching before the first partition holds
    fewer, or none. `keys` names each table's partition (empty for a window built by hand).

    A step that runs a range of partitions gets its input's partitions for the whole range, and
    `missing` holds those never materialized (a refused day): the step takes each of its days'
    share with `between`, which refuses only the days that need a missing one."""

    tables: tuple[LakeTable, ...]
    keys: tuple[str, ...] = ()
    missing: Mapping[str, FileNotFoundError] = field(default_factory=dict)

    def frames(self, columns: Sequence[str] | None = None) -> Iterator["pd.DataFrame"]:
        """Every partition's rows, a row group at a time (see `LakeTable.frames`)."""
        for table in self.tables:
            yield from table.frames(columns)

    def between(self, first: str, last: str) -> "LakePartitions":
        """The partitions from `first` to `last` (both included, in key order); raises the
        not-materialized error of a missing one among them."""
        for key in sorted(self.missing):
            if first <= key <= last:
                raise self.missing[key]
        chosen = [i for i, key in enumerate(self.keys) if first <= key <= last]
        return LakePartitions(
            tuple(self.tables[i] for i in chosen), tuple(self.keys[i] for i in chosen)
        )

    def __len__(self) -> int:
        return len(self.tables)


@dataclass(frozen=True)
class Stored:
    """One asset partition as the lake wrote it: the file, its content hash as the data version,
    and the metadata its materialization records."""

    table: LakeTable
    data_version: dg.DataVersion
    metadata: Mapping[str, Any]


def write_parquet_chunks(
    frames: Iterable["pd.DataFrame"], path: LakePath, permissions: int = FILE_MODE
) -> tuple[str, int, "pd.Series"]:
    """Write the chunks to `path` as one file, a row group per chunk, whole or not at all (see
    `open_atomically`); returns its content hash (that of the chunks' concatenation), row count
    and dtypes. A column with no value in the first chunk is stored as text."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ml.dataset import Fingerprint

    digest, rows = Fingerprint(), 0
    schema, dtypes, writer = None, None, None
    with open_atomically(path, permissions=permissions) as sink:
        try:
            for frame in frames:
                digest.update(frame)
                if writer is None:
                    schema, dtypes = _stored_schema(frame), frame.dtypes
                    writer = pq.ParquetWriter(sink, schema)
                writer.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False))
                rows += len(frame)
            if writer is None or dtypes is None:
                raise ValueError(f"{path}: a table in chunks needs at least one (empty) chunk")
            writer.add_key_value_metadata({HASH_METADATA_KEY: digest.hexdigest().encode()})
        finally:
            if writer is not None:
                writer.close()
    return digest.hexdigest(), rows, dtypes


def _stored_schema(frame: "pd.DataFrame") -> "pa.Schema":
    import pyarrow as pa

    schema = pa.Schema.from_pandas(frame, preserve_index=False)
    for index, column in enumerate(schema):
        if pa.types.is_null(column.type):
            schema = schema.set(index, column.with_type(pa.string()))
    return schema


def stored_hash(path: LakePath) -> str | None:
    """The content hash recorded in a lake file, without reading its data."""
    import pyarrow.parquet as pq

    with path.open("rb") as source:
        metadata = pq.read_metadata(source).metadata or {}
    value = metadata.get(HASH_METADATA_KEY)
    return value.decode() if value else None


def _one_partition(context: dg.OutputContext | dg.InputContext, rule: str) -> str | None:
    """The one partition key of an output or input (None when unpartitioned)."""
    if not context.has_asset_partitions:
        return None
    keys = context.asset_partition_keys
    if len(keys) != 1:
        raise ValueError(f"{context.asset_key.to_user_string()}: {rule}, got {len(keys)}")
    return keys[0]


def _not_materialized(
    asset_key: dg.AssetKey, partition_key: str | None, path: LakePath
) -> FileNotFoundError:
    where = f" partition {partition_key}" if partition_key else ""
    return FileNotFoundError(
        f"{asset_key.to_user_string()}{where} has not been materialized ({path})"
    )


def _wanted_type(context: dg.InputContext) -> object:
    """The step's annotation of the input (`LakeTable`, `LakePartitions`, ...); None for an input
    context built by hand, as in a test, which may carry no type."""
    try:
        return context.dagster_type.typing_type
    except dg.DagsterInvariantViolationError:
        return None


class ParquetLake(dg.ConfigurableIOManager):
    """Stores DataFrames as `<root>/<asset key path>/<partition>.parquet` (`data.parquet` when
    unpartitioned) and loads them back, concatenating when several partitions are asked for."""

    root: str = Field(
        description="Folder or fsspec URL (file:///srv/lake, s3://bucket/lake) of the lake;"
        " nothing is written outside it."
    )
    file_mode: FileMode = FILE_MODE

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakePath:
        """Where one asset partition lives; refuses names that would leave the lake."""
        root = lake_root(self.root)
        parts = [safe_component(p, what="asset key part") for p in asset_key.path]
        name = (
            "data" if partition_key is None else safe_component(partition_key, what="partition key")
        )
        path = root.joinpath(*parts, f"{name}.parquet")
        local_root = local_path(root)
        if local_root is None:  # no symlinks in an object store: safe components stay inside
            return path
        local = local_path(path)
        assert local is not None  # a path under a local root is local
        resolved = local.resolve()
        if not resolved.is_relative_to(local_root):  # a symlink inside the lake leading out
            raise LakePathError(f"{resolved} is outside the lake {local_root}")
        if isinstance(root, Path):
            return resolved
        from upath import UPath

        return UPath(resolved.as_uri())

    def handle_output(
        self, context: dg.OutputContext, obj: "pd.DataFrame | Chunks | Parts"
    ) -> None:
        partition_key = _one_partition(context, "one partition per write")
        if isinstance(obj, Parts):
            version, metadata = self.write_parts(context.asset_key, partition_key, obj)
        else:
            stored = self.write(context.asset_key, partition_key, obj)
            version, metadata = stored.data_version, stored.metadata
        context.add_output_metadata(dict(metadata))
        # Dagster takes a data version from the step's cache when the output carries none; setting
        # it here makes the stored content, not the code version, decide what is stale downstream.
        context.step_context.set_data_version(context.asset_key, version)

    def parts_path(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakePath:
        """The folder of an asset partition stored as `Parts`: its file's path without
        `.parquet`."""
        path = self.path_for(asset_key, partition_key)
        return path.with_name(path.name.removesuffix(".parquet"))

    def write_parts(
        self, asset_key: dg.AssetKey, partition_key: str | None, parts: Parts
    ) -> tuple[dg.DataVersion, dict[str, Any]]:
        """Store one asset partition as a folder of parts; its data version is the rows'
        fingerprint. A file the asset was stored as before is removed once the parts are in."""
        from ml.parts import write_parts

        folder = self.parts_path(asset_key, partition_key)
        manifest = write_parts(
            parts.frame, folder, parts.split_column, fit=parts.fit, permissions=self.file_mode
        )
        earlier = self.path_for(asset_key, partition_key)
        if earlier.is_file():
            earlier.unlink()
        metadata = {
            "dagster/row_count": manifest.rows,
            "dagster/column_schema": dg.TableSchema(
                columns=[dg.TableColumn(name, dtype) for name, dtype in manifest.columns]
            ),
            "content_hash": manifest.fingerprint,
            "parts": len(manifest.parts),
            "path": dg.MetadataValue.path(str(folder)),
        }
        return dg.DataVersion(manifest.fingerprint), metadata

    def write(
        self, asset_key: dg.AssetKey, partition_key: str | None, obj: "pd.DataFrame | Chunks"
    ) -> "Stored":
        """Store one asset partition whole (or leave the last one as it was), for a step that
        records its materializations itself: a step that writes several partitions in one run."""
        path = self.path_for(asset_key, partition_key)
        metadata: dict[str, Any] = {}
        if isinstance(obj, Chunks):
            digest, rows, dtypes = write_parquet_chunks(obj.frames(), path, self.file_mode)
            metadata.update(obj.metadata())
        else:
            digest = write_parquet_atomically(obj, path, self.file_mode)
            rows, dtypes = len(obj), obj.dtypes
        metadata.update(
            {
                "dagster/row_count": rows,
                "dagster/column_schema": dg.TableSchema(
                    columns=[dg.TableColumn(str(c), str(t)) for c, t in dtypes.items()]
                ),
                "content_hash": digest,
                "path": dg.MetadataValue.path(str(path)),
            }
        )
        return Stored(LakeTable(path), dg.DataVersion(digest), metadata)

    def table(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakeTable:
        """The stored file of one asset partition, unread; refuses one never materialized."""
        return self._file(asset_key, partition_key)

    def load_input(self, context: dg.InputContext) -> "pd.DataFrame | LakeTable | LakePartitions":
        import pandas as pd

        asset_key = context.asset_key
        wanted = _wanted_type(context)
        if wanted is LakeTable:
            partition_key = _one_partition(context, "a LakeTable input is one partition")
            return self._file(asset_key, partition_key)
        if wanted is LakePartitions:
            if not context.has_asset_partitions:
                return LakePartitions((self._file(asset_key, None),))
            return self._partitions(
                asset_key, context.asset_partition_keys, context.has_partition_key
            )
        if not context.has_asset_partitions:
            if self._has_parts(asset_key):
                from ml.parts import TrainingSetFiles

                return TrainingSetFiles.open(self.parts_path(asset_key, None)).read()
            return self._read(self.path_for(asset_key, None), asset_key, None)
        frames = [
            self._read(self.path_for(asset_key, key), asset_key, key)
            for key in context.asset_partition_keys
        ]
        if not frames:  # a window reaching before the first partition, e.g. trailing history
            return pd.DataFrame()
        if len(frames) == 1:
            return frames[0]
        return pd.concat(frames, ignore_index=True)

    def _has_parts(self, asset_key: dg.AssetKey) -> bool:
        from ml.parts import is_parts

        return is_parts(self.parts_path(asset_key, None))

    def _partitions(
        self, asset_key: dg.AssetKey, keys: Sequence[str], one_day: bool
    ) -> LakePartitions:
        """The files of `keys`. A step of one partition needs every one of them; a step of a
        range gets the missing ones named, for each of its days to need or not (`between`)."""
        tables, found, missing = [], [], {}
        for key in keys:
            path = self.path_for(asset_key, key)
            if path.is_file():
                tables.append(LakeTable(path))
                found.append(key)
            elif one_day:
                raise _not_materialized(asset_key, key, path)
            else:
                missing[key] = _not_materialized(asset_key, key, path)
        return LakePartitions(tuple(tables), tuple(found), missing)

    def _file(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakeTable:
        """The file of one asset partition (or of an unpartitioned asset), unread."""
        path = self.path_for(asset_key, partition_key)
        if not path.is_file():
            raise _not_materialized(asset_key, partition_key, path)
        return LakeTable(path)

    @staticmethod
    def _read(path: LakePath, asset_key: dg.AssetKey, partition_key: str | None) -> "pd.DataFrame":
        import pandas as pd

        if not path.is_file():
            raise _not_materialized(asset_key, partition_key, path)
        local = local_path(path)
        if local is not None:
            return pd.read_parquet(local)
        from upath import UPath

        remote = UPath(path)
        return pd.read_parquet(remote.path, filesystem=remote.fs)


class LakePaths(ParquetLake):
    """The same lake, read as the local path of an unpartitioned asset's file instead of its
    rows: for steps that hand the file to another process (training under torchrun).

    A folder or `file://` lake hands over the file (or the folder of parts) itself. A remote
    lake's file is copied to `staging_dir` first and the copy is handed over, rather than its
    URL (a folder of parts: `staged_parts`): the training side (ml.train, the layout probe, the
    launchers) opens the training set as local files, every rank reads all of it, and a local
    copy means one download per step instead of one per rank, with the store's credentials
    needed by this process only. The copy is named by its content
    hash, which is read from the downloaded file itself (the object may be replaced while it
    downloads), so a retry or a later run over the same data reuses it; it is renamed into
    place whole. Copies are not removed: the folder is a cache, safe to empty between runs.
    A launcher whose workers run elsewhere (Kubernetes pods) needs `staging_dir` on a volume
    they mount at the same path."""

    staging_dir: str | None = Field(
        default=None,
        description="Local folder for copies of a remote lake's files handed to other processes;"
        " required when `root` is a remote URL.",
    )

    @model_validator(mode="after")
    def _staging_for_a_remote_lake(self) -> "LakePaths":
        if isinstance(self.root, dg.EnvVar):  # checked once Dagster has resolved it, at run time
            return self
        if local_path(lake_root(self.root)) is None and not self.staging_dir:
            raise ValueError(f"staging_dir is required for the remote lake root {self.root!r}")
        return self

    def load_input(self, context: dg.InputContext) -> Path:  # type: ignore[override]
        if context.has_asset_partitions:
            raise ValueError(f"{context.asset_key.to_user_string()}: only unpartitioned assets")
        key = context.asset_key
        parts = self._has_parts(key)  # a training set: a folder of parts
        path = self.parts_path(key, None) if parts else self.path_for(key, None)
        if not parts and not path.is_file():
            raise FileNotFoundError(f"{key.to_user_string()} has not been materialized ({path})")
        local = local_path(path)
        if local is not None:
            return local
        assert self.staging_dir  # the validator requires it for a remote root
        from upath import UPath

        folder = Path(self.staging_dir).resolve().joinpath(*key.path)
        copy = staged_parts if parts else staged_copy
        return copy(UPath(path), folder, self.file_mode)


def staged_copy(path: "UPath", folder: Path, permissions: int = FILE_MODE) -> Path:
    """A whole local copy of the lake file `path` in `folder`, named `<content hash>.parquet`
    and given `permissions`; an existing copy of the same content is reused."""
    cached = stored_hash(path)
    if cached is not None and (folder / f"{cached}.parquet").is_file():
        return folder / f"{cached}.parquet"
    make_folders(folder, permissions)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as scratch:
        download = Path(scratch) / path.name
        with path.open("rb") as source, download.open("wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
            sink.flush()
            os.fchmod(sink.fileno(), permissions)
            os.fsync(sink.fileno())
        digest = stored_hash(download)
        if digest is None:
            raise ValueError(f"{path} carries no content hash; it was not written by the lake")
        copy = folder / f"{digest}.parquet"
        os.replace(download, copy)
    return copy


def staged_parts(folder: "UPath", staging: Path, permissions: int = FILE_MODE) -> Path:
    """A whole local copy of the lake's folder of parts `folder` in `staging`, named by its
    rows' fingerprint: the parts its manifest names, each checked against its sha256, then the
    manifest (a copy with a manifest is whole); an existing copy is reused."""
    from ml.parts import MANIFEST, Manifest

    text = (folder / MANIFEST).read_text()
    manifest = Manifest.from_json(text)
    copy = staging / manifest.fingerprint
    if (copy / MANIFEST).is_file():
        return copy
    for part in manifest.parts:
        target = copy / part.path
        make_folders(target.parent, permissions)
        with (
            (folder / part.path).open("rb") as source,
            atomic_write(target, "wb", permissions) as sink,
        ):
            shutil.copyfileobj(source, sink, 1 << 20)
    with atomic_write(copy / MANIFEST, "w", permissions) as sink:
        sink.write(text)
    return copy


def write_text_atomically(text: str, path: LakePath, permissions: int = FILE_MODE) -> None:
    """Write `text` whole to `path` (see `open_atomically`)."""
    with open_atomically(path, "w", permissions) as sink:
        sink.write(text)


class LakeFiles(dg.ConfigurableResource):
    """The lake's paths, for a step that writes its table itself because it streams it in
    chunks (batch predictions) instead of handing one DataFrame to the IO manager. Same paths,
    same refusal of names that would leave the lake; the step writes atomically."""

    root: str = Field(description="Folder or fsspec URL of the lake.")
    file_mode: FileMode = FILE_MODE

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakePath:
        return ParquetLake(root=self.root).path_for(asset_key, partition_key)

    def local_target(self, path: LakePath) -> AbstractContextManager[Path]:
        """A local path for a writer that takes one (a streaming Parquet writer), whose file
        becomes the lake file `path` whole when the block ends without error and is dropped
        otherwise: beside it and renamed in a local lake, uploaded to an object store."""
        local = local_path(path)
        if local is None:
            from upath import UPath

            return staged_upload(UPath(path))
        return staged_file(local, self.file_mode)
