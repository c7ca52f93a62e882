"""Feast declarations of the flight-delay bands use case (the Feast project `flight_bands`, named
by this folder's feature_store.yaml), in dependency order: entities, sources, feature views, the
label view, the FeatureService. Declarations only: the `flight_bands/feature_registry` asset
applies this folder, as `feast apply` run in it does.

The flights use case's declarations (`feature_repo/flights/flights.py`) over this use case's own
lake tables (`<lake>/flight_bands/<table>/<day>.parquet`), with another label view: the band of
each flight's arrival delay (`usecases/flight_bands/features.py`).
"""

from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Bool, Float64, Int64, String

# Entities: what features are about.
flight = Entity(
    name="flight",
    join_keys=["flight_id"],
    value_type=ValueType.STRING,
    description="One scheduled departure: day, carrier, flight number and scheduled time.",
)
origin = Entity(
    name="origin",
    join_keys=["origin"],
    value_type=ValueType.STRING,
    description="The departure airport (FAA code).",
)
dest = Entity(
    name="dest",
    join_keys=["dest"],
    value_type=ValueType.STRING,
    description="The arrival airport (FAA code).",
)
carrier = Entity(
    name="carrier",
    join_keys=["carrier"],
    value_type=ValueType.STRING,
    description="The operating airline (IATA code).",
)
aircraft = Entity(
    name="aircraft",
    join_keys=["tailnum"],
    value_type=ValueType.STRING,
    description="One airframe, by its tail number.",
)


def _lake_table(table: str, description: str) -> FileSource:
    return FileSource(
        name=table,
        path=f"flight_bands/{table}",
        timestamp_field="event_timestamp",
        description=description,
    )


flight_source = _lake_table("flight_features", "Per flight: schedule and calendar.")
outcome_source = _lake_table("flight_band_outcomes", "Per flight: entity columns and the label.")
weather_source = _lake_table("weather_features", "Per origin airport and hour: the weather.")
aircraft_source = _lake_table("aircraft_features", "Per tail number and day: the aircraft.")
carrier_source = _lake_table("carrier_history", "Per carrier and day: trailing delays.")
route_source = _lake_table("route_history", "Per origin, destination and day: trailing delays.")

# Feature views. A TTL is how old a row may be at the event and still be used.
flight_schedule = FeatureView(
    name="flight_schedule",
    entities=[flight],
    ttl=timedelta(days=1),
    source=flight_source,
    schema=[
        Field(name="carrier_code", dtype=String),
        Field(name="origin_code", dtype=String),
        Field(name="dest_code", dtype=String),
        Field(name="distance_mi", dtype=Float64),
        Field(name="dep_hour", dtype=Int64),
        Field(name="day_of_week", dtype=Int64),
        Field(name="month", dtype=Int64),
        Field(name="days_to_holiday", dtype=Int64),
        Field(name="days_since_holiday", dtype=Int64),
    ],
    description="When and where the flight is scheduled to go.",
)
origin_weather = FeatureView(
    name="origin_weather",
    entities=[origin],
    # Hourly observations, each stamped when its hour is over; a day is predicted at its start,
    # so with the last one before it (23:00); a missing hour falls back to the one before.
    ttl=timedelta(hours=2),
    source=weather_source,
    schema=[
        Field(name="temp_f", dtype=Float64),
        Field(name="dewpoint_f", dtype=Float64),
        Field(name="humidity_pct", dtype=Float64),
        Field(name="wind_dir_deg", dtype=Float64),
        Field(name="wind_speed_mph", dtype=Float64),
        Field(name="wind_gust_mph", dtype=Float64),
        Field(name="precip_in", dtype=Float64),
        Field(name="pressure_mb", dtype=Float64),
        Field(name="visibility_mi", dtype=Float64),
    ],
    description="The last weather observed at the origin airport before the flight's day.",
)
aircraft_profile = FeatureView(
    name="aircraft_profile",
    entities=[aircraft],
    ttl=timedelta(days=1),
    source=aircraft_source,
    schema=[
        Field(name="aircraft_age_years", dtype=Float64),
        Field(name="seats", dtype=Float64),
        Field(name="engines", dtype=Float64),
        Field(name="aircraft_type", dtype=String),
        Field(name="engine_type", dtype=String),
    ],
    description="The airframe: its age on the day, size and engines.",
)


def _history_schema() -> list[Field]:
    return [
        field
        for days in (7, 28)
        for field in (
            Field(name=f"flights_{days}d", dtype=Int64),
            Field(name=f"arrivals_{days}d", dtype=Int64),
            Field(name=f"delay_rate_{days}d", dtype=Float64),
            Field(name=f"mean_arr_delay_{days}d", dtype=Float64),
            Field(name=f"cancel_rate_{days}d", dtype=Float64),
        )
    ]


carrier_history = FeatureView(
    name="carrier_history",
    entities=[carrier],
    ttl=timedelta(days=1),
    source=carrier_source,
    schema=_history_schema(),
    description="The carrier's delays over the last 7 and 28 days, as known at midnight.",
)
route_history = FeatureView(
    name="route_history",
    entities=[origin, dest],
    ttl=timedelta(days=1),
    source=route_source,
    schema=_history_schema(),
    description="The route's delays over the last 7 and 28 days, as known at midnight.",
)

# The label view: the outcome of each flight, never served online and never a model input.
# Its rows are the entity rows of a training set: they carry every join key the service needs.
flight_delay_band = FeatureView(
    name="flight_delay_band",
    entities=[flight],
    ttl=timedelta(days=1),
    online=False,
    source=outcome_source,
    schema=[
        Field(name="carrier", dtype=String),
        Field(name="origin", dtype=String),
        Field(name="dest", dtype=String),
        Field(name="tailnum", dtype=String),
        Field(name="arr_delay_min", dtype=Float64),
        Field(name="delay_band", dtype=String),
        Field(name="cancelled", dtype=Bool),
        Field(name="diverted", dtype=Bool),
    ],
    description="Label: the arrival delay's band; null for cancelled or diverted.",
    tags={"role": "label"},
)

# What a model of version 1 reads: the flight-delay classifier's features.
flight_delay_band_v1 = FeatureService(
    name="flight_delay_band_v1",
    features=[flight_schedule, origin_weather, aircraft_profile, carrier_history, route_history],
    description="Inputs of the flight-delay band classifier, version 1.",
)
