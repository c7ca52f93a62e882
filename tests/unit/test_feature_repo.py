"""Feast's repositories: one folder per declared use case, `feature_repo/<name>/`, holding the
module `<name>.py` and a feature_store.yaml of the project `<name>`; every repository's settings,
and the scaffold's template of them, are the same but for the project."""

import string
from pathlib import Path

import pytest
import yaml

from usecases import USE_CASES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
SETTINGS = sorted((REPO / "feature_repo").glob("*/feature_store.yaml"))
TEMPLATE = REPO / "usecases" / "scaffold_templates" / "feature_store.yaml.tmpl"


def test_each_declared_use_case_and_only_they_have_a_feast_repository():
    assert {path.parent.name for path in SETTINGS} == {case.name for case in USE_CASES}


@pytest.mark.parametrize("case", USE_CASES, ids=lambda case: case.name)
def test_a_repository_is_the_feast_project_of_its_use_case(case):
    folder = REPO / "feature_repo" / case.name
    assert yaml.safe_load((folder / "feature_store.yaml").read_text())["project"] == case.name
    assert (folder / f"{case.name}.py").is_file()


def test_the_settings_differ_in_their_project_alone():
    texts = {path.parent.name: path.read_text() for path in SETTINGS}
    texts["scaffolded"] = string.Template(TEMPLATE.read_text()).substitute(name="scaffolded")
    assert len(texts) > 2
    unnamed = {
        text.replace(f"\nproject: {name}\n", "\nproject: <project>\n", 1)
        for name, text in texts.items()
    }
    assert len(unnamed) == 1, "feature_store.yaml files differ beyond `project`"
    assert "project: <project>" in unnamed.pop()
