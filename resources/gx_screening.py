"""The pass/fail screening pass: every rule's verdict at the least cost, before the rules that
failed are run again with full detail.

The suite is cut into three parts (`_Screening`), each run on the narrowest frame that decides
its rules (`screen`): the rules that judge each value alone on each column's distinct values
(`distinct_values`), the key's rules on the key's columns, the conditioned rules on the columns
they name. Several days of a table are screened together on their union (`joint_days`, `shifted`).
GX and pandas are imported inside functions only.
"""

import datetime as dt
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from declare.contracts import TableContract
from resources.gx_suites import (
    CONDITION_KEY,
    ROW_COUNT,
    RULE_KEY,
    UNIQUE_KEY,
    contract_expectations,
)

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class _Screening:
    """A contract's suite cut into the three parts the pass/fail pass runs, each on the frame
    that decides its rules at the least cost.

    GX filters the whole batch for every column rule (the rows where the column has a value,
    or where a row condition holds), so a rule run on a 19-column frame copies 19 columns.
    - `per_value`: rules that judge each value alone (type, not-null, range, set, pattern, the
      event time's window) and the column set. A value breaks such a rule wherever it is, so
      they pass on a table exactly when they pass on its distinct values (`distinct_values`).
    - `keyed`: the row count and the key's uniqueness, on the key's columns, every row.
    - `conditioned`: rules with a row condition, on the columns they name, every row.
    """

    per_value: Any
    keyed: Any
    conditioned: Any
    condition_columns: tuple[str, ...]


@functools.cache
def _screening(contract: TableContract) -> _Screening:
    import great_expectations as gx

    groups: dict[str, list[Any]] = {"per_value": [], "keyed": [], "conditioned": []}
    condition_columns: dict[str, None] = {}
    for expectation in contract_expectations(contract):
        rule = expectation.meta[RULE_KEY]
        if rule in (ROW_COUNT, UNIQUE_KEY):
            groups["keyed"].append(expectation)
        elif CONDITION_KEY in expectation.meta:
            groups["conditioned"].append(expectation)
            condition_columns.update(
                dict.fromkeys((expectation.column, expectation.meta[CONDITION_KEY]))
            )
        else:
            groups["per_value"].append(expectation)
    return _Screening(
        **{
            name: gx.ExpectationSuite(name=f"{contract.table}_{name}", expectations=expectations)
            for name, expectations in groups.items()
        },
        condition_columns=tuple(condition_columns),
    )


def screen(
    definition: Any,
    contract: TableContract,
    frame: "pd.DataFrame",
    parameters: dict[str, Any],
    per_value: "pd.DataFrame | None" = None,
) -> list[Any]:
    """Every rule's pass/fail (GX's BOOLEAN_ONLY results), each part of the suite (`_Screening`)
    run on its own frame: the per-value rules on the distinct values of `per_value` (`frame`
    unless given: several days' rows with their event times shifted into one window), the
    others on `frame`'s rows. `frame`'s column names are unique."""
    screening = _screening(contract)
    present = set(frame.columns)

    def narrow(columns: Sequence[str]) -> "pd.DataFrame":
        # A missing column stays missing: its rules fail as they would on the whole frame.
        return frame[[c for c in columns if c in present]]

    patterns = frozenset(rule.column for rule in contract.columns if rule.pattern)
    results = []
    for suite, data in (
        (
            screening.per_value,
            distinct_values(frame if per_value is None else per_value, patterns),
        ),
        (screening.keyed, narrow(contract.natural_key)),
        (screening.conditioned, narrow(screening.condition_columns)),
    ):
        if suite.expectations:
            batch = definition.data.get_batch({"dataframe": data})
            validated = batch.validate(
                suite, result_format="BOOLEAN_ONLY", expectation_parameters=parameters
            )
            results += validated.results
    return results


def distinct_values(frame: "pd.DataFrame", pattern_columns: frozenset[str]) -> "pd.DataFrame":
    """A frame with `frame`'s columns and dtypes in which each column holds exactly the distinct
    values of that column, repeated in turn up to the longest column's count: every rule that
    judges a value alone passes on it exactly when it passes on `frame`.

    Distinct by equality, except where equal values can be judged apart: in a column of mixed
    Python objects (1, 1.0 and True are equal but not of one type), and in a pattern's column
    unless it holds text alone (GX matches `str(value)`: 0.0 and -0.0 are equal, their text is
    not). There each distinct (type, text) pair is kept."""
    import numpy as np
    import pandas as pd

    if frame.empty:
        return frame
    distinct = {}
    for name in frame.columns:
        values = frame[name]
        judged_as_text = values.dtype == object or name in pattern_columns
        if not judged_as_text or pd.api.types.infer_dtype(values) in ("string", "empty"):
            distinct[name] = pd.unique(values)
        else:
            kinds = values.map(type, na_action="ignore").astype(str)
            first = ~pd.DataFrame({"kind": kinds, "text": values.astype(str)}).duplicated()
            distinct[name] = values.array[first.to_numpy()]
    longest = max(len(values) for values in distinct.values())
    return pd.DataFrame(
        {name: values.take(np.arange(longest) % len(values)) for name, values in distinct.items()}
    )


@dataclass(frozen=True)
class DayFrame:
    """One partition's rows and its [start, end) window (UTC-aware), for
    `GreatExpectations.screen_days`."""

    partition: str
    frame: "pd.DataFrame"
    window: tuple[dt.datetime, dt.datetime]


def joint_days(contract: TableContract, days: Sequence[DayFrame]) -> list[DayFrame]:
    """The days that can be screened together, with each rule's verdict on their union true of
    each day: the largest group of days with the same columns and dtypes (so the union keeps
    every value's type) and window length (so one shifted window judges every day), each day
    holding at least the contract's rows (a count the union cannot judge per day), with unique
    column names and a UTC-aware event time to shift."""
    import pandas as pd

    def fits(day: DayFrame) -> bool:
        frame = day.frame
        times = frame.get(contract.event_time)
        return (
            len(frame) >= max(contract.min_rows, 1)
            and not frame.columns.has_duplicates
            and isinstance(times, pd.Series)
            and isinstance(times.dtype, pd.DatetimeTZDtype)
        )

    candidates = [day for day in days if fits(day)]
    groups: dict[tuple[Any, ...], list[DayFrame]] = {}
    for day in candidates:
        schema = tuple(zip(day.frame.columns, day.frame.dtypes, strict=True))
        groups.setdefault((schema, day.window[1] - day.window[0]), []).append(day)
    return max(groups.values(), key=len, default=[])


def shifted(
    contract: TableContract, days: Sequence[DayFrame], union: "pd.DataFrame"
) -> "pd.DataFrame":
    """`union` with each day's event times moved back by its day's distance from the first
    day's start: a time is inside its own day's window exactly when the shifted time is inside
    the first day's (the days are of one length, and the shift is exact in nanoseconds)."""
    import numpy as np
    import pandas as pd

    first = days[0].window[0]
    offsets = np.repeat(
        np.array([day.window[0] - first for day in days], dtype="timedelta64[ns]"),
        [len(day.frame) for day in days],
    )
    times = union[contract.event_time]
    return union.assign(**{contract.event_time: times - pd.to_timedelta(offsets)})
