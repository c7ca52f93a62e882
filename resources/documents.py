"""Small JSON documents that tell downstream steps what an asset made and where: the documents
IO manager, and building a stored result back into its dataclass. Written atomically under the
lake's root, with the lake's paths (`resources.lake`)."""

from collections.abc import Mapping
from typing import Any, TypeVar

import dagster as dg
from pydantic import Field

from ml.files import FILE_MODE
from resources.lake import FileMode, LakePath, ParquetLake, write_text_atomically

_T = TypeVar("_T")


class JsonDocuments(dg.ConfigurableIOManager):
    """Small JSON documents that tell downstream steps what an asset made and where: a training
    run's folder, a gate report, an exported model's file and hash. Stored at
    `<root>/<asset key path>/<partition or "data">.json`, written atomically. A step's typed
    result (a dataclass; one with `to_document()` says how) is stored, and loaded back as its
    type where the consuming step's input has a Dagster type that knows how (`load_document`);
    otherwise the step gets the document itself. The artifacts themselves stay where they were
    written; the document is the lineage link to them."""

    root: str = Field(
        description="Folder or fsspec URL of the documents; nothing is written outside it."
    )
    file_mode: FileMode = FILE_MODE

    def path_for(self, asset_key: dg.AssetKey, partition_key: str | None) -> LakePath:
        lake = ParquetLake(root=self.root)
        return lake.path_for(asset_key, partition_key).with_suffix(".json")

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        import dataclasses
        import json

        if hasattr(obj, "to_document"):
            obj = obj.to_document()  # type: ignore[union-attr]
        elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            obj = dataclasses.asdict(obj)
        if not isinstance(obj, dict):
            raise TypeError(f"{context.asset_key.to_user_string()}: expected a dict or dataclass")
        partition = context.asset_partition_key if context.has_asset_partitions else None
        path = self.path_for(context.asset_key, partition)
        text = json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)
        write_text_atomically(text, path, self.file_mode)
        context.add_output_metadata({"document": dg.MetadataValue.path(str(path))})

    def load_input(self, context: dg.InputContext) -> Any:
        import json

        partition = context.asset_partition_key if context.has_asset_partitions else None
        path = self.path_for(context.asset_key, partition)
        if not path.is_file():
            raise FileNotFoundError(
                f"{context.asset_key.to_user_string()} has not been materialized ({path})"
            )
        document = json.loads(path.read_text())
        # A step's typed result comes back as its type (`assets.ResultType`), else as it was.
        load = getattr(context.dagster_type, "load_document", None)
        return document if load is None else load(document)


def from_document(cls: type[_T], values: Mapping[str, Any]) -> _T:
    """The dataclass `cls` built from a document `JsonDocuments` stored (its fields only; a field
    that is itself such a dataclass is built the same way)."""
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    built = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        value, kind = values[f.name], hints.get(f.name)
        if isinstance(kind, type) and dataclasses.is_dataclass(kind) and isinstance(value, dict):
            value = from_document(kind, value)
        built[f.name] = value
    return cls(**built)
