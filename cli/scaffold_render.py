"""The text of a new use case's files, from the templates in `usecases/scaffold_templates/`
and a `Layout` of its sample: its declaration, contract, feature functions and Feast repository.
The lines that depend on the sample are laid out here as `ruff format` lays them out."""

import datetime as dt
import json
import keyword
import os
import string
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import fields
from pathlib import Path

from cli.scaffold_survey import REPO_ROOT, Column, Layout
from declare.gate import GatePolicy, RegressionGatePolicy

TEMPLATES = REPO_ROOT / "usecases" / "scaffold_templates"
"""The shape of a use case's files, beside the use cases (not code of the lifecycle itself)."""
LINE_LENGTH = 100
"""ruff's line length in this project (pyproject.toml)."""
WINDOWS_DAYS = (7, 28)
"""The entity history's windows (`features.WINDOWS_DAYS` of a generated use case)."""


def render(layout: Layout) -> dict[str, str]:
    """Each file's path (relative to the root) and text, the registry's edit left out."""
    name = layout.name
    return {
        f"usecases/{name}/__init__.py": _template("usecase.py.tmpl", _declaration(layout)),
        f"usecases/{name}/contracts.py": _template("contracts.py.tmpl", _contracts(layout)),
        f"usecases/{name}/features.py": _template("features.py.tmpl", _features(layout)),
        f"feature_repo/{name}/{name}.py": _template("feast.py.tmpl", _feast(layout)),
        f"feature_repo/{name}/feature_store.yaml": _template(
            "feature_store.yaml.tmpl", {"name": name}
        ),
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
    return {
        **_common(layout),
        "title": f"The {layout.name} use case: `{options.label}` ({options.task}) per event.",
        "rows": f"{len(layout.sample):,}",
        "days": f"{(layout.last - layout.first).days + 1:,}",
        "first": layout.first.isoformat(),
        "last": layout.last.isoformat(),
        "entities": f"{layout.entities:,}",
        "drops": _q(Path(drops).as_posix()),
        "history_columns": format_call("HISTORY_COLUMNS = ", history_columns),
        "description": _q(f"{options.label} ({options.task}) of each event of a {options.entity}."),
        "start": layout.first.isoformat(),
        "end": (layout.last + dt.timedelta(days=1)).isoformat(),
        "event_table": format_call("EventTable", event_table, indent=8, tail=","),
        "empty_days_comment": _empty_days_comment(layout),
        "label_line": format_call("label=Label", label, indent=4, tail=","),
        "window_days": str(days),
        **{f"window_{part}": day for part, day in window.items()},
        "slice_example": example,
        "gate_class": policy.__name__,
        "gate_defaults": defaults,
        "baseline": baseline,
    }


def _empty_days_comment(layout: Layout) -> str:
    """What the declaration says of an empty day, by whether the sample has one."""
    if layout.empty_days:
        return _fit(
            "        # The sample has days without a row: `min_rows=0` (contracts.py) publishes"
            " an empty drop as a day without events; a day without a drop still fails its run."
        )
    return _fit(
        "        # TODO: what an empty day means. With `min_rows=1` (contracts.py) a day"
        " without events is refused, and a day without a drop fails its run: right where"
        " every day has events; otherwise lower `min_rows` and say what an entity's missing"
        " day means for its history."
    )


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
        rule = format_call("ColumnRule", arguments, indent=8, tail=",")
        lines += [_fit(f"        {comment}"), rule]
    options = layout.options
    if layout.grain == "event":
        key = [
            f"    # One row per event (a `{options.entity}` may have many a day), told apart by"
            f" {quoted_names(layout.event_columns)}: {layout.event_key_reason}.",
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


def quoted_names(columns: Sequence[str]) -> str:
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
        "history_def": format_call(
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
    taken = {layout.features_table, layout.outcomes_table, layout.history_table, layout.name}
    entity_var = _variable(layout.entity_name, taken, "_entity")
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
        format_call(f"{table}_source = _lake_table", [_q(table), _q(description)])
        for table, description in descriptions.items()
    ]
    types = {"Int64", "Float64"} | ({"String"} if layout.role("category") else set())
    if layout.grain == "event":
        types.add("String")
        event_var = _variable(layout.event_entity, taken | {entity_var}, "_event")
        rows = _event_keyed(layout, event_var)
    else:
        rows = _entity_keyed(entity_var)
    return {
        **_common(layout),
        **rows,
        "entity_var": entity_var,
        "entity_name": layout.entity_name,
        "types": ", ".join(sorted(types)),
        "sources": "\n".join(sources),
        "feature_fields": "\n".join(feature_fields),
        "history_fields": "\n".join(history_fields),
        "label_field": f"Field(name={_q(label)}, dtype={number})",
    }


def _variable(name: str, taken: set[str], suffix: str) -> str:
    """`name` as a variable of the Feast module: with `suffix` where it would be a keyword,
    another of its variables (`taken`) or a name it imports."""
    if keyword.iskeyword(name) or name in taken or name in _FEAST_NAMES:
        return f"{name}{suffix}"
    return name


def _event_keyed(layout: Layout, event_var: str) -> dict[str, str]:
    """The Feast module's lines where a row is an event (grain `event`): an entity of its own
    (`event_var`) keys the per-event views and the label view."""
    description = _q(f"One event: {quoted_names(layout.event_columns)}.")
    return {
        "entity_comment": "# The entity: the history is keyed by it; the label view has it.",
        "event_entity": (
            "# An event: the per-event views and the label view are keyed by it.\n"
            f"{event_var} = Entity(\n"
            f"    name={_q(layout.event_entity)},\n"
            f"    join_keys=[{_q(layout.event_key)}],\n"
            "    value_type=ValueType.STRING,\n" + _fit(f"    description={description},") + "\n)\n"
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


def _entity_keyed(entity_var: str) -> dict[str, str]:
    """The Feast module's lines where a row is an entity's day: the entity keys every view."""
    return {
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


_FEAST_NAMES = {"timedelta", "Entity", "FeatureService", "FeatureView", "Field", "FileSource"}
_FEAST_NAMES |= {"ValueType", "Float64", "Int64", "String", "EVENT_ROW_TTL", "DAY_ROW_TTL"}


def _field(name: str, dtype: str) -> str:
    return f"        Field(name={_q(name)}, dtype={dtype}),"


def _q(text: str) -> str:
    """A Python string literal of `text`, in the double quotes ruff writes."""
    return json.dumps(text, ensure_ascii=False)


def format_call(head: str, arguments: Sequence[str], indent: int = 0, tail: str = "") -> str:
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
