"""Training-set assembly as plain functions: the label spec, the time split, the fingerprint."""

import datetime as dt

import pandas as pd
import pytest

from ml.dataset import (
    LabelSpec,
    TimeSplit,
    as_of_day_start,
    assemble,
    fingerprint,
    labelled_rows,
    repeated_keys,
)

pytestmark = pytest.mark.unit

SPLIT = TimeSplit(
    start=dt.date(2013, 1, 1),
    validation_start=dt.date(2013, 1, 3),
    test_start=dt.date(2013, 1, 4),
    end=dt.date(2013, 1, 5),
    timezone="America/New_York",
)
SPEC = LabelSpec(view="outcome", label="delayed")


def rows() -> pd.DataFrame:
    stamps = pd.to_datetime(
        [
            "2013-01-01T05:00:00Z",  # local midnight: first instant of the train part
            "2013-01-03T04:59:59Z",  # one second before local midnight: still train
            "2013-01-03T05:00:00Z",  # validation
            "2013-01-04T12:00:00Z",  # test
            "2013-01-02T12:00:00Z",  # unlabelled
        ]
    )
    return pd.DataFrame(
        {
            "flight_id": ["a", "b", "c", "d", "e"],
            "carrier": ["X", "X", "Y", "Y", "Y"],
            "event_timestamp": stamps,
            "delayed": pd.array([1, 0, 1, 0, None], dtype="Int64"),
            "arr_delay_min": [30.0, 0.0, 20.0, 1.0, None],  # describes the outcome itself
        }
    )


def test_entity_rows_keep_keys_timestamp_and_label_only_and_drop_unlabelled():
    entity, unlabelled = labelled_rows(rows(), SPEC, ["flight_id", "carrier"])
    assert list(entity.columns) == ["flight_id", "carrier", "event_timestamp", "delayed"]
    assert entity["flight_id"].tolist() == ["a", "b", "c", "d"]
    assert unlabelled == 1


def test_a_label_view_without_a_needed_join_key_is_refused_by_name():
    with pytest.raises(ValueError, match=r"lacks the entity column\(s\) \['tailnum'\]"):
        labelled_rows(rows(), SPEC, ["flight_id", "tailnum"])


def test_the_split_cuts_at_local_midnight():
    entity, _ = labelled_rows(rows(), SPEC, ["flight_id"])
    frame, summary = assemble(entity.assign(f__x=1.0), SPEC, SPLIT, ["f__x"], 1)
    assert frame["split"].tolist() == ["train", "train", "validation", "test"]
    assert summary.rows == {"train": 2, "validation": 1, "test": 1}
    assert summary.positives == {"train": 1, "validation": 1, "test": 0}
    assert summary.positive_rate("train") == 0.5
    assert summary.fingerprint == fingerprint(frame)


def test_rows_outside_the_window_are_refused_not_split():
    late = pd.DataFrame(
        {"event_timestamp": pd.to_datetime(["2013-01-05T05:00:00Z"]), "delayed": [1]}
    )
    with pytest.raises(ValueError, match=r"1 event timestamp\(s\) outside"):
        SPLIT.assign(late["event_timestamp"])


@pytest.mark.parametrize(
    ("field", "value"), [("validation_start", dt.date(2013, 1, 1)), ("end", dt.date(2013, 1, 4))]
)
def test_split_bounds_out_of_order_are_refused_by_field(field, value):
    bounds = {
        "start": SPLIT.start,
        "validation_start": SPLIT.validation_start,
        "test_start": SPLIT.test_start,
        "end": SPLIT.end,
        field: value,
    }
    with pytest.raises(ValueError, match=field):
        TimeSplit(**bounds)


def test_the_fingerprint_changes_with_any_value_or_order_and_not_otherwise():
    frame = rows()
    assert fingerprint(frame) == fingerprint(frame.copy())
    changed = frame.copy()
    changed.loc[2, "arr_delay_min"] = 21.0
    assert fingerprint(changed) != fingerprint(frame)
    assert fingerprint(frame.iloc[::-1]) != fingerprint(frame)


def test_a_regression_label_keeps_its_values_and_the_summary_its_means():
    spec = LabelSpec(view="outcome", label="arr_delay_min", task="regression")
    entity, unlabelled = labelled_rows(rows(), spec, ["flight_id"])
    assert entity["arr_delay_min"].tolist() == [30.0, 0.0, 20.0, 1.0]
    assert entity["arr_delay_min"].dtype == "float64" and unlabelled == 1
    _, summary = assemble(entity.assign(f__x=1.0), spec, SPLIT, ["f__x"], 1)
    assert summary.label_mean == {"train": 15.0, "validation": 20.0, "test": 1.0}
    assert summary.positives == {} and summary.positive_rate("train") is None
    with pytest.raises(ValueError, match="task='count'"):
        LabelSpec(view="outcome", label="arr_delay_min", task="count")


def test_rows_are_taken_as_of_their_local_days_start_across_a_clock_change():
    stamps = pd.Series(
        pd.to_datetime(
            [
                "2013-03-10T05:00:00Z",  # local midnight (EST) of the day the clocks go forward
                "2013-03-11T03:59:00Z",  # 23:59 EDT that day
                "2013-03-11T04:00:00Z",  # local midnight (EDT) of the next day
                "2013-01-01T04:59:59Z",  # 23:59:59 on New Year's Eve
            ]
        ).as_unit("us")
    )
    frame = pd.DataFrame({"flight_id": list("abcd"), "event_timestamp": stamps})
    taken = as_of_day_start(frame, "America/New_York")
    assert taken["event_timestamp"].tolist() == list(
        pd.to_datetime(
            [
                "2013-03-10T05:00:00Z",
                "2013-03-10T05:00:00Z",
                "2013-03-11T04:00:00Z",
                "2012-12-31T05:00:00Z",
            ]
        )
    )
    assert taken["event_timestamp"].dtype == frame["event_timestamp"].dtype  # unit and zone kept
    assert taken["flight_id"].tolist() == list("abcd")
    assert frame["event_timestamp"].iloc[1] == pd.Timestamp("2013-03-11T03:59:00Z")  # a copy


def test_keys_apart_by_more_than_the_tolerance_or_without_a_key_are_not_repeats():
    rows = pd.DataFrame(
        {
            "user_id": ["u1", "u1", None, None, "u2"],
            "event_timestamp": pd.to_datetime(
                ["2024-03-01T10:00:00", "2024-03-01T10:00:02", "2024-03-01T10:00:00",
                 "2024-03-01T10:00:00", "2024-03-01T10:00:00"], utc=True
            ),
        }
    )  # fmt: skip
    assert repeated_keys(rows, "v", ["user_id"], dt.timedelta(seconds=1)) is None
    found = repeated_keys(rows, "v", ["user_id"], dt.timedelta(seconds=2))
    assert found is not None and (found.rows, found.total) == (2, 5)
    unbounded = repeated_keys(rows, "v", ["user_id"], None)
    assert unbounded is not None and "repeat its join key (user_id) at all" in str(unbounded)
