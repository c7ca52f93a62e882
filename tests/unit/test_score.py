"""Scoring a day without Dagster (`ml.score`): which rows a day predicts and where they come
from, the refusals that name what is missing, and the file and figures a scored day leaves."""

import dataclasses
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from declare import Prediction
from ml.results import Markdown, Unrounded
from ml.score import ScoreRefused, day_entities, score_day
from tests.unit.served import FEATURE, NEW_YORK, SERVED, SERVICE, Tables
from usecases.flights import USE_CASE

pytestmark = pytest.mark.unit

DAY = "2013-02-08"
WINDOW = (
    pd.Timestamp(DAY, tz=NEW_YORK).to_pydatetime(),
    pd.Timestamp("2013-02-09", tz=NEW_YORK).to_pydatetime(),
)
SLICE, UNSERVED = "view__carrier", "other__hour"


@dataclasses.dataclass
class Store:
    """`ml.score.FeatureRows`: the label view's rows, and a feature per flight from its id."""

    label_rows: pd.DataFrame
    asked: list[int] = dataclasses.field(default_factory=list)

    def view_rows(self, view: str, start: dt.datetime, end: dt.datetime) -> pd.DataFrame:
        stamps = self.label_rows["event_timestamp"]
        return self.label_rows[(stamps >= start) & (stamps < end)].reset_index(drop=True)

    def join_keys(self, service: str) -> list[str]:
        return ["flight_id"]

    def feature_columns(self, service: str) -> list[str]:
        return [FEATURE, SLICE]

    def historical_features(self, entity_rows: pd.DataFrame, service: str) -> pd.DataFrame:
        self.asked.append(len(entity_rows))
        ids = entity_rows["flight_id"].to_numpy()
        return entity_rows.assign(
            **{FEATURE: (ids % 5) - 2.0, SLICE: np.where(ids % 2, "AA", "UA"), UNSERVED: 1}
        )


def flights(ids: list[int], day: str = DAY) -> pd.DataFrame:
    """Flights of `day` leaving at hours 5..; the entities table's rows have more columns."""
    stamps = [
        pd.Timestamp(f"{day} {5 + n}:00", tz=NEW_YORK).tz_convert("UTC") for n in range(len(ids))
    ]
    return pd.DataFrame({"flight_id": ids, "event_timestamp": stamps, "tail": "N1"})


AHEAD = USE_CASE  # predicts from its entities table, flight_features, as of the day's start
AFTER = dataclasses.replace(USE_CASE, prediction=Prediction(at="event"))  # the label view's rows


def test_a_day_ahead_is_predicted_from_its_entities_table_at_the_days_start_in_key_order():
    tables = Tables({("flight_features", DAY): flights([7, 3, 5])})
    entities = day_entities(AHEAD, DAY, WINDOW, SERVICE, Store(flights([])), tables)
    assert list(entities.columns) == ["flight_id", "event_timestamp"]
    assert entities["flight_id"].tolist() == [3, 5, 7]
    assert set(entities["event_timestamp"]) == {pd.Timestamp(DAY, tz=NEW_YORK)}


def test_an_unbuilt_entities_day_or_one_without_the_join_keys_is_refused_by_name():
    with pytest.raises(ScoreRefused, match="rows of flight_features, whose day is not built: "):
        day_entities(AHEAD, DAY, WINDOW, SERVICE, Store(flights([])), Tables({}))
    keyless = Tables({("flight_features", DAY): flights([1]).drop(columns="flight_id")})
    with pytest.raises(ScoreRefused, match=r"flight_features lacks the columns \['flight_id'\]"):
        day_entities(AHEAD, DAY, WINDOW, SERVICE, Store(flights([])), keyless)


def test_without_an_entities_table_the_label_views_rows_of_the_day_are_predicted():
    store = Store(pd.concat([flights([1, 2]), flights([9], "2013-02-09")], ignore_index=True))
    entities = day_entities(AFTER, DAY, WINDOW, SERVICE, store, Tables({}))
    assert entities["flight_id"].tolist() == [1, 2]  # the next day's flight is not the day's
    assert entities["event_timestamp"].tolist() == flights([1, 2])["event_timestamp"].tolist()


def test_a_day_without_label_rows_is_refused_until_its_label_table_is_materialized():
    with pytest.raises(ScoreRefused, match="'flight_outcome' has no rows that day; materialize"):
        day_entities(AFTER, DAY, WINDOW, SERVICE, Store(flights([])), Tables({}))
    published = Tables({("flight_outcomes", DAY): flights([])})
    assert day_entities(AFTER, DAY, WINDOW, SERVICE, Store(flights([])), published).empty


def test_a_scored_day_keeps_the_keys_the_served_slices_and_the_version(tmp_path: Path):
    store = Store(flights([]))
    tables = Tables({("flight_features", DAY): flights(list(range(10)))})
    entities = day_entities(AHEAD, DAY, WINDOW, SERVICE, store, tables)
    slices = [dataclasses.replace(USE_CASE.slices[0], column=c) for c in (SLICE, UNSERVED)]
    scores = score_day(SERVED, entities, slices, store, tmp_path / f"{DAY}.parquet", chunk_rows=4)

    assert store.asked == [4, 4, 2]  # features fetched a chunk at a time
    written = pq.read_table(tmp_path / f"{DAY}.parquet").to_pandas()
    assert list(written.columns) == [
        *("flight_id", "event_timestamp", SLICE, "probability", "predicted"),
        *("model_name", "model_version", "predicted_at"),
    ]  # the slice column Feast does not serve is not kept
    assert set(written["model_version"]) == {"3"} and set(written["model_name"]) == {"delays"}
    expected = 1 / (1 + np.exp(-((np.arange(10) % 5) - 2.0)))
    np.testing.assert_allclose(written["probability"], expected, rtol=1e-6)
    assert written["predicted"].tolist() == (expected >= 0.5).tolist()

    metadata = scores.metadata()
    assert scores.summary.rows == 10
    assert metadata["model"] == "delays v3" and metadata["feature_service"] == SERVICE
    assert metadata["predicted_positive"] == int((expected >= 0.5).sum())
    # Every digit of the mean (a figure elsewhere is rounded when shown), and a bar table.
    assert isinstance(metadata["mean_probability"], Unrounded)
    assert metadata["mean_probability"] == pytest.approx(expected.mean(), rel=1e-6)
    assert isinstance(metadata["probability_histogram"], Markdown)
    assert metadata["probability_histogram"].startswith("| probability | rows | |\n|---|---|---|")
