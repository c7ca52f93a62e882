"""Feature tables, generically: what a use case's Dagster-free feature functions return, and
how a table is built a chunk of input at a time.

Every feature table has an `event_timestamp` column (UTC): the instant from which its row may be
used. A point-in-time join gives an event the latest row at or before the event's own instant, so
a row must not describe anything that was unknown at its `event_timestamp`.

A day may arrive in chunks (the lake hands a large day over a row group at a time), so builders
take a day's rows as chunks and hold no more than they must: a row-wise table runs on each chunk
(`per_chunk`); other tables yield a chunk of output per chunk of input (`TableStream`).

This module never imports Dagster or Feast.
"""

from collections import Counter
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

import pandas as pd

EVENT_TIMESTAMP = "event_timestamp"


@dataclass(frozen=True)
class FeatureTable:
    """A feature table and the counts a person should see beside it."""

    frame: pd.DataFrame
    counts: dict[str, int]


TableStream = Generator[pd.DataFrame, None, dict[str, int]]
"""A feature table built a chunk of input at a time: it yields the table's chunks (each sorted
within itself) and returns the table's counts once the last is out."""


def per_chunk(
    build: Callable[[pd.DataFrame], FeatureTable], chunks: Iterable[pd.DataFrame]
) -> TableStream:
    """A row-wise table built on each chunk in turn; the counts of the chunks add up to the
    day's."""
    counts: Counter[str] = Counter()
    for chunk in chunks:
        table = build(chunk)
        counts.update(table.counts)
        yield table.frame
    return dict(counts)


def whole(stream: TableStream) -> FeatureTable:
    """A streamed table gathered into one frame (for tables that fit in memory, and tests)."""
    frames = []
    while True:
        try:
            frames.append(next(stream))
        except StopIteration as done:
            return FeatureTable(pd.concat(frames, ignore_index=True), done.value)
