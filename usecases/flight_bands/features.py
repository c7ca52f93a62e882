"""The label of the flight-delay bands use case: each flight's arrival delay in bands.

Every other feature table is the flights use case's (`usecases.flights.features`): the same
flights, weather and aircraft, the same leak-free features, another question asked of them.
"""

import numpy as np
import pandas as pd

from ml.features import FeatureTable
from usecases.flights.features import flight_outcomes

BANDS = (
    ("on_time", -np.inf, 15.0),
    ("late_15_to_44", 15.0, 45.0),
    ("late_45_to_119", 45.0, 120.0),
    ("late_120_plus", 120.0, np.inf),
)
"""(class, from, to): an arrival `from` <= minutes late < `to` is in the band. On time is the
FAA's on-time definition (under 15 minutes late); the other bands split the late ones at
three quarters of an hour and at two hours. Of the 327,346 arrivals of 2013: 75.5%, 12.9%,
8.5% and 3.1%."""


def delay_bands(delay_min: pd.Series) -> pd.Series:
    """The band of each arrival delay in minutes (`BANDS`); missing where the delay is (a
    cancelled or diverted flight)."""
    delay = delay_min.astype("float64").to_numpy()
    bands = pd.Series(pd.NA, index=delay_min.index, dtype="string")
    for name, low, high in BANDS:
        bands[(delay >= low) & (delay < high)] = name
    return bands


def flight_band_outcomes(flights: pd.DataFrame) -> FeatureTable:
    """Per flight: the flights' outcome row (`flight_outcomes`: the entity columns, the delay)
    with its delay band, `delay_band`, the label; null for cancelled and diverted flights."""
    outcomes = flight_outcomes(flights)
    band = delay_bands(outcomes.frame["arr_delay_min"])
    frame = outcomes.frame.drop(columns=["arrival_delayed"]).assign(delay_band=band)
    counts = {
        "flights": len(frame),
        "labelled": int(band.notna().sum()),
        **{name: int((band == name).sum()) for name, _, _ in BANDS},
    }
    return FeatureTable(frame, counts)
