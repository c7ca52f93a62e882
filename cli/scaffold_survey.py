"""What a sample of a new use case's event table says: its columns' kinds and roles, the
table's grain and event key, its days; every refusal names what it refuses (`ScaffoldError`).
`survey` reads it into a `Layout`, which names everything laid out from it."""

import datetime as dt
import importlib.util
import keyword
import re
import zoneinfo
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import pandas as pd

from declare import TrainingWindow
from resources.timestamps import UTC_OFFSET

REPO_ROOT = Path(__file__).resolve().parents[1]
"""The project folder (the default `--root`)."""
MISSING = ("", "NA")
"""How the sample and the drops spell a missing value (as the generated contract declares)."""
EPOCH_MS_FROM = 1e11
"""An epoch number above this is in milliseconds: 1e11 seconds is the year 5138."""
IDENTIFIER_SHARE = 0.5
"""A text or integer column with more distinct values than this share of its rows reads like an
identifier."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_DATE_LIKE = re.compile(r"^\d{4}-\d{2}-\d{2}")
_PLAIN = re.compile(r"^[^\"\\\x00-\x1f]+$")
_ID_NAME = re.compile(r"(?i:(?:^|_)(?:id|key))$|[a-z0-9](?:Id|ID|Key)$")
"""A name that says its column identifies something: `id`, `item_id`, `ITEM_KEY`, `itemId`."""

Kind = Literal["number", "text", "timestamp"]
Role = Literal["entity", "timestamp", "label", "number", "category", "skipped"]

SCAFFOLDED_TASKS = ("binary", "regression")
"""The tasks the scaffold lays out a use case for: its history features average a numeric
label. A multiclass use case is declared by hand (docs/usecases.md, "Tasks")."""


class ScaffoldError(ValueError):
    """The arguments or the sample cannot make a use case; the message names what and why."""


@dataclass(frozen=True)
class Options:
    """The command line."""

    name: str
    data: Path
    entity: str
    timestamp: str
    label: str
    task: str
    timezone: str = "UTC"
    table: str | None = None
    """The event table's name; None: the file's stem if it is a table name, else `events`."""
    root: Path = REPO_ROOT
    """The project folder that holds `usecases/` and `feature_repo/`."""
    drops: Path | None = None
    """The drop folder the declaration reads; None: `usecases/NAME/drops`."""
    write_drops: bool = False
    event_key: tuple[str, ...] = ()
    """The columns that tell one event from another; empty: inferred when events repeat."""
    as_features: tuple[str, ...] = ()
    """Identifier-like number columns that are features all the same (quantities)."""

    @property
    def package(self) -> Path:
        return self.root / "usecases" / self.name

    @property
    def drop_folder(self) -> Path:
        return (self.drops or self.package / "drops").absolute()


@dataclass(frozen=True)
class Column:
    """One column of the sample, as the use case will treat it."""

    name: str
    kind: Kind
    role: Role
    required: bool
    observed: str
    """What the sample shows, for a comment beside the column's rule."""
    feature: str = ""
    """The feature's name (snake_case) of a number or category column."""
    note: str = ""
    """A TODO about the column, beside its feature."""


@dataclass(frozen=True, eq=False)
class Layout:
    """What the sample says, and the name of everything laid out from it."""

    options: Options
    table: str
    columns: tuple[Column, ...]
    sample: pd.DataFrame = field(repr=False)
    times: pd.Series = field(repr=False)
    """Each row's event time, UTC."""
    timestamp_form: str
    """How the sample writes its event times (epoch seconds, ISO-8601 with offsets, ...)."""
    entities: int
    repeated: int
    """Rows whose (entity, local day) an earlier row already has: a row is then an event."""
    event_columns: tuple[str, ...] = ()
    """The raw columns of the event key (grain `event`); empty: a row is an entity's day."""
    event_key_reason: str = ""
    """Why those columns: given, or what the sample shows of them."""

    @property
    def grain(self) -> str:
        return "event" if self.event_columns else "entity_day"

    @property
    def empty_days(self) -> list[dt.date]:
        """The local days from the first to the last without a row in the sample."""
        seen = set(self.days)
        span = (self.last - self.first).days + 1
        every = (self.first + dt.timedelta(days=offset) for offset in range(span))
        return [day for day in every if day not in seen]

    @property
    def name(self) -> str:
        return self.options.name

    @property
    def days(self) -> pd.Series:
        """Each row's local calendar day."""
        return self.times.dt.tz_convert(self.options.timezone).dt.date

    @property
    def first(self) -> dt.date:
        return min(self.days)

    @property
    def last(self) -> dt.date:
        return max(self.days)

    @property
    def row(self) -> str:
        """What one row is called: the table's name in the singular (`events` → `event`)."""
        table = self.table
        return table[:-1] if table.endswith("s") and not table.endswith("ss") else table

    @property
    def features_table(self) -> str:
        return f"{self.row}_features"

    @property
    def outcomes_table(self) -> str:
        return f"{self.row}_outcomes"

    @property
    def key(self) -> str:
        """The entity's join key in the feature tables."""
        return snake_case(self.options.entity)

    @property
    def entity_name(self) -> str:
        """The Feast entity's name: the key without an `_id` (`customer_id` → `customer`)."""
        name = self.key.removesuffix("_id")
        return "entity" if name in ("", "id") else name

    @property
    def history_table(self) -> str:
        return f"{self.entity_name}_history"

    @property
    def event_key(self) -> str:
        """The event key's join key (grain `event`): its column's name, or `<row>_key`."""
        if len(self.event_columns) == 1:
            return snake_case(self.event_columns[0])
        return f"{self.row}_key"

    @property
    def event_entity(self) -> str:
        """The Feast entity of an event: the row's name, unless the entity has it already."""
        return self.row if self.row != self.entity_name else f"{self.row}_event"

    @property
    def label_feature(self) -> str:
        return snake_case(self.options.label)

    @property
    def contract(self) -> str:
        """The name of the contract's constant in `contracts.py`."""
        return self.table.upper()

    def role(self, role: Role) -> list[Column]:
        return [c for c in self.columns if c.role == role]

    def window(self) -> tuple[int, dict[str, str]]:
        """The training window's days, and its default: the last third of the sample's days,
        split by `TrainingWindow`'s shares."""
        days = max(3, round(((self.last - self.first).days + 1) / 3))
        window = TrainingWindow(days=days)
        return days, window.config(self.last - dt.timedelta(days=days - 1), self.last)


def snake_case(name: str) -> str:
    """A column's name as a Python and Feast name: `Order Total` → `order_total`."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name.strip())
    text = re.sub(r"[^0-9a-zA-Z]+", "_", words).strip("_").lower()
    return f"c_{text}" if not text or text[0].isdigit() else text


def survey(options: Options) -> Layout:
    """The sample read and checked against the options: every refusal names what it refuses."""
    _check_options(options)
    sample = _read(options.data)
    given = {"--entity": options.entity, "--timestamp": options.timestamp, "--label": options.label}
    for flag, column in given.items():
        if column not in sample.columns:
            raise ScaffoldError(
                f"{flag} {column!r}: {options.data.name} has no such column;"
                f" its columns are {list(sample.columns)}"
            )
    if len(set(given.values())) < len(given):
        raise ScaffoldError(f"--entity, --timestamp and --label must be three columns: {given}")
    for flag, named in (("--event-key", options.event_key), ("--as-feature", options.as_features)):
        for column in named:
            if column not in sample.columns:
                raise ScaffoldError(
                    f"{flag} {column!r}: {options.data.name} has no such column;"
                    f" its columns are {list(sample.columns)}"
                )
    if options.label in options.event_key:
        raise ScaffoldError(f"--event-key: the label {options.label!r} cannot tell events apart")
    for column in sample.columns:
        if not _PLAIN.match(str(column)):
            raise ScaffoldError(f"column {column!r}: a name without quotes, backslashes or breaks")
    if sample.empty:
        raise ScaffoldError(f"{options.data}: no rows to learn the columns from")
    times, form = _event_times(sample[options.timestamp], options)
    _check_label(sample[options.label], options)
    days = times.dt.tz_convert(options.timezone).dt.date
    if (max(days) - min(days)).days + 1 < 3:
        raise ScaffoldError(
            f"{options.data.name}: its days {min(days)}..{max(days)} are fewer than the 3 a"
            " training window needs (train, validation, test)"
        )
    keys = pd.DataFrame({"entity": sample[options.entity], "day": days})
    repeated = int(keys.duplicated().sum())
    columns = tuple(_column(sample[c], options) for c in sample.columns)
    event_columns, reason = _event_key(sample, columns, options, repeated)
    layout = Layout(
        options=options,
        table=options.table or _table_name(options.data),
        columns=columns,
        sample=sample,
        times=times,
        timestamp_form=form,
        entities=int(sample[options.entity].nunique()),
        repeated=repeated,
        event_columns=event_columns,
        event_key_reason=reason,
    )
    _check_names(layout)
    return layout


def _check_options(options: Options) -> None:
    name = options.name
    if not _NAME.match(name) or keyword.iskeyword(name):
        raise ScaffoldError(
            f"NAME {name!r}: must be lower_snake_case (a-z, 0-9, _; a letter first)"
        )
    # Feast imports a repository's module by its name, feature_repo/NAME/NAME.py as `NAME`: an
    # installed module of that name would be imported in its place.
    if importlib.util.find_spec(name) is not None:
        raise ScaffoldError(f"NAME {name!r}: Python has a module of that name already")
    if options.task not in SCAFFOLDED_TASKS:
        raise ScaffoldError(f"--task {options.task!r}: one of {', '.join(SCAFFOLDED_TASKS)}")
    try:
        zoneinfo.ZoneInfo(options.timezone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ScaffoldError(f"--timezone {options.timezone!r}: no IANA time zone") from None
    if options.table is not None and not _NAME.match(options.table):
        raise ScaffoldError(f"--table {options.table!r}: must be lower_snake_case")
    if options.package.exists():
        raise ScaffoldError(f"use case {name!r} exists already: {options.package}")
    feast_repo = options.root / "feature_repo" / name
    if feast_repo.exists():
        raise ScaffoldError(f"use case {name!r}: its Feast repository exists already: {feast_repo}")


def _read(path: Path) -> pd.DataFrame:
    try:
        return pd.read_csv(path, keep_default_na=False, na_values=list(MISSING), low_memory=False)
    except (OSError, ValueError) as error:
        raise ScaffoldError(f"--data {path}: cannot be read as CSV: {error}") from None


def _table_name(data: Path) -> str:
    stem = snake_case(data.stem)
    return stem if _NAME.match(stem) and not stem.startswith("c_") else "events"


def _event_times(values: pd.Series, options: Options) -> tuple[pd.Series, str]:
    """The event times as UTC instants, and how the sample writes them."""
    column = f"--timestamp {options.timestamp!r}"
    if values.isna().any():
        raise ScaffoldError(f"{column}: {int(values.isna().sum())} row(s) have no event time")
    if pd.api.types.is_numeric_dtype(values):
        unit = "ms" if values.abs().max() > EPOCH_MS_FROM else "s"
        form = {"s": "epoch seconds", "ms": "epoch milliseconds"}[unit]
        return pd.to_datetime(values, unit=unit, utc=True), form
    text = values.astype(str)
    with_offset = text.str.contains(UTC_OFFSET, regex=True)
    if with_offset.any() and not with_offset.all():
        raise ScaffoldError(f"{column}: some times have an offset and some not; write all with one")
    try:
        parsed = pd.to_datetime(text, format="ISO8601", utc=bool(with_offset.all()))
    except ValueError as error:
        raise ScaffoldError(
            f"{column}: neither epoch numbers nor ISO-8601 times ({text.iloc[0]!r}): {error}"
        ) from None
    if with_offset.all():
        return parsed, "ISO-8601 with offsets"
    utc = parsed.dt.tz_localize(options.timezone, ambiguous="NaT", nonexistent="NaT")
    if utc.isna().any():
        raise ScaffoldError(
            f"{column}: {int(utc.isna().sum())} local time(s) do not exist or repeat in"
            f" {options.timezone} (a clock change); write them with an offset"
        )
    return utc.dt.tz_convert("UTC"), f"ISO-8601 local times in {options.timezone}"


def _check_label(values: pd.Series, options: Options) -> None:
    column = f"--label {options.label!r}"
    known = values.dropna()
    if known.empty:
        raise ScaffoldError(f"{column}: no row has a label")
    if not pd.api.types.is_numeric_dtype(values) or pd.api.types.is_bool_dtype(values):
        raise ScaffoldError(
            f"{column}: a {options.task} label is a number; the sample has {sorted(set(known))[:5]}"
        )
    values_seen = set(known.unique().tolist())
    if options.task == "binary" and not values_seen <= {0, 1}:
        others = sorted(values_seen - {0, 1})
        raise ScaffoldError(f"{column}: a binary label is 0 or 1; the sample also has {others[:5]}")


def _column(values: pd.Series, options: Options) -> Column:
    name = str(values.name)
    required = not values.isna().any()
    known = values.dropna()
    if pd.api.types.is_bool_dtype(values):
        raise ScaffoldError(f"column {name!r}: true/false values; write them as 1/0")
    numeric = pd.api.types.is_numeric_dtype(values)
    if name == options.entity:
        kind: Kind = "number" if numeric else "text"
        return Column(name, kind, "entity", True, f"the entity: {known.nunique():,} distinct")
    if name == options.timestamp:
        return Column(name, "timestamp", "timestamp", True, "the event time")
    if name == options.label:
        return Column(name, "number", "label", required, f"the label: {_range(values)}")
    if numeric:
        identifier = identifier_like(values)
        if identifier and name not in options.as_features:
            note = f"an identifier ({identifier}), no feature: `--as-feature {name}` if a quantity"
            return Column(name, "number", "skipped", required, _range(values), note=note)
        return Column(name, "number", "number", required, _range(values), snake_case(name))
    text = known.astype(str)
    if len(text) and text.str.match(_DATE_LIKE).all():
        kind = "timestamp" if text.str.contains(UTC_OFFSET, regex=True).all() else "text"
        note = "a date or time, no feature as it is: derive some (an age, a day of the week)"
        return Column(name, kind, "skipped", required, _first_last(text), note=note)
    distinct = text.nunique()
    note = ""
    if distinct > IDENTIFIER_SHARE * max(len(text), 1) and distinct > 1:
        note = f"{distinct:,} distinct values in {len(text):,} rows: an identifier, not a category?"
    observed = f"{distinct:,} distinct: {', '.join(sorted(text.unique())[:5])}"
    if distinct > 5:
        observed += ", ..."
    return Column(name, "text", "category", required, observed, snake_case(name), note)


def identifier_like(values: pd.Series) -> str:
    """Why a number column reads like an identifier (empty: it does not): an integer column
    whose name says so, or with nearly as many distinct values as rows."""
    known = values.dropna()
    if known.empty or not (known == known.round()).all():
        return ""
    name = str(values.name)
    if _ID_NAME.search(name):
        return f"integers named {name!r}"
    distinct = known.nunique()
    if distinct > 1 and distinct > IDENTIFIER_SHARE * len(known):
        return f"{distinct:,} distinct integers in {len(known):,} rows"
    return ""


def _event_key(
    sample: pd.DataFrame, columns: Sequence[Column], options: Options, repeated: int
) -> tuple[tuple[str, ...], str]:
    """The raw columns that tell one event from another, and why they do; none when no entity
    has two rows on a day and none were given (a row is then an entity's day)."""
    if options.event_key:
        key = options.event_key
        if key == (options.entity,):
            raise ScaffoldError(
                f"--event-key {options.entity}: the entity (--entity) has many events; declare"
                " the columns that tell its events apart"
            )
        if (missing := int(sample[list(key)].isna().any(axis=1).sum())) > 0:
            raise ScaffoldError(
                f"--event-key {','.join(key)}: {missing:,} row(s) have no key; an event key is"
                " never missing"
            )
        if (twice := int(sample.duplicated(list(key)).sum())) > 0:
            raise ScaffoldError(
                f"--event-key {','.join(key)}: {twice:,} row(s) repeat a key of an earlier row;"
                " declare the columns that tell every event apart"
            )
        return key, "given with --event-key"
    if not repeated:
        return (), ""
    entity, rows = options.entity, len(sample)

    def unique(key: tuple[str, ...]) -> bool:
        return not sample[list(key)].isna().any().any() and not sample.duplicated(list(key)).any()

    others = [c.name for c in columns if c.role in ("skipped", "category", "number")]
    singles = [c for c in others if not pd.api.types.is_float_dtype(sample[c])]
    for column in singles:
        if unique((column,)):
            return (column,), f"`{column}` is unique in the sample's {rows:,} rows"
    identifiers = [c.name for c in columns if c.role == "skipped" and c.kind == "number"]
    categories = [c.name for c in columns if c.role == "category"]
    for column in [*identifiers, *categories]:
        if unique((entity, column)):
            return (entity, column), (
                f"`{entity}` and `{column}` are unique together in the sample's {rows:,} rows"
            )
    if unique((entity, options.timestamp)):
        return (entity, options.timestamp), (
            f"no two of the sample's {rows:,} rows share `{entity}` and `{options.timestamp}`"
        )
    raise ScaffoldError(
        f"{repeated:,} row(s) repeat an entity's day, so a row is an event, and no column (nor"
        f" `{entity}` with another, nor with `{options.timestamp}`) tells the events apart;"
        " declare the columns that do: --event-key COL[,COL]"
    )


def _range(values: pd.Series) -> str:
    known = values.dropna()
    missing = len(values) - len(known)
    shown = f"{known.min():.6g} to {known.max():.6g}" if len(known) else "no value"
    return shown + (f", {missing:,} of {len(values):,} missing" if missing else "")


def _first_last(text: pd.Series) -> str:
    return f"{min(text)} to {max(text)}"


def _check_names(layout: Layout) -> None:
    tables = [layout.table, layout.features_table, layout.outcomes_table, layout.history_table]
    if len(set(tables)) < len(tables):
        raise ScaffoldError(f"the table names repeat: {tables}; name the table with --table")
    features = [c for c in layout.columns if c.role in ("number", "category")]
    if not features:
        raise ScaffoldError(
            f"{layout.options.data.name}: no column besides the entity, the event time and the"
            " label to learn from"
        )
    seen: dict[str, str] = {layout.key: layout.options.entity, "event_timestamp": "(Feast)"}
    if layout.grain == "event":
        if layout.event_key in seen:
            raise ScaffoldError(
                f"the event key's name {layout.event_key!r} is taken by"
                f" {seen[layout.event_key]!r}; name the table with --table"
            )
        seen[layout.event_key] = ",".join(layout.event_columns)
    for column in features:
        if column.feature in seen:
            raise ScaffoldError(
                f"columns {seen[column.feature]!r} and {column.name!r} both make the name"
                f" {column.feature!r}; rename one in the sample"
            )
        seen[column.feature] = column.name
