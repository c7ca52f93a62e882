"""Lay out a new use case from a sample of its event table.

    python -m cli.scaffold NAME --data CSV --entity COL --timestamp COL --label COL \\
        --task binary|regression [--event-key COL[,COL]] [--as-feature COL] [--timezone TZ] \\
        [--table TABLE] [--root DIR] [--drops DIR] [--write-drops]

The sample is one CSV with a row per event of an entity, the label in the same row, known at the
end of the event's day. From it the command infers each column's kind and writes the files a use
case is made of (`FILES`): its declaration, contract and feature functions
(`usecases/NAME/`), its Feast module (`feature_repo/NAME.py`), and its line in
`usecases/__init__.py`. What a person must still decide is marked TODO in them. With
`--write-drops` it also cuts the sample into the daily drops the declaration reads.

What it infers, and says so in the files and its summary (each warning ends with what to
declare instead):
- the table's grain (`EventTable.grain`): one row per entity and day when no entity has two
  rows on a day, else one row per event. Events are told apart by an event key (`--event-key`,
  else the first of: a column unique in the sample, the entity and an identifier column unique
  together, the entity and the event time unique together): the per-event feature view and the
  label view are keyed by it, the label view carries the entity's key as a field, and the
  contract's natural key is it;
- `min_rows=0` when the sample has days without a row (an empty drop is then a day without
  events, published empty), else 1;
- an integer column that names something (an `id` in its name, or nearly as many distinct
  values as rows) is no feature unless `--as-feature` says it is a quantity.

The generated files come from `usecases/scaffold_templates/`; the lines that depend on the
sample are laid out here as `ruff format` lays them out.
"""

import argparse
import datetime as dt
import json
import keyword
import os
import re
import string
import sys
import tempfile
import textwrap
import zoneinfo
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Literal

import pandas as pd

from assets.usecase import TASKS, TrainingWindow
from ml.gate import GatePolicy, RegressionGatePolicy
from resources.sources import UTC_OFFSET

REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = REPO_ROOT / "usecases" / "scaffold_templates"
"""The shape of a use case's files, beside the use cases (not code of the lifecycle itself)."""
FILES = (
    "usecases/{name}/__init__.py",
    "usecases/{name}/contracts.py",
    "usecases/{name}/features.py",
    "feature_repo/{name}.py",
    "usecases/__init__.py",
)
"""The files a new use case touches: four new ones and the registry's one line (and import)."""
LINE_LENGTH = 100
"""ruff's line length in this project (pyproject.toml)."""
MISSING = ("", "NA")
"""How the sample and the drops spell a missing value (as the generated contract declares)."""
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""How a drop writes the event time: ISO-8601 in UTC with a `Z`, read by a drop folder as UTC."""
EPOCH_MS_FROM = 1e11
"""An epoch number above this is in milliseconds: 1e11 seconds is the year 5138."""
WINDOWS_DAYS = (7, 28)
"""The entity history's windows (`features.WINDOWS_DAYS` of a generated use case)."""
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
    if options.task not in TASKS:
        raise ScaffoldError(f"--task {options.task!r}: one of {', '.join(TASKS)}")
    try:
        zoneinfo.ZoneInfo(options.timezone)
    except (ValueError, zoneinfo.ZoneInfoNotFoundError):
        raise ScaffoldError(f"--timezone {options.timezone!r}: no IANA time zone") from None
    if options.table is not None and not _NAME.match(options.table):
        raise ScaffoldError(f"--table {options.table!r}: must be lower_snake_case")
    if options.package.exists():
        raise ScaffoldError(f"use case {name!r} exists already: {options.package}")
    feast_module = options.root / "feature_repo" / f"{name}.py"
    if feast_module.exists():
        raise ScaffoldError(f"use case {name!r}: its Feast module exists already: {feast_module}")


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


# Rendering.


def render(layout: Layout) -> dict[str, str]:
    """Each file's path (relative to the root) and text, the registry's edit left out."""
    name = layout.name
    return {
        f"usecases/{name}/__init__.py": _template("usecase.py.tmpl", _declaration(layout)),
        f"usecases/{name}/contracts.py": _template("contracts.py.tmpl", _contracts(layout)),
        f"usecases/{name}/features.py": _template("features.py.tmpl", _features(layout)),
        f"feature_repo/{name}.py": _template("feast.py.tmpl", _feast(layout)),
    }


def _common(layout: Layout) -> dict[str, str]:
    options = layout.options
    return {
        "name": layout.name,
        "source": options.data.name,
        "table": layout.table,
        "entity": options.entity,
        "key": layout.key,
        "timestamp": options.timestamp,
        "label": options.label,
        "label_feature": layout.label_feature,
        "task": options.task,
        "timezone": options.timezone,
        "contract": layout.contract,
        "features_table": layout.features_table,
        "outcomes_table": layout.outcomes_table,
        "history_table": layout.history_table,
    }


def _declaration(layout: Layout) -> dict[str, str]:
    options = layout.options
    days, window = layout.window()
    drops = os.path.relpath(options.drop_folder, options.package.absolute())
    history_columns = [_q(c) for c in (options.entity, options.timestamp, options.label)]
    categories = layout.role("category")
    view = layout.features_table
    example = (
        f'Slice("{categories[0].feature}", "{view}__{categories[0].feature}")'
        if categories
        else 'Slice("<name>", "<view>__<feature>")'
    )
    policy = GatePolicy if options.task == "binary" else RegressionGatePolicy
    defaults = ", ".join(
        f"{f.name}={f.default}" for f in fields(policy) if isinstance(f.default, int | float | None)
    )
    baseline = ""
    if options.task == "regression":
        column = f"{layout.history_table}__{layout.label_feature}_mean_7d"
        baseline = (
            "\n    # TODO: a naive forecast of the label the model must beat, if there is one,"
            f' e.g.\n    # baseline="{column}",'
        )
    label = [f"view={_q(layout.outcomes_table)}", f"column={_q(layout.label_feature)}"]
    label += [f"task={_q(options.task)}", f"table={_q(layout.outcomes_table)}"]
    if layout.grain == "event":
        described = f"The day's events, many a {options.entity}'s, one a row."
    else:
        described = f"The day's events, one per {options.entity} and day."
    event_table = [layout.contract, _q(described), f"grain={_q(layout.grain)}"]
    if layout.empty_days:
        empty = (
            "        # The sample has days without a row: `min_rows=0` (contracts.py) publishes"
            " an empty drop as a day without events; a day without a drop still fails its run."
        )
    else:
        empty = (
            "        # TODO: what an empty day means. With `min_rows=1` (contracts.py) a day"
            " without events is refused, and a day without a drop fails its run: right where"
            " every day has events; otherwise lower `min_rows` and say what an entity's missing"
            " day means for its history."
        )
    return {
        **_common(layout),
        "title": f"The {layout.name} use case: `{options.label}` ({options.task}) per event.",
        "rows": f"{len(layout.sample):,}",
        "days": f"{(layout.last - layout.first).days + 1:,}",
        "first": layout.first.isoformat(),
        "last": layout.last.isoformat(),
        "entities": f"{layout.entities:,}",
        "drops": _q(Path(drops).as_posix()),
        "history_columns": _call("HISTORY_COLUMNS = ", history_columns),
        "description": _q(f"{options.label} ({options.task}) of each event of a {options.entity}."),
        "start": layout.first.isoformat(),
        "end": (layout.last + dt.timedelta(days=1)).isoformat(),
        "event_table": _call("EventTable", event_table, indent=8, tail=","),
        "empty_days_comment": _fit(empty),
        "label_line": _call("label=Label", label, indent=4, tail=","),
        "window_days": str(days),
        **{f"window_{part}": day for part, day in window.items()},
        "slice_example": example,
        "gate_defaults": defaults,
        "baseline": baseline,
    }


def _contracts(layout: Layout) -> dict[str, str]:
    lines = []
    for column in layout.columns:
        arguments = [_q(column.name), _q(column.kind)]
        if column.required:
            arguments.append("required=True")
        if column.role == "label" and layout.options.task == "binary":
            arguments += ["min_value=0", "max_value=1"]
        comment = f"# {column.observed}"
        if column.role == "skipped":
            comment += "; no feature yet (a TODO in features.py)"
        if column.role == "timestamp":
            comment += (
                f" ({layout.timestamp_form} in the sample); a drop writes it as ISO-8601 with an"
                " offset (`--write-drops`: UTC, with a `Z`)"
            )
        lines += [_fit(f"        {comment}"), _call("ColumnRule", arguments, indent=8, tail=",")]
    options = layout.options
    if layout.grain == "event":
        key = [
            f"    # One row per event (a `{options.entity}` may have many a day), told apart by"
            f" {_names(layout.event_columns)}: {layout.event_key_reason}.",
        ]
        row_doc = (
            f"One row per event of a `{options.entity}`, its label `{options.label}` in the same"
            " row."
        )
    else:
        key = [
            f"    # One row per `{options.entity}` and day: no `{options.entity}` has two rows on"
            " a day of the sample. TODO: if a row is an event, declare the columns that tell"
            " events apart here (and scaffold with `--event-key`).",
        ]
        row_doc = f"One row per `{options.entity}` and day, its label `{options.label}` in it."
    columns = layout.event_columns or (options.entity,)
    key.append(f"    natural_key={_tuple(columns)},")
    if empty := layout.empty_days:
        rows = [
            f"    # {len(empty):,} day(s) of the sample have no row (the first {empty[0]}): an"
            " empty drop is a day without events, published empty. TODO: `min_rows=1` if a day"
            " always has events (an empty drop is then refused as an outage).",
            "    min_rows=0,",
        ]
    else:
        rows = [
            "    # Every day of the sample has rows: an empty drop is refused. TODO:"
            " `min_rows=0` if a day may have no events.",
            "    min_rows=1,",
        ]
    return {
        **_common(layout),
        "rows": f"{len(layout.sample):,}",
        "rules": "\n".join(lines),
        "natural_key": "\n".join(_fit(line) for line in key),
        "min_rows": "\n".join(_fit(line) for line in rows),
        "row_doc": row_doc,
    }


def _tuple(texts: Sequence[str]) -> str:
    """A tuple of string literals as ruff writes it: `("a",)`, `("a", "b")`."""
    return f"({_q(texts[0])},)" if len(texts) == 1 else f"({', '.join(map(_q, texts))})"


def _names(columns: Sequence[str]) -> str:
    return " and ".join(f"`{c}`" for c in columns)


def _features(layout: Layout) -> dict[str, str]:
    dtype = "Int64" if layout.options.task == "binary" else "float64"
    entity_key = '            KEY: rows[ENTITY].astype("string"),'
    if layout.grain == "event":
        constants = (
            f"EVENT_COLUMNS = {_tuple(layout.event_columns)}\n"
            + _fit(
                '"""The raw columns that tell one event from another (the contract\'s natural'
                f' key): {layout.event_key_reason}."""'
            )
            + f"\nEVENT_KEY = {_q(layout.event_key)}\n"
            + _fit(
                '"""An event\'s join key in the per-event tables: the text of `EVENT_COLUMNS`,'
                ' joined by `:`."""'
            )
            + "\n"
        )
        row_keys = f"            EVENT_KEY: event_key(rows),\n{entity_key}"
        keyed_by = "keyed by the event (`EVENT_KEY`), with the entity's `KEY` as a field"
        event_key_def = (
            "def event_key(rows: pd.DataFrame) -> pd.Series:\n"
            '    """Each row\'s event key: the text of its `EVENT_COLUMNS`, joined by `:`."""\n'
            '    key = rows[EVENT_COLUMNS[0]].astype("string")\n'
            "    for column in EVENT_COLUMNS[1:]:\n"
            '        key = key + ":" + rows[column].astype("string")\n'
            "    return key\n\n\n"
        )
    else:
        constants, row_keys, event_key_def = "", entity_key, ""
        keyed_by = "keyed by the entity (`KEY`): one row per entity and day"
    return {
        **_common(layout),
        "event_constants": constants,
        "row_keys": row_keys,
        "keyed_by": keyed_by,
        "event_key_def": event_key_def,
        "numbers": _mapping(layout.role("number")),
        "categories": _mapping(layout.role("category")),
        "label_dtype": dtype,
        "history_def": _call(
            f"def {layout.history_table}",
            ["day: dt.date", "previous: Iterable[pd.DataFrame]"],
            tail=" -> FeatureTable:",
        ),
        "skipped": "".join(
            _fit(f"# TODO: `{c.name}` is {c.note}.") + "\n" for c in layout.role("skipped")
        ),
    }


def _mapping(columns: Sequence[Column]) -> str:
    if not columns:
        return "{}"
    lines = ["{"]
    for column in columns:
        if column.note:
            lines.append(_fit(f"    # TODO: {column.note}"))
        lines.append(f"    {_q(column.name)}: {_q(column.feature)},")
    return "\n".join([*lines, "}"])


def _feast(layout: Layout) -> dict[str, str]:
    entity_var = layout.entity_name
    taken = {layout.features_table, layout.outcomes_table, layout.history_table, layout.name}
    if keyword.iskeyword(entity_var) or entity_var in taken or entity_var in _FEAST_NAMES:
        entity_var = f"{entity_var}_entity"
    number, label = "Int64" if layout.options.task == "binary" else "Float64", layout.label_feature
    feature_fields = [
        _field(c.feature, "Float64" if c.role == "number" else "String")
        for c in layout.columns
        if c.role in ("number", "category")
    ]
    history_fields = [
        line
        for days in WINDOWS_DAYS
        for line in (
            _field(f"events_{days}d", "Int64"),
            _field(f"{label}_mean_{days}d", "Float64"),
        )
    ]
    descriptions = {
        layout.features_table: "Per event: the row's own columns.",
        layout.outcomes_table: "Per event: the entity key and the label.",
        layout.history_table: "Per entity and day: its earlier outcomes.",
    }
    sources = [
        _call(f"{table}_source = _lake_table", [_q(table), _q(description)])
        for table, description in descriptions.items()
    ]
    types = {"Int64", "Float64"} | ({"String"} if layout.role("category") else set())
    if layout.grain == "event":
        event_var = layout.event_entity
        taken |= {entity_var}
        if keyword.iskeyword(event_var) or event_var in taken or event_var in _FEAST_NAMES:
            event_var = f"{event_var}_event"
        types.add("String")
        event = {
            "entity_comment": "# The entity: the history is keyed by it; the label view has it.",
            "event_entity": (
                "# An event: the per-event views and the label view are keyed by it.\n"
                f"{event_var} = Entity(\n"
                f"    name={_q(layout.event_entity)},\n"
                f"    join_keys=[{_q(layout.event_key)}],\n"
                "    value_type=ValueType.STRING,\n"
                + _fit(f"    description={_q(f'One event: {_names(layout.event_columns)}.')},")
                + "\n)\n"
            ),
            "event_ttl_comment": (
                "# An event's own row is stamped at the event's instant, as its entity row is,\n"
                "# and keyed by the event: a TTL of a second finds it, never another event's (a\n"
                "# training set refuses entity rows whose key repeats within it).\n"
            ),
            "row_entity": event_var,
            "outcome_key_field": _field(layout.key, "String") + "\n",
            "label_rows_comment": (
                f": they carry the key of every view of the service (`{layout.key}` a field)"
            ),
        }
    else:
        event = {
            "entity_comment": "# The entity: every view is keyed by it.",
            "event_entity": "",
            "event_ttl_comment": (
                "# An event's own row is stamped at the event's instant, as its entity row is: a"
                " TTL of a second\n# finds it, and never an earlier event of the entity (one a"
                " day: they are hours apart).\n"
            ),
            "row_entity": entity_var,
            "outcome_key_field": "",
            "label_rows_comment": "",
        }
    return {
        **_common(layout),
        **event,
        "entity_var": entity_var,
        "entity_name": layout.entity_name,
        "types": ", ".join(sorted(types)),
        "sources": "\n".join(sources),
        "feature_fields": "\n".join(feature_fields),
        "history_fields": "\n".join(history_fields),
        "label_field": f"Field(name={_q(label)}, dtype={number})",
    }


_FEAST_NAMES = {"timedelta", "Entity", "FeatureService", "FeatureView", "Field", "FileSource"}
_FEAST_NAMES |= {"ValueType", "Float64", "Int64", "String", "EVENT_ROW_TTL", "DAY_ROW_TTL"}


def _field(name: str, dtype: str) -> str:
    return f"        Field(name={_q(name)}, dtype={dtype}),"


def _q(text: str) -> str:
    """A Python string literal of `text`, in the double quotes ruff writes."""
    return json.dumps(text, ensure_ascii=False)


def _call(head: str, arguments: Sequence[str], indent: int = 0, tail: str = "") -> str:
    """`head(arguments)tail` as ruff format lays it out: on one line if it fits; else the
    arguments on a line of their own; else one a line, with a trailing comma."""
    pad = " " * indent
    flat = f"{pad}{head}({', '.join(arguments)}){tail}"
    if len(flat) <= LINE_LENGTH:
        return flat
    inner = f"{pad}    {', '.join(arguments)}"
    if len(inner) <= LINE_LENGTH:
        return f"{pad}{head}(\n{inner}\n{pad}){tail}"
    return "\n".join([f"{pad}{head}(", *(f"{pad}    {a}," for a in arguments), f"{pad}){tail}"])


def _template(name: str, values: Mapping[str, str]) -> str:
    return _fit(string.Template((TEMPLATES / name).read_text()).substitute(values))


def _fit(text: str) -> str:
    """`text` with its comments and docstring prose wrapped at the line length; code is laid
    out to fit already."""
    out, in_docstring = [], False
    for line in text.splitlines():
        stripped = line.lstrip()
        indent = line[: len(line) - len(stripped)]
        comment = stripped.startswith("# ")
        prose = in_docstring or stripped.startswith('"""')
        if len(line) > LINE_LENGTH and (comment or prose):
            body = stripped[2:] if comment else stripped
            first = indent + ("# " if comment else "")
            rest = first + ("  " if body.startswith("- ") else "")
            out += textwrap.wrap(
                body,
                LINE_LENGTH,
                initial_indent=first,
                subsequent_indent=rest,
                break_long_words=False,
                break_on_hyphens=False,
            )
        else:
            out.append(line)
        if stripped.count('"""') % 2:
            in_docstring = not in_docstring
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


# Writing.


@dataclass(frozen=True)
class Scaffolded:
    """What the command did."""

    written: list[Path]
    """The files of the use case, in `FILES` order (the registry's last, if it was edited)."""
    registered: bool
    drops: list[Path]


def scaffold(layout: Layout) -> Scaffolded:
    """Write the use case's files, register it, and cut the drops if asked."""
    options = layout.options
    drops_folder = options.drop_folder / layout.table
    if options.write_drops and drops_folder.is_dir() and any(drops_folder.iterdir()):
        raise ScaffoldError(f"--drops: {drops_folder} holds drops already; choose another folder")
    files = render(layout)
    written = []
    for relative, text in files.items():
        path = options.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    registry = options.root / "usecases" / "__init__.py"
    registered = register(registry, layout.name)
    if registered:
        written.append(registry)
    drops = write_drops(layout, options.drop_folder) if options.write_drops else []
    return Scaffolded(written, registered, drops)


def register(registry: Path, name: str) -> bool:
    """Add use case `name` to `USE_CASES` in `registry`: its import among the other use cases'
    (in import order) and its entry last. False, touching nothing, if the file is not there or
    not laid out as `usecases/__init__.py` is."""
    if not registry.is_file():
        return False
    text = registry.read_text()
    imports = list(re.finditer(r"^from usecases\.(\w+) import .*\n", text, re.M))
    cases = re.search(r"^(USE_CASES: tuple\[UseCase, \.\.\.\] = )\((.*?)\)$", text, re.M | re.S)
    if not imports or cases is None:
        return False
    alias = name.upper()
    entries = [e.strip() for e in cases.group(2).split(",") if e.strip()]
    tuple_text = _call(cases.group(1), [*entries, alias])
    text = text[: cases.start()] + tuple_text + text[cases.end() :]
    before = [m for m in imports if m.group(1) < name]
    at = before[-1].end() if before else imports[0].start()
    line = f"from usecases.{name} import USE_CASE as {alias}\n"
    registry.write_text(text[:at] + line + text[at:])
    return True


def write_drops(layout: Layout, folder: Path) -> list[Path]:
    """The sample cut into daily drops, `<folder>/<table>/<YYYY-MM-DD>.csv`, one per local day
    from the first to the last (a day without rows gets the header alone), the event time
    written as ISO-8601 in UTC with a `Z`. Each file is written whole, by a rename."""
    column = layout.options.timestamp
    fraction = (layout.times.dt.microsecond != 0).any()
    form = "%Y-%m-%dT%H:%M:%S.%fZ" if fraction else TIMESTAMP_FORMAT
    frame = layout.sample.assign(**{column: layout.times.dt.strftime(form)})
    days = layout.days
    target = folder / layout.table
    target.mkdir(parents=True, exist_ok=True)
    written = []
    day = layout.first
    while day <= layout.last:
        path = target / f"{day.isoformat()}.csv"
        with tempfile.NamedTemporaryFile("w", dir=target, suffix=".part", delete=False) as out:
            frame[days == day].to_csv(out, index=False)
        os.replace(out.name, path)
        written.append(path)
        day += dt.timedelta(days=1)
    return written


def warnings(layout: Layout) -> list[str]:
    """What the command inferred that a person should know, each ending with what to declare
    if the inference is wrong."""
    options, found = layout.options, []
    contracts = f"usecases/{layout.name}/contracts.py"
    if layout.grain == "event":
        given = options.event_key == layout.event_columns
        found.append(
            (
                f"{layout.repeated:,} row(s) repeat an entity's day: a row is an event"
                if layout.repeated
                else "a row is an event (--event-key)"
            )
            + f' (grain="event"), told apart by {_names(layout.event_columns)}'
            f" ({layout.event_key_reason}): the contract's natural key, the join key"
            f" `{layout.event_key}` of {layout.features_table} and {layout.outcomes_table}."
            + (
                ""
                if given
                else " If they do not tell every event apart, declare the columns that do:"
                " --event-key COL[,COL]."
            )
        )
    if empty := layout.empty_days:
        found.append(
            f"{len(empty):,} day(s) of the sample have no row ({_days(empty)}): an empty drop is"
            f" published as a day without events (min_rows=0 in {contracts}). If a day always"
            " has events, declare min_rows=1 there."
        )
    for column in layout.columns:
        if column.role == "skipped" and column.kind == "number":
            why = identifier_like(layout.sample[column.name])
            found.append(
                f"`{column.name}` reads like an identifier ({why}):"
                f" not made a feature. If it is a quantity, declare it one: --as-feature"
                f" {column.name}."
            )
        elif column.role == "category" and column.note:
            found.append(
                f"`{column.name}` has {column.note.split(':')[0]}: made a category, though it"
                " reads like an identifier. If it names something, declare it no feature: leave"
                " it out of CATEGORIES"
                f" in usecases/{layout.name}/features.py and of feature_repo/{layout.name}.py."
            )
    return found


def _days(days: Sequence[dt.date], shown: int = 3) -> str:
    text = ", ".join(day.isoformat() for day in days[:shown])
    return text + (f" and {len(days) - shown:,} more" if len(days) > shown else "")


def summary(layout: Layout, done: Scaffolded) -> str:
    """What was written, and what to do next."""
    options, name = layout.options, layout.name
    root = options.root

    def shown(path: Path) -> str:
        return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)

    about = {
        f"usecases/{name}/__init__.py": "the declaration",
        f"usecases/{name}/contracts.py": "the raw table's contract",
        f"usecases/{name}/features.py": "the feature functions",
        f"feature_repo/{name}.py": "the Feast declarations",
        "usecases/__init__.py": f"registered: {name.upper()} in USE_CASES",
    }
    lines = [
        f"Use case {name!r} from {options.data.name}: {len(layout.sample):,} rows,"
        f" {layout.entities:,} entities, days {layout.first}..{layout.last} ({options.timezone}),"
        f" event times as {layout.timestamp_form}.",
        f"{len(done.written)} files:",
        *(f"  {shown(p):<40} {about.get(shown(p), '')}" for p in done.written),
    ]
    if not done.registered:
        lines += [
            f"  not registered: add `from usecases.{name} import USE_CASE as {name.upper()}`"
            f" and {name.upper()} to USE_CASES in {shown(root / 'usecases' / '__init__.py')}",
        ]
    lines += [f"Warning: {warning}" for warning in warnings(layout)]
    if done.drops:
        lines.append(
            f"Drops: {len(done.drops)} days of {layout.table} in {shown(options.drop_folder)}."
        )
    else:
        lines.append(
            f"Drops: none written; the declaration reads {shown(options.drop_folder)}"
            " (`--write-drops` cuts the sample into it)."
        )
    lines += [
        "Next:",
        f"  1. decide the TODOs: grep -n TODO {shown(options.package)}/*.py"
        f" {shown(root / 'feature_repo' / f'{name}.py')}",
        f"  2. make run USE_CASE={name}   (ingest, features, train, gate, register, score)",
        "  3. make dev   (the runs, assets and checks in the UI)",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cli.scaffold",
        description="Lay out a new use case from a sample CSV of its event table.",
    )
    parser.add_argument("name", metavar="NAME", help="the use case's name, lower_snake_case")
    parser.add_argument("--data", required=True, type=Path, help="a sample CSV of the events")
    parser.add_argument("--entity", required=True, help="the column of the entity an event is of")
    parser.add_argument("--timestamp", required=True, help="the column of the event's time")
    parser.add_argument("--label", required=True, help="the column of the label")
    parser.add_argument("--task", required=True, choices=TASKS)
    parser.add_argument(
        "--event-key",
        metavar="COL[,COL]",
        help="the columns that tell one event from another (default: inferred when an entity"
        " has several rows a day)",
    )
    parser.add_argument(
        "--as-feature",
        metavar="COL",
        action="append",
        default=[],
        help="a number column that reads like an identifier but is a quantity (repeatable)",
    )
    parser.add_argument("--timezone", default="UTC", help="the days' time zone (default UTC)")
    parser.add_argument("--table", help="the event table's name (default: the file's stem)")
    parser.add_argument("--root", type=Path, default=REPO_ROOT, help="the project folder")
    parser.add_argument("--drops", type=Path, help="the drop folder (default usecases/NAME/drops)")
    parser.add_argument(
        "--write-drops", action="store_true", help="cut the sample into daily drops there"
    )
    args = parser.parse_args(argv)
    options = Options(
        name=args.name,
        data=args.data,
        entity=args.entity,
        timestamp=args.timestamp,
        label=args.label,
        task=args.task,
        timezone=args.timezone,
        table=args.table,
        root=args.root.absolute(),
        drops=args.drops,
        write_drops=args.write_drops,
        event_key=tuple(c.strip() for c in (args.event_key or "").split(",") if c.strip()),
        as_features=tuple(args.as_feature),
    )
    try:
        layout = survey(options)
        done = scaffold(layout)
    except ScaffoldError as error:
        parser.exit(2, f"scaffold: {error}\n")
    print(summary(layout, done))
    return 0


if __name__ == "__main__":
    sys.exit(main())
