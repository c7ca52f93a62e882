"""A table contract as a Great Expectations suite: one expectation per rule, each tagged with
our rule name and its level (table or row), and what changes per partition (the day's window,
the reference sets) left as suite parameters, so that one suite per contract serves every
partition. A suite is built for the engine its frames live in (`Engine`): the same rules, with
column types and regular expressions in that engine's terms. Reading GX's outcomes back into rule
results is resources/validation_report.py's; running the suite, resources/expectations.py's on
pandas frames and resources/gx_spark.py's on Spark DataFrames. GX is imported inside functions
only.
"""

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

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
Engine = Literal["pandas", "spark"]
"""Where the frames a suite validates live: pandas frames or Spark DataFrames."""
_DATA_SOURCES: dict[Engine, str] = {"pandas": "frames", "spark": "spark_frames"}

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
# Spark checks a column's type in its schema: NumericType holds every integer, float and decimal.
_SPARK_TYPE_LISTS: dict[str, list[str]] = {"number": ["NumericType"], "text": ["StringType"]}


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


def contract_expectations(contract: TableContract, engine: Engine = "pandas") -> list[Any]:
    """The GX expectations of a contract, each tagged with our rule name and level.

    What changes per partition (the day's window, the reference sets) is a suite parameter, so
    one suite per contract serves every partition. `engine` says whose type names and regular
    expressions the suite speaks: pandas dtypes and Python's `re`, or Spark's types and Java's
    regular expressions (which Spark's `rlike` runs).
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
                        column=c,
                        type_list=(_SPARK_TYPE_LISTS if engine == "spark" else _TYPE_LISTS)[
                            rule.kind
                        ],
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
                    gxe.ExpectColumnValuesToMatchRegex(
                        column=c, regex=_whole(rule.pattern, engine)
                    ),
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


def _whole(pattern: str, engine: Engine) -> str:
    """`pattern` matched against the whole value. GX searches for a match anywhere, and `$` also
    matches before a trailing newline; `\\A…\\Z` admit neither in Python. Java's `\\Z` is
    Python's `$` (it admits a trailing newline): its end of input is `\\z`."""
    return rf"\A(?:{pattern})\z" if engine == "spark" else rf"\A(?:{pattern})\Z"


def _parameter(reference: str) -> str:
    """GX suite parameters must be identifiers: `stores.code` → `stores__code`."""
    return reference.replace(".", "__")


def validation_definition(
    data_docs_dir: str, contract: TableContract, engine: Engine = "pandas"
) -> Any:
    """The suite and validation definition of a contract for `engine`'s frames, registered once
    per process."""
    return _validation_definition(data_docs_dir, contract, engine)


@functools.cache
def _validation_definition(data_docs_dir: str, contract: TableContract, engine: Engine) -> Any:
    import great_expectations as gx

    context = gx_context(data_docs_dir)
    # The expectations first: one that cannot be built leaves nothing half-registered.
    expectations = contract_expectations(contract, engine)
    name = contract.table if engine == "pandas" else f"{contract.table}__{engine}"
    source = _DATA_SOURCES[engine]
    if source not in context.data_sources.all():
        # Spark's is added on first use: adding it looks for a session, and a context that only
        # validates pandas frames must not start one. Our caller persists the frame itself.
        context.data_sources.add_spark(source, persist=False)
    batch = (
        context.data_sources.get(source)
        .add_dataframe_asset(contract.table)
        .add_batch_definition_whole_dataframe("partition")
    )
    suite = context.suites.add(gx.ExpectationSuite(name=name, expectations=expectations))
    return context.validation_definitions.add(
        gx.ValidationDefinition(name=name, data=batch, suite=suite)
    )
