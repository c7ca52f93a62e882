"""Adding a use case keeps the suite green: a third one is scaffolded into a temporary copy of the
project (event data, ordinary column names such as `user_id` and `ts`), registered there, and the
suite's declaration checks run on that copy, where they enumerate three declared use cases."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.samples import TIMEZONE, write_events
from usecases import BUNDLED

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAME = "third_case"
DECLARATION_CHECKS = (
    "tests/unit/test_definitions.py",
    "tests/unit/test_generic_modules.py",
    "tests/unit/test_feature_repo.py",
    "tests/unit/test_references.py",
    "tests/unit/test_usecase.py",
)
"""The tests that read every declared use case: the graph, its checks and groups, the generic
modules' vocabulary, its Feast repository and the references into it, each declaration and its
Feast module."""
BUNDLED_ONLY = (
    "tests/unit/test_definitions.py::test_the_ui_shows_the_definitions_the_snapshot_holds"
)
"""Holds the bundled use cases' Definitions as tests/definitions.json has them: with a third use
case they differ on purpose."""


def copy_of_the_project(target: Path) -> Path:
    """The working tree's files (tracked, and new ones git does not ignore) under `target`."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = REPO / relative
        if source.is_file():
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / relative)
    return target


def python(copy: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python argv` in the copy: its packages, not this checkout's, are the ones imported."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    return subprocess.run(
        [sys.executable, *argv], cwd=copy, env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = copy_of_the_project(tmp_path_factory.mktemp("project"))
    sample = write_events(copy / "ratings.csv")
    scaffolded = python(
        copy,
        *("-m", "cli.scaffold", NAME, "--data", str(sample), "--entity", "user_id"),
        *("--timestamp", "ts", "--label", "liked", "--task", "binary", "--timezone", TIMEZONE),
    )
    assert scaffolded.returncode == 0, scaffolded.stderr
    return copy


def test_the_copy_declares_the_third_use_case_beside_the_bundled_ones(copy: Path):
    probe = "import json, usecases; print(json.dumps([c.name for c in usecases.USE_CASES]))"
    listed = python(copy, "-c", probe)
    assert listed.returncode == 0, listed.stderr
    bundled = [case.name for case in BUNDLED]
    assert json.loads(listed.stdout.strip().splitlines()[-1]) == [*bundled, NAME]


def test_the_declaration_checks_pass_with_a_third_use_case(copy: Path):
    checked = python(
        copy,
        *("-m", "pytest", *DECLARATION_CHECKS, "--deselect", BUNDLED_ONLY),
        *("-q", "-p", "no:cacheprovider", "-m", "unit"),
    )
    assert checked.returncode == 0, checked.stdout[-4000:] + checked.stderr[-2000:]
    assert (
        f"[{NAME}]"
        in python(
            copy,
            "-m",
            "pytest",
            DECLARATION_CHECKS[-1],
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ).stdout
    )
