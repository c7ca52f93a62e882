"""Timestamps as a drop holds them: ISO-8601 text with or without offsets, or seconds since the
Unix epoch, parsed the way validation must see them. A drop read in chunks is parsed only as one
read of the whole column would be (`combined_form`). pandas is imported where it is used."""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import pandas as pd

UTC_OFFSET = r"(?:Z|[+-]\d{2}:?\d{2})$"
"""How an ISO-8601 timestamp that names its offset ends."""
TimestampForm = Literal["aware", "naive", "epoch", "text"]
"""What a timestamp column of a drop holds: ISO-8601 text with offsets (parsed to UTC-aware
values), without any (parsed, left naive for validation to refuse), numbers (seconds since the Unix
epoch, which is UTC: parsed to UTC-aware values), or anything else (text)."""


def parse_timestamps(frame: "pd.DataFrame", columns: Sequence[str]) -> "pd.DataFrame":
    """Parse ISO-8601 text columns and epoch-second number columns, keeping what validation must
    see.

    Values with an offset become UTC-aware; a column with no offsets stays naive; a column that
    mixes both, or holds text that is not a timestamp, stays as text. Numbers are seconds since
    the Unix epoch and become UTC-aware (a number that is no such instant falls outside the
    partition's day, and validation says so). Columns that are already datetimes (Parquet drops)
    are left alone, and so are columns that are absent.
    """
    parsed = {}
    for column in columns:
        if column in frame.columns:
            _, values = parsed_form(frame[column])
            if values is not None:
                parsed[column] = values
    return frame.assign(**parsed) if parsed else frame


def timestamp_form(values: "pd.Series") -> TimestampForm | None:
    """What a timestamp column holds (see `TimestampForm`); None when there is nothing to parse:
    the column is already a datetime, is not text, or has no values."""
    return parsed_form(values)[0]


def parsed_form(values: "pd.Series") -> "tuple[TimestampForm | None, pd.Series | None]":
    """A timestamp column's form, and its values parsed when the form is aware or naive."""
    import pandas as pd

    if pd.api.types.is_datetime64_any_dtype(values):
        return None, None
    if pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values):
        return ("epoch", _from_epoch(values)) if values.notna().any() else (None, None)
    if not pd.api.types.is_object_dtype(values) and not pd.api.types.is_string_dtype(values):
        return None, None
    text = values.dropna().astype(str)
    if text.empty:
        return None, None
    with_offset = text.str.contains(UTC_OFFSET, regex=True)
    if with_offset.any() and not with_offset.all():
        return "text", None  # some values aware, some naive: leave it to validation to refuse
    aware = bool(with_offset.any())
    try:
        parsed = pd.to_datetime(values, format="ISO8601", utc=aware)
    except (ValueError, TypeError):
        return "text", None
    return ("aware" if aware else "naive"), parsed


def combined_form(forms: set[TimestampForm | None]) -> TimestampForm | None:
    """The form of a column whose chunks have `forms`: parsed only if every chunk with values
    parses the same way, as one read of the whole column would."""
    found = forms - {None}
    if not found:
        return None
    return found.pop() if len(found) == 1 else "text"


def apply_timestamp_forms(
    frame: "pd.DataFrame", forms: Mapping[str, TimestampForm]
) -> "pd.DataFrame":
    """`frame` with each column of `forms` parsed as its form says (text stays text)."""
    import pandas as pd

    parsed = {}
    for column, form in forms.items():
        if form == "text" or column not in frame.columns:
            continue
        if pd.api.types.is_datetime64_any_dtype(frame[column]):
            continue
        values = frame[column]
        if form == "epoch":
            parsed[column] = _from_epoch(values)
        else:
            parsed[column] = pd.to_datetime(values, format="ISO8601", utc=form == "aware")
    return frame.assign(**parsed) if parsed else frame


def _from_epoch(values: "pd.Series") -> "pd.Series":
    """Seconds since the Unix epoch as UTC-aware instants (fractions of a second kept)."""
    import pandas as pd

    return pd.to_datetime(pd.to_numeric(values, errors="coerce"), unit="s", utc=True)
