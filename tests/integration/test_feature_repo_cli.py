"""Feast's own CLI sees the repository as the package does: `feast apply` run in a copy of a use
case's folder registers exactly the entities, data sources, feature views and feature services
that its `feature_registry` asset applies (`FeastFeatureStore.apply`), timestamps aside."""

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from usecases import BUNDLED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
TIMES = {"meta", "createdTimestamp", "lastUpdatedTimestamp"}


def without_times(value: Any) -> Any:
    """A registry object's document without the instants it was created and updated at."""
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k not in TIMES}
    if isinstance(value, list):
        return [without_times(v) for v in value]
    return value


def registered(store: Any) -> dict[str, dict[str, Any]]:
    """What the store's registry holds of its project, by kind and name."""
    from google.protobuf.json_format import MessageToDict

    store.refresh_registry()
    kinds = {
        "entities": store.list_entities(),
        "data_sources": store.list_data_sources(),
        "feature_views": store.list_feature_views(),
        "feature_services": store.list_feature_services(),
    }
    return {
        kind: {o.name: without_times(MessageToDict(o.to_proto())) for o in objects}
        for kind, objects in kinds.items()
    } | {"project": {"name": store.project}}


@pytest.mark.parametrize("name", [case.name for case in BUNDLED])
def test_feast_apply_in_a_use_cases_folder_registers_what_its_asset_applies(tmp_path, name):
    import feast

    copy = tmp_path / "checkout" / "feature_repo" / name
    shutil.copytree(DEFAULT_REPO / name, copy, ignore=shutil.ignore_patterns("__pycache__"))
    # The settings' relative paths land in the copy's `.local`, as the checkout's land in its own;
    # Feast creates the registry's folder but not its parent.
    (tmp_path / "checkout" / ".local" / "feast").mkdir(parents=True)
    cli = Path(sys.executable).with_name("feast")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    applied = subprocess.run(
        [str(cli), "apply"], cwd=copy, env=env, capture_output=True, text=True, timeout=300
    )
    assert applied.returncode == 0, applied.stdout[-2000:] + applied.stderr[-4000:]

    asset = FeastFeatureStore(repo_path=str(DEFAULT_REPO), home=str(tmp_path / "home"))
    asset = asset.for_use_case(name)
    done = asset.apply()

    by_cli = registered(feast.FeatureStore(repo_path=str(copy)))
    assert by_cli == registered(asset.store())
    assert by_cli["project"] == {"name": name}
    assert sorted(by_cli["feature_views"]) == done.feature_views != []
    assert sorted(by_cli["feature_services"]) == done.feature_services != []
