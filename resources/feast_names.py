"""A Feast repository's declarations, parsed as Feast's CLI parses them, and the names they
declare (`declare.feast_names.FeastNames`): written to the repository's names file, and compared
with it before an apply.

Feast is imported when a function here runs (~11 s), never when the module loads.
"""

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from declare.feast_names import NAMES_FILE, REFRESH, FeastNames, Projection, Source, View
from ml.results import Refused

if TYPE_CHECKING:
    from feast.repo_contents import RepoContents

FEATURE_STORE_YAML = "feature_store.yaml"


class StaleNames(Refused):
    """A repository's names file says otherwise than its declarations."""


def modules(repo: Path) -> list[Path]:
    """The Python files Feast imports from `repo` (its own caches aside)."""
    return [path for path in repo.rglob("*.py") if "__pycache__" not in path.parts]


def parse(repo: Path) -> "RepoContents":
    """The objects the declarations of `repo` define, as `feast apply` run there reads them."""
    from feast.repo_operations import parse_repo

    with _inside(repo) as root:
        return parse_repo(root)


def names_of(contents: "RepoContents") -> FeastNames:
    """The names a parsed repository declares (Feast's placeholder entity of entityless views
    aside)."""
    from feast.feature_view import DUMMY_ENTITY_NAME

    sources = {}
    views = {}
    for view in contents.feature_views:
        source = view.batch_source
        assert source is not None  # a batch feature view always has one
        key = source.name or getattr(source, "path", "")
        sources[key] = Source(getattr(source, "path", ""), source.timestamp_field)
        views[view.name] = View(
            entities=tuple(e for e in view.entities if e != DUMMY_ENTITY_NAME),
            features=tuple(f.name for f in view.features),
            online=view.online,
            source=key,
        )
    services = {
        service.name: tuple(
            Projection(
                view=p.name,
                name=p.name_to_use(),
                features=tuple(f.name for f in p.features),
                join_key_map=dict(p.join_key_map),
            )
            for p in service.feature_view_projections
        )
        for service in contents.feature_services
    }
    return FeastNames(
        entities={e.name: e.join_key for e in contents.entities if e.name != DUMMY_ENTITY_NAME},
        sources=sources,
        feature_views=views,
        feature_services=services,
    )


def refresh(repo: Path) -> bool:
    """Write `repo`'s names file from its declarations; whether it changed."""
    return names_of(parse(repo)).write(repo)


def check_names(repo: Path, contents: "RepoContents") -> None:
    """Refuse a repository whose names file is missing or says otherwise than `contents`, its
    parsed declarations: the load-time checks of its use case read that file."""
    refresh_it = f"`{REFRESH} {repo}` writes it again from the declarations; commit it with them"
    try:
        written = FeastNames.read(repo)
    except FileNotFoundError:
        raise StaleNames(f"{repo} has no {NAMES_FILE}: {refresh_it}") from None
    if written != names_of(contents):
        raise StaleNames(f"{repo}/{NAMES_FILE} is not what its declarations name: {refresh_it}")


@contextlib.contextmanager
def _inside(repo: Path) -> Iterator[Path]:
    """Feast names the declaration modules by their path from the working directory and imports
    them from sys.path, so its CLI runs from the repo folder; so does a parse here, and then
    returns.

    A module imported before from a Feast repository under the same name (an earlier parse,
    another copy of the repository) is imported afresh, else it would be read in place of the
    file as it is now."""
    if not (repo / FEATURE_STORE_YAML).is_file():
        raise FileNotFoundError(f"{repo} is no Feast repository: no {FEATURE_STORE_YAML}")
    for path in modules(repo):
        name = ".".join(path.relative_to(repo).with_suffix("").parts)
        module = sys.modules.get(name)
        loaded_from = getattr(module, "__file__", None)
        if loaded_from is not None and (Path(loaded_from).parent / FEATURE_STORE_YAML).is_file():
            del sys.modules[name]
    previous = Path.cwd()
    sys.path.insert(0, str(repo))
    os.chdir(repo)
    try:
        yield repo
    finally:
        os.chdir(previous)
        sys.path.remove(str(repo))
