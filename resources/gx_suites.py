"""A table contract as a Great Expectations suite: one expectation per rule, each tagged with
our rule name and its level (table or row), and what changes per partition (the day's window,
the reference sets) left as suite parameters, so that one suite per contract serves every
partition. Reading GX's outcomes back into rule results is resources/validation_report.py's;
running the suite, resources/expectations.py's. GX is imported inside functions only.
"""

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any

from declare.contracts import TableContract
from resources.data_docs import gx_context

RULE_KEY = "ml_lifecycle_rule"
"""The key of an expectation's meta that holds our rule name (its level and column beside it)."""
CONDITION_KEY = "condition_column"
"""The key of an expectation's meta that names the column of its row condition, if it has one."""
COLUMN_SET = "columns.match_contract"
"""The rule that a table's columns are the contract's."""
ROW_COUNT = "rows.at_least_min_rows"
"""The rule that a table holds at least the contract's `min_rows`."""
UNIQUE_KEY = "natural_key.unique"
"""The rule that no two rows share a natural key."""
_WINDOW_START, _WINDOW_END = "partition_start", "partition_end"

# Pandas reads integer columns with a missing value as float, so "number" admits both.
_TYPE_LISTS: dict[str, list[str]] = {
    "number": [
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float32",
        "float64",
        "Int64",
        "Float64",
        "int",
        "float",
    ],
    "text": ["str", "StringDtype"],
}


def suite_parameters(
    contract: TableContract,
    window: tuple[dt.datetime, dt.datetime],
    references: Mapping[str, Sequence[Any]] | None,
) -> dict[str, Any]:
    """The suite's parameters for one window: its bounds and the contract's reference sets
    (every set its `allowed_from` rules name must be given)."""
    references = references or {}
    missing = contract.references - set(references)
    if missing:
        raise ValueError(f"{contract.table}: reference sets {sorted(missing)} were not given")
    parameters: dict[str, Any] = {_WINDOW_START: window[0], _WINDOW_END: window[1]}
    parameters.update({_parameter(name): sorted(set(v)) for name, v in references.items()})
    return parameters


def contract_expectations(contract: TableContract) -> list[Any]:
    """The GX expectations of a contract, each tagged with our rule name and level.

    What changes per partition (the day's window, the reference sets) is a suite parameter, so
    one suite per contract serves every partition.
    """
    import great_expectations.expectations as gxe
    from great_expectations.expectations.row_conditions import Column

    def tag(expectation: Any, rule: str, level: str) -> Any:
        column = getattr(expectation, "column", None)
        expectation.meta = {RULE_KEY: rule, "level": level, "column": column}
        return expectation

    out = [
        tag(
            gxe.ExpectTableColumnsToMatchSet(column_set=contract.column_names, exact_match=True),
            COLUMN_SET,
            "table",
        ),
        tag(
            gxe.ExpectTableRowCountToBeBetween(min_value=contract.min_rows),
            ROW_COUNT,
            "table",
        ),
    ]
    for rule in contract.columns:
        c = rule.column
        if rule.kind == "number" or (
            rule.kind == "text" and not (rule.allowed_from or rule.allowed or rule.pattern)
        ):
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInTypeList(
                        column=c, type_list=_TYPE_LISTS[rule.kind]
                    ),
                    f"{c}.is_{rule.kind}",
                    "table",
                )
            )
        if rule.required:
            out.append(tag(gxe.ExpectColumnValuesToNotBeNull(column=c), f"{c}.not_null", "row"))
        if rule.min_value is not None or rule.max_value is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeBetween(
                        column=c, min_value=rule.min_value, max_value=rule.max_value
                    ),
                    f"{c}.in_range[{rule.min_value},{rule.max_value}]",
                    "row",
                )
            )
        if rule.allowed is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInSet(column=c, value_set=sorted(set(rule.allowed))),
                    f"{c}.in_contract_set",
                    "row",
                )
            )
        if rule.allowed_from is not None:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToBeInSet(
                        column=c, value_set={"$PARAMETER": _parameter(rule.allowed_from)}
                    ),
                    f"{c}.known_in_{rule.allowed_from}",
                    "row",
                )
            )
        for other in rule.required_when_present:
            required = tag(
                gxe.ExpectColumnValuesToNotBeNull(
                    column=c, row_condition=Column(other).is_not_null()
                ),
                f"{c}.required_when_{other}_present",
                "row",
            )
            required.meta[CONDITION_KEY] = other
            out.append(required)
        if rule.pattern:
            out.append(
                tag(
                    gxe.ExpectColumnValuesToMatchRegex(column=c, regex=_whole(rule.pattern)),
                    f"{c}.matches_pattern",
                    "row",
                )
            )
    # GX's compound rule takes two columns at least; a one-column key has a rule of its own.
    (only,) = contract.natural_key if len(contract.natural_key) == 1 else (None,)
    out.append(
        tag(
            gxe.ExpectColumnValuesToBeUnique(column=only)
            if only is not None
            else gxe.ExpectCompoundColumnsToBeUnique(column_list=list(contract.natural_key)),
            UNIQUE_KEY,
            "row",
        )
    )
    # Aware bounds: a timezone-naive column cannot be compared with them and fails the rule.
    out.append(
        tag(
            gxe.ExpectColumnValuesToBeBetween(
                column=contract.event_time,
                min_value={"$PARAMETER": _WINDOW_START},
                max_value={"$PARAMETER": _WINDOW_END},
                strict_max=True,
            ),
            f"{contract.event_time}.utc_aware_within_partition_day",
            "row",
        )
    )
    return out


def _whole(pattern: str) -> str:
    """`pattern` matched against the whole value. GX searches for a match anywhere, and `$` also
    matches before a trailing newline; `\\A…\\Z` admit neither."""
    return rf"\A(?:{pattern})\Z"


def _parameter(reference: str) -> str:
    """GX suite parameters must be identifiers: `stores.code` → `stores__code`."""
    return reference.replace(".", "__")


@functools.cache
def validation_definition(data_docs_dir: str, contract: TableContract) -> Any:
    """The suite and validation definition of a contract, registered once per process."""
    import great_expectations as gx

    context = gx_context(data_docs_dir)
    # The expectations first: one that cannot be built leaves nothing half-registered.
    expectations = contract_expectations(contract)
    batch = (
        context.data_sources.get("frames")
        .add_dataframe_asset(contract.table)
        .add_batch_definition_whole_dataframe("partition")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=contract.table, expectations=expectations))
    return context.validation_definitions.add(
        gx.ValidationDefinition(name=contract.table, data=batch, suite=suite)
    )
