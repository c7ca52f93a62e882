"""The lifecycle is generic: no module of cli/, pipelines/, assets/, resources/ or ml/ names a
bundled use case's tables, columns, label, model, feature service or Feast views. What is specific
lives in `usecases/<name>/` and `feature_repo/<name>/` only, and the one list of use cases is
`usecases.USE_CASES`. The vocabulary is the bundled use cases' (`usecases.BUNDLED`): a use case
added later may name its columns with ordinary words (`user`, `timestamp`) that generic code
says too, without making the generic code specific."""

import io
import re
import tokenize
from pathlib import Path

import pytest

from declare import UseCase
from usecases import BUNDLED, USE_CASES

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GENERIC = ("cli", "pipelines", "assets", "resources", "ml")

EVERYDAY_WORDS = {
    *("date", "day", "hour", "minute", "month", "time", "year"),
    *("temp", "dest", "distance", "cancelled", "origin"),
}
"""Column names that are also everyday words of generic code (a partition's `day`, the `time`
module, a `temp` file, argparse's `dest`): a use case may name a column so without making every
module that says the word specific (`distance` of bins, a `cancelled` run, a catalog entry's
`origin`, a backtest's rolling origins). Everything else a use
case declares counts."""

WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def names(case: UseCase) -> set[str]:
    """What the use case names: itself, its tables, label, model, feature service and the
    objects of its Feast module. No generic module may say them anywhere, prose included."""
    words = {case.name, case.registered_model, case.feature_service}
    words |= {case.label.view, case.label.column, case.label.table}
    for table in case.event_tables:
        prefixed = (f"{stage}_{table.name}" for stage in ("raw", "validated", "quarantined"))
        words |= {table.name, *prefixed}
    words |= {dimension.name for dimension in case.dimensions}
    words |= {spec.name for spec in case.feature_tables}
    feast = (REPO / "feature_repo" / case.name / f"{case.name}.py").read_text()
    words |= set(re.findall(r'\bname="([A-Za-z_][A-Za-z0-9_]*)"', feast))
    return words - EVERYDAY_WORDS


def columns(case: UseCase) -> set[str]:
    """The columns the use case declares (raw, flags, slices, baseline): no generic module's
    code may use them (its comments and docstrings may say a column's everyday word)."""
    words = {c for t in case.event_tables for c in (*t.contract.column_names, *t.counted_flags)}
    words |= {s.column for s in case.slices}
    if case.baseline:
        words.add(case.baseline)
    return words - EVERYDAY_WORDS


def words(path: Path, *, prose: bool) -> list[tuple[str, int]]:
    """The words of a module's identifiers and string literals, with their lines; with `prose`,
    also those of its docstrings and comments."""
    found = []
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    for previous, token in zip([None, *tokens], tokens, strict=False):
        if token.type == tokenize.NAME:
            found.append((token.string, token.start[0]))
            continue
        docstring = token.type == tokenize.STRING and (
            previous is None or previous.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.NL)
        )
        if token.type == tokenize.COMMENT or docstring:
            if not prose:
                continue
        elif token.type != tokenize.STRING:
            continue
        found += [(w, token.start[0]) for w in WORD.findall(token.string)]
    return found


def generic_modules() -> list[Path]:
    return sorted(p for folder in GENERIC for p in (REPO / folder).rglob("*.py"))


def declared(path: Path) -> list[str]:
    found = []
    for case in BUNDLED:
        for vocabulary, prose in ((names(case), True), (columns(case), False)):
            found += [
                f"{path.relative_to(REPO)}:{line}: {word!r} (use case {case.name})"
                for word, line in words(path, prose=prose)
                if word in vocabulary
            ]
    return found


def test_no_generic_module_names_anything_a_use_case_declares():
    found = [line for path in generic_modules() for line in declared(path)]
    assert not found, "\n".join(found)


def test_the_check_sees_names_in_prose_and_columns_in_code(tmp_path):
    planted = tmp_path / "stage.py"
    planted.write_text(
        '"""Reads validated_flights."""\n'
        "SIZE = 3  # dep_delay in prose is fine\n"
        'LABEL = "arrival_delayed"\n'
        "CARRIER = row.carrier\n"
    )
    found = {w for w, _ in words(planted, prose=True)}
    code = {w for w, _ in words(planted, prose=False)}
    assert {"validated_flights", "dep_delay"} <= found - code
    assert {"arrival_delayed", "carrier"} <= code
    flights = BUNDLED[0]
    assert {"validated_flights", "arrival_delayed"} <= names(flights)
    assert {"dep_delay", "carrier"} <= columns(flights)


def test_the_bundled_use_cases_are_declared_ones():
    assert {case.name for case in BUNDLED} <= {case.name for case in USE_CASES}
