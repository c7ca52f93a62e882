"""`python -m pipelines.scaffold`'s refusals, by name and before anything is written, and how it
reads a column (the use cases it lays out run in tests/integration/test_scaffold.py)."""

from pathlib import Path

import pandas as pd
import pytest

from cli import scaffold
from cli.scaffold_survey import identifier_like

pytestmark = pytest.mark.unit


def test_events_no_column_tells_apart_are_refused_with_what_to_declare(tmp_path, capsys):
    frame = pd.DataFrame(
        {"user": ["a", "a", "a", "b"], "at": [1709300000, 1709300000, 1709300000, 1709500000],
         "spent": [1.0, 1.0, 2.0, 3.0], "churned": [0, 1, 0, 1]}
    )  # fmt: skip
    frame.to_csv(tmp_path / "same.csv", index=False)
    error = refused(capsys, *arguments(tmp_path / "same.csv", label="churned", task="binary"))
    assert "2 row(s) repeat an entity's day, so a row is an event" in error
    assert error.strip().endswith("declare the columns that do: --event-key COL[,COL]")
    error = refused(capsys, *arguments(tmp_path / "same.csv", label="churned", task="binary",
                                       **{"event-key": "user,at"}))  # fmt: skip
    assert "--event-key user,at: 2 row(s) repeat a key of an earlier row" in error


# Refusals: by name, before anything is written.


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    frame = pd.DataFrame(
        {
            "user": ["a", "b", "a"],
            "at": [1709300000, 1709400000, 1709500000],
            "spent": [1.5, 2.0, 3.5],
            "churned": [0, 1, 2],
        }
    )
    frame.to_csv(tmp_path / "tiny.csv", index=False)
    return tmp_path / "tiny.csv"


def refused(capsys: pytest.CaptureFixture, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_:
        scaffold.main(list(argv))
    assert exit_.value.code == 2
    return capsys.readouterr().err


def arguments(data: Path, name: str = "ok", **changes: str) -> list[str]:
    given = {"entity": "user", "timestamp": "at", "label": "spent", "task": "regression"}
    given |= changes
    flags = [part for flag, value in given.items() for part in (f"--{flag}", value)]
    return [name, "--data", str(data), *flags, "--root", str(data.parent)]


@pytest.mark.parametrize("name", ["Churn", "2churn", "my-case", "class", "churn rate"])
def test_a_name_that_is_not_lower_snake_case_is_refused(tiny, capsys, name):
    assert "must be lower_snake_case" in refused(capsys, *arguments(tiny, name))
    assert not (tiny.parent / "usecases").exists()


def test_an_existing_use_case_folder_is_refused(tiny, capsys):
    (tiny.parent / "usecases" / "taken").mkdir(parents=True)
    error = refused(capsys, *arguments(tiny, "taken"))
    assert "use case 'taken' exists already" in error
    assert list((tiny.parent / "usecases" / "taken").iterdir()) == []


@pytest.mark.parametrize("flag", ["entity", "timestamp", "label"])
def test_a_column_the_sample_lacks_is_refused_by_name(tiny, capsys, flag):
    error = refused(capsys, *arguments(tiny, **{flag: "nope"}))
    assert f"--{flag} 'nope': tiny.csv has no such column" in error
    assert "['user', 'at', 'spent', 'churned']" in error


def test_a_binary_label_that_is_not_zero_or_one_is_refused(tiny, capsys):
    error = refused(capsys, *arguments(tiny, label="churned", task="binary"))
    assert "--label 'churned': a binary label is 0 or 1; the sample also has [2]" in error
    assert not (tiny.parent / "usecases").exists()


@pytest.mark.parametrize(
    ("name", "values", "identifier"),
    [
        ("item_id", [3, 3, 4, 5], "integers named 'item_id'"),
        ("itemId", [3, 3, 4, 5], "integers named 'itemId'"),
        ("paid", [0, 1, 1, 0], ""),  # ends in "id", names nothing
        ("order_no", [101, 102, 103, 104], "4 distinct integers in 4 rows"),
        ("amount", [1.5, 2.25, 3.0, 4.75], ""),  # a quantity, not whole numbers
    ],
)
def test_a_number_column_reads_like_an_identifier_by_its_name_or_its_values(
    name, values, identifier
):
    assert identifier_like(pd.Series(values, name=name)) == identifier
