"""Five-field cron strings (minute, hour, day of month, month, day of week), checked without a
scheduler: a schedule a use case declares is refused when it is made, naming the field, rather
than when Dagster builds it.

Each field is `*`, a value, or a range `a-b`, each optionally stepped (`*/15`, `1-5/2`, `5/10`:
from 5 on), in a comma-separated list; months and weekdays may be named (`jan`, `mon-fri`).
Dagster's scheduler (croniter) reads more (`@daily`, `L`, `#`, ranges that wrap around); those
are refused here, so that a declared schedule reads the same to every reader.
"""

import calendar

MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")
FIELDS = (
    ("minute", 0, 59, ()),
    ("hour", 0, 23, ()),
    ("day of month", 1, 31, ()),
    ("month", 1, 12, MONTHS),
    ("day of week", 0, 7, WEEKDAYS),  # 0 and 7 are both Sunday
)
"""Each field's name, least and greatest value, and the names that stand for its values."""


def cron_problem(cron: str) -> str | None:
    """What is wrong with `cron` as a five-field cron string; None when nothing is."""
    parts = cron.split()
    if len(parts) != len(FIELDS):
        return f"{cron!r} is not five fields (minute hour day-of-month month day-of-week)"
    chosen = []
    for part, (what, low, high, names) in zip(parts, FIELDS, strict=True):
        try:
            chosen.append(_values(part, low, high, names))
        except ValueError as error:
            return f"{cron!r}: its {what} {part!r} {error}"
    days, months = chosen[2], chosen[3]
    longest = max(calendar.monthrange(2024, month)[1] for month in months)  # a leap year
    if parts[4] == "*" and min(days) > longest:
        return f"{cron!r}: no month it names has a day {min(days)}"
    return None


def _values(part: str, low: int, high: int, names: tuple[str, ...]) -> set[int]:
    """The values a field names; ValueError says what is wrong with it."""
    values: set[int] = set()
    for item in part.split(","):
        span, slash, step_text = item.partition("/")
        if slash and not (_is_number(step_text) and int(step_text) >= 1):
            raise ValueError(f"steps by {step_text!r}, not a whole number >= 1")
        step = int(step_text) if slash else 1
        if span == "*":
            first, last = low, high
        else:
            first_text, dash, last_text = span.partition("-")
            first = _value(first_text, low, high, names)
            last = _value(last_text, low, high, names) if dash else (high if slash else first)
        if first > last:
            raise ValueError(f"has a range {span!r} that runs backwards")
        values.update(range(first, last + 1, step))
    return values


def _value(text: str, low: int, high: int, names: tuple[str, ...]) -> int:
    if text.lower() in names:
        return names.index(text.lower()) + low
    if not _is_number(text):
        what = f"neither a number nor a name ({', '.join(names)})" if names else "not a number"
        raise ValueError(f"has {text!r}, {what}")
    if not low <= int(text) <= high:
        raise ValueError(f"has {text}, outside {low}..{high}")
    return int(text)


def _is_number(text: str) -> bool:
    return text.isascii() and text.isdigit()
