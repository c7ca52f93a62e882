"""Feast declarations of the ridership use case (the Feast project `ridership`, named by this
folder's feature_store.yaml), in dependency order: the entity, sources, feature views, the label
view, the FeatureService. Declarations only: the `ridership/feature_registry` asset applies this
folder, as `feast apply` run in it does.

Sources are the daily feature tables of `usecases/ridership/features.py` in the lake
(`<lake>/ridership/<table>/<day>.parquet`); their paths are relative to the offline store's
`root` in feature_store.yaml. Every row is a station's day, stamped at the day's start; that
module says why no value is known before it.
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Float64, Int64, String

# The entity: every view is keyed by the station alone.
station = Entity(
    name="station",
    join_keys=["station"],
    value_type=ValueType.STRING,
    description='A Chicago "L" station, named as the data set names it (e.g. Clark_Lake).',
)


def _lake_table(table: str, description: str) -> FileSource:
    return FileSource(
        name=table,
        path=f"ridership/{table}",
        timestamp_field="event_timestamp",
        description=description,
    )


station_day_source = _lake_table("station_day", "Per station and day: the riders (the label).")
calendar_source = _lake_table("station_calendar", "Per station and day: the calendar.")
history_source = _lake_table("station_history", "Per station and day: the previous 28 days.")
weather_source = _lake_table("day_weather", "Per station and day: weather and home games.")

# A TTL is how old a row may be at the event and still be used. Rows and events are at a day's
# start, and a day is 23 to 25 hours long: a TTL of an hour gives an event its own day's row or
# nothing, never the day before's (whose history is a day stale, whose weather is another day's).
DAY_ROW_TTL = timedelta(hours=1)

station_calendar = FeatureView(
    name="station_calendar",
    entities=[station],
    ttl=DAY_ROW_TTL,
    source=calendar_source,
    schema=[
        Field(name="station_code", dtype=String),
        Field(name="day_of_week", dtype=Int64),
        Field(name="month", dtype=Int64),
        Field(name="day_of_year", dtype=Int64),
        Field(name="is_weekend", dtype=Int64),
        Field(name="is_holiday", dtype=Int64),
        Field(name="days_to_holiday", dtype=Int64),
    ],
    description="Where the day falls in the week, the year and the federal holidays.",
)
station_history = FeatureView(
    name="station_history",
    entities=[station],
    ttl=DAY_ROW_TTL,
    source=history_source,
    schema=[
        Field(name="rides_lag_1d", dtype=Float64),
        Field(name="rides_lag_7d", dtype=Float64),
        Field(name="rides_lag_14d", dtype=Float64),
        Field(name="rides_mean_7d", dtype=Float64),
        Field(name="rides_mean_28d", dtype=Float64),
        Field(name="rides_weekday_mean_4w", dtype=Float64),
        Field(name="days_known_28d", dtype=Int64),
    ],
    description="The station's riders on the days before: lags, trailing and same-weekday means.",
)
day_weather = FeatureView(
    name="day_weather",
    entities=[station],
    ttl=DAY_ROW_TTL,
    source=weather_source,
    schema=[
        Field(name="temp_min_f", dtype=Float64),
        Field(name="temp_f", dtype=Float64),
        Field(name="temp_max_f", dtype=Float64),
        Field(name="dewpoint_f", dtype=Float64),
        Field(name="humidity_pct", dtype=Float64),
        Field(name="pressure_inhg", dtype=Float64),
        Field(name="wind_mph", dtype=Float64),
        Field(name="gust_mph", dtype=Float64),
        Field(name="precip_in", dtype=Float64),
        Field(name="precip_max_in", dtype=Float64),
        Field(name="rain_share", dtype=Float64),
        Field(name="snow_share", dtype=Float64),
        Field(name="cloud_share", dtype=Float64),
        Field(name="storm_share", dtype=Float64),
        Field(name="blackhawks_home", dtype=Int64),
        Field(name="bulls_home", dtype=Int64),
        Field(name="bears_home", dtype=Int64),
        Field(name="white_sox_home", dtype=Int64),
        Field(name="cubs_home", dtype=Int64),
    ],
    description="Chicago's weather that day (read as its forecast) and the home games.",
)

# The label view: each station's riders of the day, never served online and never a model input.
# Its rows are the entity rows of a training set.
station_day = FeatureView(
    name="station_day",
    entities=[station],
    ttl=DAY_ROW_TTL,
    online=False,
    source=station_day_source,
    schema=[Field(name="rides", dtype=Float64)],
    description="Label: the riders who entered the station that day, in thousands.",
    tags={"role": "label"},
)

# What a model of version 1 reads. A new model that needs other features gets a new service
# (`ridership_v2`), so the features of models already serving never change under them.
ridership_v1 = FeatureService(
    name="ridership_v1",
    features=[station_calendar, station_history, day_weather],
    description="Inputs of the station ridership regression, version 1.",
)
