"""A window's training set from a feature store, without Dagster or Feast: the store is a small
hand-written fake that gives the label view's rows and joins one feature."""

import datetime as dt

import pandas as pd
import pytest

from ml.dataset import LabelSpec
from ml.training_set import TrainingSetRefused, assemble_training_set, time_split

pytestmark = pytest.mark.unit

WINDOW = {"start": "2013-01-01", "validation_start": "2013-01-03", "test_start": "2013-01-04",
          "end": "2013-01-05"}  # fmt: skip
SPLIT = time_split(WINDOW, "America/New_York")
LABEL = LabelSpec(view="outcome", label="delayed")


class Store:
    """The label view's rows, keyed by `flight`, and a feature `distance` joined to each."""

    def __init__(self, outcomes: pd.DataFrame, ttl: dt.timedelta | None = None):
        self.outcomes, self.ttl = outcomes, ttl

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        assert view == "outcome"
        stamps = self.outcomes["event_timestamp"]
        return self.outcomes[(stamps >= start) & (stamps < end)].reset_index(drop=True)

    def join_tolerance(self, view: str) -> tuple[list[str], dt.timedelta | None]:
        return ["flight"], self.ttl

    def join_keys(self, service: str) -> list[str]:
        return ["flight"]

    def historical_features(self, entity_rows: pd.DataFrame, service: str) -> pd.DataFrame:
        return entity_rows.assign(flights__distance=entity_rows["flight"] * 100.0)

    def feature_columns(self, service: str) -> list[str]:
        return ["flights__distance"]


def outcomes(stamps: list[str], delayed: list[float | None]) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "flight": range(len(stamps)),
            "event_timestamp": pd.to_datetime(stamps, utc=True),
            "delayed": delayed,
        }
    )


def test_the_window_s_labelled_rows_are_joined_split_and_described():
    store = Store(
        outcomes(
            ["2013-01-01T12:00Z", "2013-01-02T12:00Z", "2013-01-03T12:00Z",
             "2013-01-04T12:00Z", "2013-01-02T13:00Z", "2013-01-06T12:00Z"],
            [1, 0, 1, 0, None, 1],
        )
    )  # fmt: skip
    built = assemble_training_set(store, LABEL, "flights_v1", SPLIT, "event")
    assert built.frame["split"].tolist() == ["train", "train", "validation", "test"]
    assert built.frame["flights__distance"].tolist() == [0.0, 100.0, 200.0, 300.0]
    metadata = built.metadata()
    assert metadata["feature_service"] == "flights_v1" and metadata["features"] == 1
    assert metadata["unlabelled_rows_left_out"] == 1
    assert metadata["window"] == "[2013-01-01, 2013-01-05)"
    assert metadata["days_with_rows"] == "4 of 4"
    assert (metadata["rows_train"], metadata["rows_validation"], metadata["rows_test"]) == (2, 1, 1)
    assert (metadata["positive_rate_train"], metadata["positive_rate_test"]) == (0.5, 0.0)
    assert metadata["dataset_fingerprint"] == built.summary.fingerprint
    assert "null_features" not in metadata


def test_a_regression_s_set_has_no_positive_rates():
    store = Store(outcomes(["2013-01-01T12:00Z", "2013-01-04T12:00Z"], [3.5, 7.0]))
    label = LabelSpec(view="outcome", label="delayed", task="regression")
    metadata = assemble_training_set(store, label, "s", SPLIT, "event").metadata()
    assert metadata["rows_train"] == 1 and not any(k.startswith("positive_rate") for k in metadata)


def test_a_window_without_labels_is_refused_naming_the_view_and_window():
    store = Store(outcomes(["2013-01-01T12:00Z"], [None]))
    with pytest.raises(TrainingSetRefused, match=r"no labelled rows of 'outcome' in \[2013-01-01,"
                       r" 2013-01-05\) \(1 unlabelled\)"):  # fmt: skip
        assemble_training_set(store, LABEL, "s", SPLIT, "event")


def test_rows_the_join_cannot_tell_apart_are_refused():
    rows = outcomes(["2013-01-01T12:00Z", "2013-01-01T13:00Z"], [1, 0]).assign(flight=7)
    with pytest.raises(TrainingSetRefused, match="2 of 2 entity rows of view 'outcome' repeat"):
        assemble_training_set(Store(rows, ttl=dt.timedelta(days=1)), LABEL, "s", SPLIT, "event")


def test_a_window_day_that_is_no_date_is_refused_by_name():
    with pytest.raises(ValueError, match="training_set config end='soon' is not YYYY-MM-DD"):
        time_split({**WINDOW, "end": "soon"}, "UTC")
