"""The names a use case's Feast repository declares, as the file `feast_names.json` beside its
declarations holds them: entities and their join keys, sources, feature views (features, online
or not, entities, source) and feature services (the view projections they read, with their
features).

The file lets a use case's references into Feast be checked when the code location loads
(`declare.references`) without importing Feast, which takes seconds. It is written from the
declarations as Feast parses them (`resources.feast_names`, through `python -m cli.feast_names`,
the scaffold, or by hand after editing them) and kept honest where Feast is imported anyway: the
`feature_registry` apply refuses a repository whose file says otherwise than its declarations,
and a test regenerates every bundled one. This module reads and writes the format; it needs
only the standard library.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NAMES_FILE = "feast_names.json"
REFRESH = "python -m cli.feast_names"
"""The command that writes a repository's names file from its declarations (Feast imported)."""
_ABOUT = (
    "The names the Feast declarations of this folder declare, written by"
    f" `{REFRESH}` after they change; read when the code location loads."
)


@dataclass(frozen=True)
class Source:
    """A data source: where its rows are (a path relative to the offline store's root) and the
    column of their event timestamps."""

    path: str
    timestamp_field: str


@dataclass(frozen=True)
class View:
    """A feature view: the entities it is keyed by, its features, whether the online store
    serves it, and its batch source's name."""

    entities: tuple[str, ...]
    features: tuple[str, ...]
    online: bool
    source: str


@dataclass(frozen=True)
class Projection:
    """What a feature service reads of one view: the view, the name its columns carry (an alias,
    else the view's name), those of its features, and the renamed join keys."""

    view: str
    name: str
    features: tuple[str, ...]
    join_key_map: Mapping[str, str]


@dataclass(frozen=True)
class FeastNames:
    """Every name a Feast repository declares that a use case's declaration may refer to."""

    entities: Mapping[str, str]
    """Entity → its join key."""
    sources: Mapping[str, Source]
    feature_views: Mapping[str, View]
    feature_services: Mapping[str, tuple[Projection, ...]]

    def join_keys(self, view: str) -> list[str]:
        """The join keys of a feature view, in its entities' order."""
        return [self.entities[e] for e in self.feature_views[view].entities if e in self.entities]

    def columns(self, service: str) -> list[str]:
        """The columns a feature service adds to entity rows: `<view>__<feature>`."""
        return [
            f"{projection.name}__{feature}"
            for projection in self.feature_services[service]
            for feature in projection.features
        ]

    def service_join_keys(self, service: str) -> list[str]:
        """The entity columns the views of a feature service join on, as the service names them."""
        keys: list[str] = []
        for projection in self.feature_services[service]:
            if projection.view not in self.feature_views:
                continue  # an on-demand view: computed from the others, no join key of its own
            for key in self.join_keys(projection.view):
                mapped = projection.join_key_map.get(key, key)
                if mapped not in keys:
                    keys.append(mapped)
        return keys

    def to_json(self) -> str:
        """The file's text: keys sorted, lists in declaration order."""
        document = {
            "about": _ABOUT,
            "entities": dict(sorted(self.entities.items())),
            "sources": {
                name: {"path": s.path, "timestamp_field": s.timestamp_field}
                for name, s in sorted(self.sources.items())
            },
            "feature_views": {
                name: {
                    "entities": list(v.entities),
                    "features": list(v.features),
                    "online": v.online,
                    "source": v.source,
                }
                for name, v in sorted(self.feature_views.items())
            },
            "feature_services": {
                name: [
                    {
                        "view": p.view,
                        "name": p.name,
                        "features": list(p.features),
                        "join_key_map": dict(sorted(p.join_key_map.items())),
                    }
                    for p in projections
                ]
                for name, projections in sorted(self.feature_services.items())
            },
        }
        return json.dumps(document, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "FeastNames":
        document = json.loads(text)
        return cls(
            entities=dict(document["entities"]),
            sources={name: Source(**s) for name, s in document["sources"].items()},
            feature_views={
                name: View(
                    entities=tuple(v["entities"]),
                    features=tuple(v["features"]),
                    online=v["online"],
                    source=v["source"],
                )
                for name, v in document["feature_views"].items()
            },
            feature_services={
                name: tuple(
                    Projection(
                        view=p["view"],
                        name=p["name"],
                        features=tuple(p["features"]),
                        join_key_map=dict(p["join_key_map"]),
                    )
                    for p in projections
                )
                for name, projections in document["feature_services"].items()
            },
        )

    @classmethod
    def read(cls, repo: Path) -> "FeastNames":
        """The names file of the Feast repository `repo` (FileNotFoundError if it has none)."""
        return cls.from_json((repo / NAMES_FILE).read_text())

    def write(self, repo: Path) -> bool:
        """Write the names file of `repo`; False, touching nothing, when it says this already."""
        path = repo / NAMES_FILE
        text = self.to_json()
        if path.is_file() and path.read_text() == text:
            return False
        path.write_text(text)
        return True
