"""A use case's rolling backtest: a catalog entry trained and tested again at each of several
origins (`ml.backtest`), one fold per calendar month.

Fold `M` (a month, named by its first day) tests on the days of `M` a model trained on the
`train_days` days before it, the last `validation_days` of which are its validation part: the
same split as a training set's, moved forward a month at a time. Its folds run from `first` to
the last month the partitions hold whole. The gate's `backtest_folds` (`declare.gate`) judges a
challenger's entry against the champion's on the last folds both ran.
"""

import datetime as dt
from dataclasses import dataclass


class BacktestError(ValueError):
    """A backtest policy that cannot run; the message names the field."""


@dataclass(frozen=True)
class BacktestPolicy:
    """Where a use case's folds start and how much each trains on."""

    first: str = ""
    """The first fold's month, as its first day (YYYY-MM-01); empty: the first month that
    starts `train_days` or more after the partitions' first day. Partitions that do not hold
    that fold whole have no backtest (`UseCase.backtests`); a declared `first` must fit."""
    train_days: int = 28
    """Days a fold trains on (its validation days included), ending the day before its month."""
    validation_days: int = 7
    """The last of those days: the fold's validation part (early stopping, a threshold)."""
    samples: int = 400
    """Bootstrap resamples of each fold's test rows for its metric's interval."""
    level: float = 0.95
    """The interval's coverage."""
    seed: int = 2013
    """The bootstrap's seed: a fold measured twice gives the same interval."""

    def __post_init__(self) -> None:
        if self.first:
            try:
                first = dt.date.fromisoformat(self.first)
            except ValueError:
                raise BacktestError(f"backtest.first={self.first!r}: not YYYY-MM-DD") from None
            if first.day != 1:
                raise BacktestError(f"backtest.first={self.first}: a fold is a month, give its 1st")
        if not 0 < self.validation_days < self.train_days - 1:
            raise BacktestError(
                f"backtest: validation_days={self.validation_days} must be at least 1 and leave"
                f" 2 or more of train_days={self.train_days} to train on"
            )
        if self.samples < 50:
            raise BacktestError(f"backtest.samples={self.samples}: at least 50")
        if not 0.5 <= self.level < 1:
            raise BacktestError(f"backtest.level={self.level}: in [0.5, 1)")

    def first_fold(self, partitions_start: str) -> dt.date:
        """The first fold's month: `first`, or the first month starting `train_days` or more
        after `partitions_start`."""
        if self.first:
            return dt.date.fromisoformat(self.first)
        earliest = dt.date.fromisoformat(partitions_start) + dt.timedelta(days=self.train_days)
        return earliest if earliest.day == 1 else next_month(earliest)

    def fits(self, partitions_start: str, partitions_end: str) -> bool:
        """Whether partitions from `partitions_start` to the day before `partitions_end` hold
        the first fold's days whole: a use case of a few weeks has no fold."""
        fold = self.split(self.first_fold(partitions_start))
        return partitions_start <= fold["start"] and fold["end"] <= partitions_end

    def split(self, fold: dt.date) -> dict[str, str]:
        """Fold `fold`'s `training_set` window (`declare.SPLIT_DAYS`): `train_days` before the
        month, the last `validation_days` of them validation; the month is the test part."""
        if fold.day != 1:
            raise BacktestError(f"fold {fold}: a fold is a month, named by its 1st")
        start = fold - dt.timedelta(days=self.train_days)
        return {
            "start": start.isoformat(),
            "validation_start": (fold - dt.timedelta(days=self.validation_days)).isoformat(),
            "test_start": fold.isoformat(),
            "end": next_month(fold).isoformat(),
        }


def next_month(day: dt.date) -> dt.date:
    """The first day of the month after `day`'s."""
    return (day.replace(day=1) + dt.timedelta(days=32)).replace(day=1)
