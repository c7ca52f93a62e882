"""A new version of a published day is held to the last good one and to the tables of the same
events, by counts a person can check."""

from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from declare import Revisions
from resources.lake import Chunks, ParquetLake
from resources.revisions import (
    Counter,
    Version,
    against_last_good,
    against_same_events,
    published_version,
)

pytestmark = pytest.mark.unit
TENTH = Revisions(max_row_loss=0.1)


def test_a_published_day_is_counted_from_its_statistics_as_from_its_rows(tmp_path: Path):
    frame = pd.DataFrame({"id": range(10), "note": ["x", None] * 5, "gone": [np.nan] * 10})
    lake = ParquetLake(root=str(tmp_path))

    stored = lake.write(
        dg.AssetKey("t"), "2013-01-02", Chunks(lambda: iter([frame[:4], frame[4:]]))
    )
    counter = Counter()
    counter.add(frame)

    assert published_version(stored.table) == counter.version
    assert counter.version == Version(10, {"id": 10, "note": 5, "gone": 0})


@pytest.mark.parametrize(
    ("rows", "held"),
    [(900, None), (899, "revision.rows_kept"), (1200, None)],
)
def test_a_version_may_lose_the_declared_share_of_rows_and_no_more(rows: int, held):
    last = Version(999, {"id": 999})
    found = against_last_good("t", Version(rows, {"id": rows}), last, TENTH)
    assert (found and found.rule) == held


def test_a_column_emptied_is_held_back_naming_both_versions_counts():
    last = Version(918, {"tailnum": 912, "gust": 0})
    new = Version(918, {"tailnum": 0, "gust": 0})

    held = against_last_good("t", new, last, TENTH)

    assert held is not None and held.rule == "revision.columns_kept_values"
    assert held.message == (
        "the new version of t has no value in tailnum in any of its 918 rows; the published one"
        " has values (tailnum in 912 of its 918 rows)"
    )
    # A column that had no value before (gust), or an empty new day, is not an emptied column.
    assert against_last_good("t", Version(918, {"tailnum": 5, "gust": 0}), last, TENTH) is None


def test_a_table_short_of_the_same_events_is_held_back_and_a_longer_one_is_not():
    held = against_same_events("a", 660, "b", 956, TENTH)
    assert held is not None and held.message == (
        "a has 660 rows, b (the same events) 956 published (31% fewer, more than max_row_loss 10%)"
    )
    assert against_same_events("a", 956, "b", 660, TENTH) is None


def test_a_tolerance_outside_0_to_1_is_refused():
    with pytest.raises(ValueError, match="max_row_loss"):
        Revisions(max_row_loss=1.5)
