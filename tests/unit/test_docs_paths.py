"""The docs name only what exists: every repository path and every dotted name of a project
module that README.md, docs/ and the modules' docstrings mention is there. A file that moves, a
module that is renamed or a name that goes away fails here, instead of a reader."""

import ast
import re
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "declare", "ml", "assets", "resources", "pipelines", "cli", "usecases", "feature_repo",
    "benchmarks", "tests",
)  # fmt: skip
"""The project's Python packages: a dotted name starting with one of these is checked."""
FOLDERS = (*PACKAGES, "deploy", "docs", ".ci")
"""Top-level folders: a path starting with one of these is checked."""
PATH = re.compile(r"(?<![\w./:-])((?:" + "|".join(map(re.escape, FOLDERS)) + r")/[\w./-]*[\w/])")
DOTTED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")(?:\.\w+)+)")
PLACEHOLDER = re.compile(r"[<>{}*$]|\bNAME\b")
NOT_IN_THE_REPOSITORY = {
    "deploy/.env": "the operator's own settings, made from deploy/.env.example; never committed",
    "deploy/wheels": "where an image build finds a torch wheel the operator puts there",
    "deploy/dagster-daemon": "kubectl's name of the daemon's Deployment, not a path",
    "benchmarks/results/latest.json": "what `make bench` writes",
    "usecases/ratings/contracts.py": "README's example of what the scaffold writes",
    "feature_repo/ratings/ratings.py": "README's example of what the scaffold writes",
}
"""Paths the docs name on purpose that a checkout does not hold, and why."""


def documents() -> dict[str, str]:
    """Where each text comes from → the text: README.md, docs/*.md, every module's docstring."""
    texts = {"README.md": (REPO / "README.md").read_text()}
    texts |= {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "docs").glob("*.md"))}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            docstring = ast.get_docstring(ast.parse(path.read_text()))
            if docstring:
                texts[str(path.relative_to(REPO))] = docstring
    return texts


def paths(text: str) -> set[str]:
    """The repository paths `text` names (without placeholders such as `<name>` or `*`)."""
    found = set()
    for match in PATH.finditer(text):
        end = match.end()
        if PLACEHOLDER.search(text[end : end + 1]) or PLACEHOLDER.search(match.group(1)):
            continue
        found.add(match.group(1).rstrip("./"))
    return found


def dotted_names(text: str) -> set[str]:
    """The dotted names of project modules `text` quotes in backticks (`ml.gate.decide`)."""
    return {match.group(1) for match in DOTTED.finditer(text)}


@cache
def module_names(module: str) -> frozenset[str] | None:
    """The names a project module defines or imports at its top level; None: no such module."""
    base = REPO / Path(*module.split("."))
    path = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    if not path.is_file():
        return None
    names: set[str] = (
        {p.stem for p in base.glob("*.py")} | {p.name for p in base.iterdir() if p.is_dir()}
        if base.is_dir()
        else set()
    )
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(alias.asname or alias.name).split(".")[0] for alias in node.names}
    return frozenset(names)


def missing_name(dotted: str) -> str | None:
    """What of `dotted` does not exist: the longest prefix that is a module must define the next
    part (an attribute of that, such as a class's field, is not followed)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        names = module_names(".".join(parts[:cut]))
        if names is None:
            continue
        if cut == len(parts) or parts[cut] in names:
            return None
        return f"{'.'.join(parts[:cut])} has no {parts[cut]!r}"
    return f"no module {parts[0]}"


def test_the_docs_name_only_paths_that_exist():
    wrong = sorted(
        f"{source}: {path}"
        for source, text in documents().items()
        for path in paths(text)
        if not (REPO / path).exists() and path not in NOT_IN_THE_REPOSITORY
    )
    assert wrong == []


def test_the_docs_name_only_modules_and_names_that_exist():
    wrong = sorted(
        f"{source}: {name}: {problem}"
        for source, text in documents().items()
        for name in dotted_names(text)
        if (problem := missing_name(name))
    )
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("see `ml/gate.py` and ml/nothing.py.", {"ml/gate.py", "ml/nothing.py"}),
        ("`usecases/<name>/features.py`, feature_repo/*.py", set()),
        ("http://example.com/ml/x.py and .local/lake/ml/x", set()),
        ("deploy/dagster.yaml, then docs/x.md.", {"deploy/dagster.yaml", "docs/x.md"}),
        ("usecases/NAME/contracts.py", set()),
    ],
)
def test_the_path_reader_takes_paths_and_leaves_placeholders_and_urls(text, found):
    assert paths(text) == found


def test_a_name_that_is_gone_is_found_and_one_that_exists_is_not():
    assert missing_name("ml.gate.decide") is None
    assert missing_name("declare.UseCase") is None
    assert missing_name("ml.gate.no_such_rule") == "ml.gate has no 'no_such_rule'"
    assert missing_name("assets.usecase.UseCase") == "assets has no 'usecase'"
