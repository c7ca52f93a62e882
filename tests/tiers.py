"""The test tiers: a test's tier is its folder. tests/unit is `unit`, tests/integration
`integration`, tests/e2e `e2e`. The folder adds the marker, so `-m unit` and `tests/unit` select
the same tests; a tier marker written in a file must agree with the folder, and one that
disagrees (or a test outside the three folders) stops the session before anything runs. `gpu` is
not a tier: it marks a test of any tier that needs a CUDA device.
"""

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e")
"""The tiers, each a folder of tests/ of that name."""

_refused: list[str] = []
"""Tests whose tier marker disagrees with their folder, found while collecting."""


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the folder under tests/ it sits in."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return parts[0] if len(parts) > 1 and parts[0] in TIERS else None


def pytest_itemcollected(item: pytest.Item) -> None:
    tier = tier_of(item.path)
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if tier is None:
        _refused.append(f"{item.nodeid}: not in a tier's folder (tests/{{{','.join(TIERS)}}})")
    elif marked - {tier}:
        _refused.append(
            f"{item.nodeid}: marked {', '.join(sorted(marked - {tier}))} in tests/{tier};"
            " move it to the folder of its tier"
        )
    else:
        item.add_marker(tier)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems() -> None:
    if _refused:
        raise pytest.UsageError(
            "a test's tier is its folder:\n" + "\n".join(f"  {line}" for line in _refused)
        )
