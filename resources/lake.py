"""The lake: a Parquet IO manager that owns every table's path, per asset and partition.

Each write goes to a temporary file in the destination folder and is renamed into place, so a
reader sees the previous file or the new one, never half of one. Every table carries a content
hash (of its columns, types and values, not of the file's bytes) in its Parquet metadata, and the
hash is reported to Dagster as the asset's data version: re-materializing identical data keeps
the version, so nothing downstream turns stale for no reason.
"""

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import dagster as dg
from pydantic import Field

from ml.files import atomic_write

if TYPE_CHECKING:
    import pandas as pd

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=-]*$")
HASH_METADATA_KEY = b"ml_lifecycle.content_hash"
_T = TypeVar("_T")


class LakePathError(ValueError):
    """An asset key or partition key that would name a path outside the lake."""


def safe_component(name: str, *, what: str) -> str:
    """`name` if it is a single, harmless path component; raises LakePathError otherwise."""
    if not _SAFE_NAME.fullmatch(name) or ".." in name:
        raise LakePathError(f"{what} {name!r} is not a safe path component ({_SAFE_NAME.pattern})")
    return name


def content_hash(frame: "pd.DataFrame") -> str:
    """sha256 over column names, dtypes and values; independent of the file format's bytes."""
    from ml.dataset import fingerprint

    return fingerprint(frame)


def write_parquet_atomically(frame: "pd.DataFrame", path: Path) -> str:
    """Write `frame` to `path` via temp file + rename; returns its content hash."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    digest = content_hash(frame)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    table = table.replace_schema_metadata(
        {**(table.schema.metadata or {}), HASH_METADATA_KEY: digest.encode()}
    )
    with atomic_write(path) as sink:
        pq.write_table(table, sink)
    return digest


def stored_hash(path: Path) -> str | None:
    """The content hash recorded in a lake file, without reading its data."""
    import pyarrow.parquet as pq

    metadata = pq.read_schema(path).metadata or {}
    value = metadata.get(HASH_METADATA_KEY)
    return value.decode() if value else None


class ParquetLake(dg.ConfigurableIOManager):
    """Stores DataFrames as `<root>/<asset key path>/<partition>.parquet` (`data.parquet` when
    unpartitioned) and loads them back, concatenating when several partitions are asked for."""

    root: str = Field(description="Folder of the lake; nothing is written outside it.")

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> Path:
        """Where one asset partition lives; refuses names that would leave the lake."""
        root = Path(self.root).resolve()
        folder = root.joinpath(*(safe_component(p, what="asset key part") for p in asset_key.path))
        name = (
            "data" if partition_key is None else safe_component(partition_key, what="partition key")
        )
        path = (folder / f"{name}.parquet").resolve()
        if not path.is_relative_to(root):
            raise LakePathError(f"{path} is outside the lake {root}")
        return path

    def handle_output(self, context: dg.OutputContext, obj: "pd.DataFrame") -> None:
        partition_key = None
        if context.has_asset_partitions:
            keys = context.asset_partition_keys
            if len(keys) != 1:
                name = context.asset_key.to_user_string()
                raise ValueError(f"{name}: one partition per write, got {len(keys)}")
            partition_key = keys[0]
        path = self.path_for(context.asset_key, partition_key)
        digest = write_parquet_atomically(obj, path)
        context.add_output_metadata(
            {
                "dagster/row_count": len(obj),
                "dagster/column_schema": dg.TableSchema(
                    columns=[dg.TableColumn(str(c), str(t)) for c, t in obj.dtypes.items()]
                ),
                "content_hash": digest,
                "path": dg.MetadataValue.path(str(path)),
            }
        )
        # Dagster takes a data version from the step's cache when the output carries none; setting
        # it here makes the stored content, not the code version, decide what is stale downstream.
        context.step_context.set_data_version(context.asset_key, dg.DataVersion(digest))

    def load_input(self, context: dg.InputContext) -> "pd.DataFrame":
        import pandas as pd

        asset_key = context.asset_key
        if not context.has_asset_partitions:
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

    @staticmethod
    def _read(path: Path, asset_key: dg.AssetKey, partition_key: str | None) -> "pd.DataFrame":
        import pandas as pd

        if not path.is_file():
            where = f" partition {partition_key}" if partition_key else ""
            raise FileNotFoundError(
                f"{asset_key.to_user_string()}{where} has not been materialized ({path})"
            )
        return pd.read_parquet(path)


class LakePaths(ParquetLake):
    """The same lake, read as the path of an unpartitioned asset's file instead of its rows: for
    steps that hand the file to another process (training under torchrun)."""

    def load_input(self, context: dg.InputContext) -> Path:  # type: ignore[override]
        if context.has_asset_partitions:
            raise ValueError(f"{context.asset_key.to_user_string()}: only unpartitioned assets")
        path = self.path_for(context.asset_key, None)
        if not path.is_file():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has not been materialized ({path})"
            )
        return path


class JsonDocuments(dg.ConfigurableIOManager):
    """Small JSON documents that tell downstream steps what an asset made and where: a training
    run's folder, a gate report, an exported model's file and hash. Stored at
    `<root>/<asset key path>/<partition or "data">.json`, written atomically; loaded as dicts
    (the consuming step builds its typed object from it). The artifacts themselves stay where
    they were written; the document is the lineage link to them."""

    root: str = Field(description="Folder of the documents; nothing is written outside it.")

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> Path:
        lake = ParquetLake(root=self.root)
        return lake.path_for(asset_key, partition_key).with_suffix(".json")

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        import dataclasses
        import json

        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            obj = dataclasses.asdict(obj)
        if not isinstance(obj, dict):
            raise TypeError(f"{context.asset_key.to_user_string()}: expected a dict or dataclass")
        partition = context.asset_partition_key if context.has_asset_partitions else None
        path = self.path_for(context.asset_key, partition)
        write_text_atomically(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False), path)
        context.add_output_metadata({"document": dg.MetadataValue.path(str(path))})

    def load_input(self, context: dg.InputContext) -> dict:
        import json

        partition = context.asset_partition_key if context.has_asset_partitions else None
        path = self.path_for(context.asset_key, partition)
        if not path.is_file():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has not been materialized ({path})"
            )
        return json.loads(path.read_text())


def from_document(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """The dataclass `cls` built from a document `JsonDocuments` loaded (its fields only)."""
    import dataclasses

    return cls(**{f.name: values[f.name] for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


def write_text_atomically(text: str, path: Path) -> None:
    """Write `text` to `path` via temp file + fsync + rename."""
    with atomic_write(path, "w") as sink:
        sink.write(text)


class LakeFiles(dg.ConfigurableResource):
    """The lake's paths, for a step that writes its table itself because it streams it in
    chunks (batch predictions) instead of handing one DataFrame to the IO manager. Same paths,
    same refusal of names that would leave the lake; the step writes atomically."""

    root: str = Field(description="Folder of the lake.")

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> Path:
        return ParquetLake(root=self.root).path_for(asset_key, partition_key)
