"""A use case's references out of its declaration, checked when the code location loads:

- into its Feast repository: the feature service; the label view, its column, its event
  timestamp, its table and the join keys its rows must carry; the slice, drift calendar and
  baseline columns (`<view>__<feature>` of the feature service);
- into its source's schema: the tables it declares, its contracts' columns and the dimension
  columns they take reference sets from (`allowed_from`).

A wrong name stops the load with a `DeclarationError` naming the use case, the field and the
nearest valid names, so no stage ever meets it (nor skips it). The Feast names come from the
repository's `feast_names.json` (`declare.feast_names`): Feast itself is not imported; the schema
from the source (`resources.sources.RawSource.table_columns`), which reads no row to give it.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath

from declare.feast_names import NAMES_FILE, REFRESH, FeastNames
from declare.usecase import DeclarationError, EventTable, UseCase, unknown_name


def check_repository(case: UseCase, repo: Path) -> None:
    """Check `case`'s references against the names file of its Feast repository `repo`."""
    try:
        names = FeastNames.read(repo)
    except FileNotFoundError:
        raise DeclarationError(
            f"use case {case.name!r}: its Feast repository {repo} has no {NAMES_FILE};"
            f" write it with `{REFRESH} {repo}`"
        ) from None
    check_references(case, names)


def check_references(case: UseCase, names: FeastNames) -> None:
    """Refuse the first of `case`'s references that `names` do not declare."""
    service = case.feature_service
    if service not in names.feature_services:
        raise unknown_name(
            case.name, "feature_service", service, names.feature_services, "Feast feature service"
        )
    _check_label(case, names)
    columns = names.columns(service)
    what = f"column of feature service {service!r} (`<view>__<feature>`)"
    for piece in case.slices:
        if piece.column not in columns:
            field = f"slices[{piece.name}].column"
            raise unknown_name(case.name, field, piece.column, columns, what)
    for column in case.drift.calendar:
        if column not in columns:
            raise unknown_name(case.name, "drift.calendar", column, columns, what)
    if case.baseline is not None and case.baseline not in columns:
        raise unknown_name(case.name, "baseline", case.baseline, columns, what)


def _check_label(case: UseCase, names: FeastNames) -> None:
    label, service = case.label, case.feature_service
    if label.view not in names.feature_views:
        raise unknown_name(case.name, "label.view", label.view, names.feature_views, "feature view")
    view = names.feature_views[label.view]
    if label.column not in view.features:
        what = f"feature of label view {label.view!r}"
        raise unknown_name(case.name, "label.column", label.column, view.features, what)
    source = names.sources[view.source]
    if label.event_timestamp != source.timestamp_field:
        what = f"timestamp field of label view {label.view!r} (of its source {view.source!r})"
        known = [source.timestamp_field]
        raise unknown_name(case.name, "label.event_timestamp", label.event_timestamp, known, what)
    table = PurePosixPath(source.path).name
    if label.table != table:
        what = f"table behind label view {label.view!r} (its source reads {source.path!r})"
        raise unknown_name(case.name, "label.table", label.table, [table], what)
    if any(p.view == label.view for p in names.feature_services[service]):
        raise DeclarationError(
            f"use case {case.name!r}: label.view: {label.view!r} is read by feature service"
            f" {service!r}: a label is never a model input"
        )
    carried = {*names.join_keys(label.view), *view.features}
    missing = [key for key in names.service_join_keys(service) if key not in carried]
    if missing:
        raise DeclarationError(
            f"use case {case.name!r}: label.view: {label.view!r} lacks the join key(s) {missing}"
            f" of feature service {service!r}: its rows are the entity rows of a training set and"
            " must carry every key the service joins on (as its join keys or fields)"
        )


def check_source(case: UseCase, schema: Mapping[str, Sequence[str]] | None) -> None:
    """Check `case`'s tables and contracts against `schema`, its declared source's tables and
    their columns: each event table and dimension is a table of the source, each contract names
    exactly the columns the source delivers in its table (validation refuses a day whose
    columns differ from the contract's), and each reference set is a column of its dimension.

    None, a drop folder's schema, which is known only once its drops arrive: nothing to check
    here, and each drop's columns are checked as it is validated."""
    if schema is None:
        return
    tables = list(schema)
    for field, name in [
        *(("event_tables", table.name) for table in case.event_tables),
        *(("dimensions", dimension.name) for dimension in case.dimensions),
    ]:
        if name not in schema:
            raise unknown_name(case.name, field, name, tables, "table its source delivers")
    for table in case.event_tables:
        _check_contract(case, table, schema)


def _check_contract(case: UseCase, table: EventTable, schema: Mapping[str, Sequence[str]]) -> None:
    field, delivered = f"event_tables[{table.name}].contract", schema[table.name]
    declared = table.contract.column_names
    what = f"column of table {table.name!r} as its source delivers it"
    for column in declared:
        if column not in delivered:
            raise unknown_name(case.name, f"{field}.columns", column, delivered, what)
    undeclared = [column for column in delivered if column not in declared]
    if undeclared:
        raise DeclarationError(
            f"use case {case.name!r}: {field}.columns: its source delivers {undeclared} in table"
            f" {table.name!r}, which the contract does not declare: validation would refuse"
            " every day of it"
        )
    for rule in table.contract.columns:
        if rule.allowed_from is not None:
            dimension = rule.allowed_from.split(".")[0]  # a declared one: UseCase checks it
            known = [f"{dimension}.{column}" for column in schema[dimension]]
            if rule.allowed_from not in known:
                name = f"{field}.columns[{rule.column}].allowed_from"
                what = f"column of dimension {dimension!r} as its source delivers it"
                raise unknown_name(case.name, name, rule.allowed_from, known, what)
