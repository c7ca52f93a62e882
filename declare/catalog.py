"""A use case's catalog of training configurations: named settings of `ml.config.TrainConfig` a
run starts from, one file each in the use case's `configs/` folder, in TOML:

    # usecases/ridership/configs/baseline.toml
    description = "Small batches and a long patience: a station's year is a few hundred rows."

    [training.optim]
    batch_size = 32
    lr = 0.001

`training` is nested as the config's sections are and holds what differs from the generic
defaults; `origin`, when a tool wrote the entry, says where it came from (the study and trial
that found it). Every catalog has `baseline`. A run records the name of its entry and the sha256
of the settings the entry resolves to (`ml.catalog.settings_sha256`), so an entry edited in place
shows as another hash; a tool writing an entry (`ml.catalog.save`) never replaces one: a new
configuration is a new name.

Dagster-free: read when a use case is declared (every file is parsed and checked then), by the
training asset's launchpad config, and by the command line.
"""

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASELINE = "baseline"
"""The entry every catalog has."""
SUFFIX = ".toml"
NAME = re.compile(r"^[a-z][a-z0-9_-]*$")
"""An entry's name: its file's stem."""
KEYS = ("description", "training", "origin")
"""What an entry's file may hold."""


class CatalogError(ValueError):
    """A catalog entry is missing or malformed; the message names the file and the key."""


@dataclass(frozen=True)
class NamedConfig:
    """One entry of a catalog."""

    name: str
    training: Mapping[str, Any] = field(default_factory=dict)
    """Settings of `ml.config.TrainConfig` over its generic defaults, nested by section."""
    description: str = ""
    origin: Mapping[str, Any] = field(default_factory=dict)
    """Where the entry came from when a tool wrote it (`{"study": ..., "trial": ...}`)."""

    def document(self) -> dict[str, Any]:
        """The entry as its file holds it."""
        out: dict[str, Any] = {"description": self.description, "training": _plain(self.training)}
        if self.origin:
            out["origin"] = _plain(self.origin)
        return out


@dataclass(frozen=True)
class Catalog:
    """The entries in `folder` (`<name>.toml` each); with no folder, only `baseline`, which
    then is the generic defaults."""

    folder: Path | None = None

    def names(self) -> tuple[str, ...]:
        if self.folder is None:
            return (BASELINE,)
        return tuple(sorted(p.stem for p in self.folder.glob(f"*{SUFFIX}")))

    def entry(self, name: str) -> NamedConfig:
        """The entry `name`; refuses a name the catalog lacks, listing those it has."""
        if self.folder is None and name == BASELINE:
            return NamedConfig(BASELINE, description="the generic defaults")
        path = self.path(name)
        if not path.is_file():
            raise CatalogError(f"{path}: no such catalog entry; there are {list(self.names())}")
        return read(path)

    def entries(self) -> tuple[NamedConfig, ...]:
        """Every entry, read and checked."""
        return tuple(self.entry(name) for name in self.names())

    def path(self, name: str) -> Path:
        if self.folder is None:
            raise CatalogError(f"{name!r}: this use case has no catalog folder to hold it")
        if not NAME.match(name):
            raise CatalogError(f"{name!r}: an entry's name must match {NAME.pattern}")
        return self.folder / f"{name}{SUFFIX}"


def read(path: Path) -> NamedConfig:
    """The entry in `path`, checked: `KEYS` only, `training` and `origin` tables."""
    try:
        document = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise CatalogError(f"{path}: not TOML: {error}") from None
    unknown = sorted(set(document) - set(KEYS))
    if unknown:
        raise CatalogError(f"{path}: unknown key(s) {unknown}; an entry holds {list(KEYS)}")
    for key in ("training", "origin"):
        if not isinstance(document.get(key, {}), dict):
            raise CatalogError(f"{path}: {key} must be a table")
    return NamedConfig(
        name=path.stem,
        training=document.get("training", {}),
        description=str(document.get("description", "")),
        origin=document.get("origin", {}),
    )


def _plain(value: Any) -> Any:
    """`value` with its mappings as dicts and tuples as lists, as TOML writes them."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
