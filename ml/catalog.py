"""Training settings from a use case's catalog (`declare.catalog`): what an entry trains with, the
sha256 that names it, a run's settings from the entry it names and the changes it makes, and new
entries written.

A run names an entry (`TrainConfig.catalog.name`) and gives every setting, as the launchpad
does: its fields' defaults are the use case's default entry (`UseCase.config`). So a setting the
run gives counts as its own change only where it differs from the default entry's value; the
rest comes from the entry it names. (A run that wants the default entry's value of a setting the
entry it names changes writes an entry of its own.)
"""

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from declare.catalog import Catalog, CatalogError, NamedConfig
from ml.config import CatalogRef, TrainConfig, dotted, nested

SET_BY_THE_RUN = (
    "data.training_set",
    "data.label",
    "data.task",
    "data.feature_service",
    "output_dir",
    "catalog.name",
    "catalog.sha256",
    "catalog.overridden",
)
"""Settings that are not the entry's to choose: the run's input and folder, what the use case
declares, and the record of the entry itself."""


def entry_settings(entry: NamedConfig) -> TrainConfig:
    """What `entry` trains with: its settings over the generic defaults, its name and sha256
    recorded in `catalog`. Refuses an entry whose settings the config refuses."""
    try:
        config = TrainConfig.from_dict(nested(dotted(entry.training)))
    except (ValueError, TypeError) as error:
        raise CatalogError(f"catalog entry {entry.name!r}: training: {error}") from None
    return dataclasses.replace(config, catalog=CatalogRef(entry.name, settings_sha256(config)))


def settings_sha256(config: TrainConfig) -> str:
    """sha256 of every setting that decides the training, as canonical JSON: not the run's
    input, folder or declared label (`SET_BY_THE_RUN`)."""
    settings = {k: v for k, v in dotted(config.to_dict()).items() if k not in SET_BY_THE_RUN}
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def resolve(catalog: Catalog, default: str, chosen: Mapping[str, Any]) -> TrainConfig:
    """The settings of a run that gives `chosen` (every setting, nested, its `catalog.name`
    among them, defaults from entry `default`): the named entry's, with each of `chosen`'s values
    that differs from `default`'s; `catalog` records the entry and the settings it changed."""
    given = dotted(chosen)
    name = given.get("catalog.name") or default
    reference = dotted(entry_settings(catalog.entry(default)).to_dict())
    named = entry_settings(catalog.entry(name))
    base = dotted(named.to_dict())
    changes = {
        k: v
        for k, v in given.items()
        if k not in SET_BY_THE_RUN and (k not in reference or _same(v) != _same(reference[k]))
    }
    config = TrainConfig.from_dict(nested({**base, **changes}))  # refuses an unknown setting
    overridden = tuple(sorted(k for k, v in changes.items() if _same(v) != _same(base[k])))
    return dataclasses.replace(
        config, catalog=dataclasses.replace(named.catalog, overridden=overridden)
    )


def save(catalog: Catalog, entry: NamedConfig, file_mode: int) -> Path:
    """Write `entry` as a new file of `catalog` (atomically, with `file_mode`), checked first as
    a run would take it; refuses a name the catalog has: an entry is never replaced."""
    import tomlkit

    from ml.files import atomic_write

    entry_settings(entry)
    path = catalog.path(entry.name)
    if path.exists():
        raise CatalogError(f"{path}: exists; a catalog entry is never replaced, name it anew")
    with atomic_write(path, "w", permissions=file_mode) as sink:
        sink.write(tomlkit.dumps(entry.document()))
    return path


def _same(value: Any) -> Any:
    """`value` comparable across the forms a setting takes: a list as the tuple it becomes."""
    return tuple(value) if isinstance(value, list) else value
