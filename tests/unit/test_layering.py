"""The layers stay layered: no import cycle among the project's modules (lazy imports inside
functions count too), no private name imported from another module, the declarations free of
everything but the standard library, `ml/` free of Dagster and of the layers above it, `assets/`
free of the wiring layer, and the commands (`cli/`) on top: nothing below them imports them."""

import ast
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("declare", "cli", "pipelines", "assets", "resources", "ml", "usecases", "feature_repo")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, ast.Module]:
    return {
        module_name(path): ast.parse(path.read_text())
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }


def imports(tree: ast.Module) -> list[tuple[str, list[str]]]:
    """(module, names) of every import in the module, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append((node.module, [alias.name for alias in node.names]))
    return found


def project_target(name: str, names: list[str], known: set[str]) -> list[str]:
    """The project modules an import reaches: the module itself, or its submodules named."""
    targets = [f"{name}.{n}" for n in names if f"{name}.{n}" in known]
    return targets or ([name] if name in known else [])


def graph() -> dict[str, set[str]]:
    trees = modules()
    known = set(trees)
    edges: dict[str, set[str]] = {}
    for name, tree in trees.items():
        reached = {
            t for module, names in imports(tree) for t in project_target(module, names, known)
        }
        # A package is imported on the way to its submodules: that is no edge of the importer's.
        edges[name] = {t for t in reached if t != name and not name.startswith(f"{t}.")}
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    return found


def test_no_import_cycle_among_the_projects_modules():
    assert cycles(graph()) == []


def test_the_cycle_check_finds_a_planted_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_no_private_name_is_imported_from_another_project_module():
    trees = modules()
    found = [
        f"{name}: from {module} import {n}"
        for name, tree in trees.items()
        for module, names in imports(tree)
        if module.split(".")[0] in PACKAGES
        for n in names
        if n.startswith("_")
    ]
    assert found == []


def run_time_imports(tree: ast.Module) -> list[str]:
    """The modules an import outside `if TYPE_CHECKING:` blocks names, at any depth."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            node.body = []  # annotations only: never run
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
    return found


def test_declarations_import_only_the_standard_library():
    """A team's declaration loads without dagster, feast, great_expectations, torch, pandas or
    any layer of the lifecycle: what it may import when it runs is the standard library."""
    declared = {name: tree for name, tree in modules().items() if name.startswith("declare")}
    assert "declare.usecase" in declared
    for name, tree in declared.items():
        outside = [
            module
            for module in run_time_imports(tree)
            if module.split(".")[0] not in sys.stdlib_module_names | {"declare"}
        ]
        assert outside == [], name


def test_the_declaration_check_sees_a_lazy_import_and_ignores_annotations():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dagster\n"
        "def f():\n    import torch\n"
    )
    assert run_time_imports(tree) == ["typing", "torch"]


def test_ml_imports_neither_dagster_nor_the_layers_above_it():
    for name, tree in modules().items():
        if not name.startswith("ml"):
            continue
        reached = {module.split(".")[0] for module, _ in imports(tree)}
        assert not reached & {"dagster", "pipelines", "assets", "resources", "usecases"}, name


def test_assets_never_import_the_wiring_layer():
    for name, tree in modules().items():
        if name.startswith("assets"):
            assert all(m.split(".")[0] != "pipelines" for m, _ in imports(tree)), name


def test_nothing_below_the_commands_imports_them():
    for name, tree in modules().items():
        if name.split(".")[0] != "cli":
            assert all(m.split(".")[0] != "cli" for m, _ in imports(tree)), name
