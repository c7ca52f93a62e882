"""Lay out a new use case from a sample of its event table.

    python -m cli.scaffold NAME --data CSV --entity COL --timestamp COL --label COL \\
        --task binary|regression [--event-key COL[,COL]] [--as-feature COL] [--timezone TZ] \\
        [--table TABLE] [--root DIR] [--drops DIR] [--write-drops]

The sample is one CSV with a row per event of an entity, the label in the same row, known at the
end of the event's day. From it the command infers each column's kind and writes the files a use
case is made of (`FILES`): its declaration, contract and feature functions
(`usecases/NAME/`), its Feast repository (`feature_repo/NAME/`: the module of declarations,
feature_store.yaml, and the names file the declaration's references are checked against when
the code loads, written from the module as `python -m cli.feast_names` writes it), and its line
in `usecases/__init__.py`. What a person must still decide is marked TODO in them. With
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
sample are laid out as `ruff format` lays them out (`cli/scaffold_render.py`).
"""

import argparse
import datetime as dt
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cli.scaffold_render import format_call, quoted_names, render
from cli.scaffold_survey import (
    REPO_ROOT,
    SCAFFOLDED_TASKS,
    Layout,
    Options,
    ScaffoldError,
    identifier_like,
    survey,
)
from declare.feast_names import NAMES_FILE
from resources.feast_names import refresh

FILES = (
    "usecases/{name}/__init__.py",
    "usecases/{name}/contracts.py",
    "usecases/{name}/features.py",
    "feature_repo/{name}/{name}.py",
    "feature_repo/{name}/feature_store.yaml",
    "feature_repo/{name}/" + NAMES_FILE,
    "usecases/__init__.py",
)
"""The files a new use case touches: new ones and the registry's one line (and import), last."""
TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
"""How a drop writes the event time: ISO-8601 in UTC with a `Z`, read by a drop folder as UTC."""


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
    feast_repo = options.root / "feature_repo" / layout.name
    refresh(feast_repo)
    written.append(feast_repo / NAMES_FILE)
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
    tuple_text = format_call(cases.group(1), [*entries, alias])
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
            + f' (grain="event"), told apart by {quoted_names(layout.event_columns)}'
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
                f" it out of CATEGORIES in usecases/{layout.name}/features.py and of"
                f" feature_repo/{layout.name}/{layout.name}.py."
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
        f"feature_repo/{name}/{name}.py": "the Feast declarations",
        f"feature_repo/{name}/feature_store.yaml": f"the Feast project {name}'s settings",
        f"feature_repo/{name}/{NAMES_FILE}": "its names, which references are checked against",
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
        f" {shown(root / 'feature_repo' / name / f'{name}.py')}",
        f"  2. python -m cli.feast_names {shown(root / 'feature_repo' / name)}"
        "   (after editing the Feast module)",
        f"  3. make run USE_CASE={name}   (ingest, features, train, gate, register, score)",
        "  4. make dev   (the runs, assets and checks in the UI)",
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
    parser.add_argument("--task", required=True, choices=SCAFFOLDED_TASKS)
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
