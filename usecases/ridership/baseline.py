"""The bar a ridership model has to clear: the seasonal-naive forecast, which predicts a station's
day with the same station's count on the same weekday a week earlier, and its errors."""

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ml.features import EVENT_TIMESTAMP
from usecases.ridership.days import local_days

SEASON_DAYS = 7
"""Ridership follows the week: a Monday looks like the Monday before."""


@dataclass(frozen=True)
class RegressionErrors:
    """How far predictions are from the counts, over the rows where both are known."""

    rows: int
    rmse: float
    """Root mean squared error, in thousands of riders."""
    mae: float
    """Mean absolute error, in thousands of riders."""
    r2: float
    """1 - squared error / squared deviation of the counts from their mean; NaN when the counts
    are all equal."""


def seasonal_naive(rows: pd.DataFrame, history: pd.DataFrame) -> pd.Series:
    """For each row (`station`, `event_timestamp`: a day's start): the same station's `rides` in
    `history` (`station_day` rows) on the local day a week before; NaN where that is unknown.
    Indexed like `rows`."""
    known = pd.Series(
        history["rides"].astype("float64").to_numpy(),
        index=pd.MultiIndex.from_arrays(
            [history["station"].astype(str), local_days(history[EVENT_TIMESTAMP])]
        ),
    )
    week_before = local_days(rows[EVENT_TIMESTAMP]) - pd.Timedelta(days=SEASON_DAYS)
    keys = pd.MultiIndex.from_arrays([rows["station"].astype(str), week_before])
    return pd.Series(known.reindex(keys).to_numpy(), index=rows.index, name="seasonal_naive")


def regression_errors(actual: np.ndarray, predicted: np.ndarray) -> RegressionErrors:
    """RMSE, MAE and R² of `predicted` against `actual`, over the pairs where both are finite."""
    actual = np.asarray(actual, dtype="float64")
    predicted = np.asarray(predicted, dtype="float64")
    if actual.shape != predicted.shape:
        raise ValueError(f"{actual.shape} counts for {predicted.shape} predictions")
    both = np.isfinite(actual) & np.isfinite(predicted)
    actual, predicted = actual[both], predicted[both]
    if not len(actual):
        return RegressionErrors(rows=0, rmse=math.nan, mae=math.nan, r2=math.nan)
    errors = predicted - actual
    squared = float(np.square(errors).sum())
    spread = float(np.square(actual - actual.mean()).sum())
    return RegressionErrors(
        rows=len(actual),
        rmse=math.sqrt(squared / len(actual)),
        mae=float(np.abs(errors).mean()),
        r2=1 - squared / spread if spread > 0 else math.nan,
    )


def seasonal_naive_errors(rows: pd.DataFrame, history: pd.DataFrame) -> RegressionErrors:
    """The seasonal-naive forecast's errors on `rows` (`station_day` rows with their `rides`),
    over the rows whose forecast is known."""
    return regression_errors(rows["rides"].to_numpy(), seasonal_naive(rows, history).to_numpy())
