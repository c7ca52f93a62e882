"""A day is predicted before it happens: from what was published ahead of it (its schedule) and
from the days before, as of its start. Proven on the world's champion: the day is predicted; its
outcomes and every observation after its start then change, are ingested, published and built
into the lake; predicted again, the day's predictions are the same, byte for byte. An
observation from before the day's start, changed the same way, does change them: the comparison
can fail.

Changes to the world: the drops of 2013-02-07 and 2013-02-08 are rewritten and their days
re-published, then put back as they were and published again; 2013-02-08 keeps predictions of
champion v1 (test_monitoring scores it again itself).
"""

from collections.abc import Iterator

import numpy as np
import pandas as pd
import pytest

from tests.conftest import bundled_day, write_csv_drop, write_day_drops
from tests.world import World
from usecases.flights import USE_CASE as CASE
from usecases.flights.contracts import OUTCOME_COLUMNS

pytestmark = pytest.mark.integration

DAY = "2013-02-08"
BEFORE = "2013-02-07"


def lake_table(world: World, asset: str, day: str) -> pd.DataFrame:
    return pd.read_parquet(world.home / "lake" / CASE.name / asset / f"{day}.parquet")


def predicted(world: World) -> pd.DataFrame:
    """DAY predicted as the nightly run does (`predict_day`), without the wall-clock column."""
    result = world.run("predict_day", DAY)
    assert result.success
    return lake_table(world, "batch_predictions", DAY).drop(columns="predicted_at")


def publish(world: World, day: str) -> None:
    assert world.run("daily_partition", day).success, day


def changed_outcomes(flights: pd.DataFrame) -> pd.DataFrame:
    """Every flight of the day turned out otherwise: later, or cancelled (the first 50)."""
    later = flights.assign(
        dep_delay=flights["dep_delay"] + 180,
        arr_delay=flights["arr_delay"] + 240,
        air_time=flights["air_time"] + 20,
    )
    later.loc[later.index[:50], list(OUTCOME_COLUMNS)] = np.nan
    return later


def changed_weather(weather: pd.DataFrame) -> pd.DataFrame:
    return weather.assign(
        temp=weather["temp"] + 25,
        humid=100 - weather["humid"],
        wind_speed=weather["wind_speed"] + 30,
        precip=weather["precip"] + 0.5,
        visib=weather["visib"] / 4,
    )


@pytest.fixture
def restored(world: World) -> Iterator[World]:
    """The world, its two days' drops put back and re-published after the test."""
    yield world
    for day in (BEFORE, DAY):
        write_day_drops(world.drops, day)
        publish(world, day)


def test_no_outcome_of_a_day_and_nothing_observed_after_its_start_reaches_its_predictions(
    restored: World,
):
    world = restored
    first = predicted(world)
    assert len(first) == len(bundled_day("flights", DAY))
    outcomes, weather = (
        lake_table(world, "flight_outcomes", DAY),
        lake_table(world, "weather_features", DAY),
    )

    write_csv_drop(world.drops, "flights", DAY, changed_outcomes(bundled_day("flights", DAY)))
    write_csv_drop(world.drops, "weather", DAY, changed_weather(bundled_day("weather", DAY)))
    publish(world, DAY)
    # The lake holds the changed day: its labels and its weather are not what they were...
    changed = lake_table(world, "flight_outcomes", DAY)
    assert (changed["arrival_delayed"].fillna(-1) != outcomes["arrival_delayed"].fillna(-1)).sum()
    assert changed["arrival_delayed"].isna().sum() >= 50
    assert not lake_table(world, "weather_features", DAY)["temp_f"].equals(weather["temp_f"])
    # ...and the day predicted again from it is predicted exactly as before.
    second = predicted(world)
    pd.testing.assert_frame_equal(second, first)
    assert second["probability"].to_numpy().tobytes() == first["probability"].to_numpy().tobytes()

    # The last hour observed before the day's start is what its predictions know of the weather:
    # changed, it changes them.
    before = bundled_day("weather", BEFORE)
    last_hour = before["hour"] == 23
    assert last_hour.sum() == 3  # one observation per origin airport
    before.loc[last_hour] = changed_weather(before.loc[last_hour])
    write_csv_drop(world.drops, "weather", BEFORE, before)
    publish(world, BEFORE)
    third = predicted(world)
    assert (third["probability"] != first["probability"]).mean() > 0.5
