"""Samples of event data made by the tests (seeded): what a person hands `python -m
cli.scaffold`."""

import datetime as dt
import zoneinfo
from pathlib import Path

import numpy as np
import pandas as pd

TIMEZONE = "America/Chicago"
FIRST = dt.date(2024, 3, 1)
DAYS = 24
USERS = 12
EMPTY_DAYS = (5, 13, 17)
"""Days (offsets from FIRST) without a rating: two before the training window, one in it."""


def write_events(path: Path, days: int = DAYS) -> Path:
    """Ratings: 2 to 6 a user and day, the first two often in the same second; `item_id` names
    the item (a user rates an item once); `liked` depends on the row's `price` and `genre` and on
    the user's taste, which only their history shows. No rating on the `EMPTY_DAYS`."""
    rng = np.random.default_rng(34)
    zone = zoneinfo.ZoneInfo(TIMEZONE)
    taste = rng.normal(0, 1.5, USERS)
    unseen = [list(rng.permutation(np.arange(1, 400))) for _ in range(USERS)]
    rows = []
    for offset in range(days):
        if offset in EMPTY_DAYS:
            continue
        day = FIRST + dt.timedelta(days=offset)
        for user in range(USERS):
            hour, minute = int(rng.integers(6, 22)), int(rng.integers(0, 60))
            at = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
            seconds = np.sort(rng.integers(0, 3600, int(rng.integers(2, 7))))
            seconds[1] = seconds[0] if rng.random() < 0.5 else seconds[1]  # the same second
            for second in seconds:
                price = float(rng.gamma(2.0, 5.0))
                genre = str(rng.choice(["drama", "comedy", "horror"]))
                score = 0.15 * (price - 10) + (genre == "comedy") * 1.5 + taste[user]
                rows.append(
                    {
                        "user_id": 7 + user,
                        "item_id": int(unseen[user].pop()),
                        "ts": int(at.timestamp()) + int(second),
                        "price": round(price, 2),
                        "genre": genre,
                        "liked": int(rng.random() < 1 / (1 + np.exp(-score))),
                    }
                )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path
