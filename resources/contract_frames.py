"""Frames typed as a table contract declares: a drop of a header alone, whose columns have no
type to tell (`typed_empty`), and the rows that passed validation cast to the types published
days store (`as_stored`; `StorageError` when a value does not fit). pandas is imported inside
functions only: the code location must load without it.
"""

from typing import TYPE_CHECKING

from declare.contracts import ColumnRule, TableContract
from resources.validation_report import SAMPLE_SIZE

if TYPE_CHECKING:
    import pandas as pd


class StorageError(ValueError):
    """A published column's values that its declared type cannot hold; `rule` names the rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"rule {rule} failed: {message}")
        self.rule = rule


def _storage(rule: ColumnRule, values: "pd.Series") -> str:
    """The dtype a published day stores the column `rule` declares as (see `stored_as`)."""
    import pandas as pd

    if rule.kind == "text":
        return "object"
    if rule.kind == "timestamp":
        return "datetime64[ns, UTC]"
    if rule.stored_as is not None:
        return rule.stored_as
    whole = pd.api.types.is_integer_dtype(values) and not values.hasnans
    return "int64" if whole else "float64"


def typed_empty(contract: TableContract, frame: "pd.DataFrame") -> "pd.DataFrame":
    """A table of no rows (a drop of a header alone, whose columns have no type to tell) with
    each declared column typed as the contract says; its columns stay the drop's, for the
    column-set rule to judge."""
    dtypes = {"number": "float64", "text": "object", "timestamp": "datetime64[ns, UTC]"}
    kinds = {rule.column: dtypes[rule.kind] for rule in contract.columns}
    return frame.astype({c: kinds[c] for c in frame.columns if c in kinds})


def as_stored(contract: TableContract, frame: "pd.DataFrame") -> "pd.DataFrame":
    """`frame` (rows that passed the contract) with each declared column cast to the type
    published days store it as (`ColumnRule.stored_as`); raises StorageError for values
    that type cannot hold."""
    import pandas as pd

    cast = {}
    for rule in contract.columns:
        values = frame.get(rule.column)
        if values is None:
            continue
        stored = _storage(rule, values)
        if str(values.dtype) == stored:
            continue
        if stored == "int64":
            numbers = pd.to_numeric(values)
            lost = numbers.isna() | (numbers != numbers.round())
            if lost.any():
                raise StorageError(
                    f"{rule.column}.stored_as_int64",
                    f"{lost.sum()} of {len(frame)} rows hold a missing value or a fraction,"
                    f" which the column's declared type int64 cannot store; e.g."
                    f" {', '.join(repr(v) for v in values[lost].head(SAMPLE_SIZE))}",
                )
        try:
            cast[rule.column] = values.astype(pd.api.types.pandas_dtype(stored))
        except (ValueError, TypeError) as exc:
            raise StorageError(
                f"{rule.column}.stored_as_{stored}",
                f"the column of type {values.dtype} cannot be stored as {stored}: {exc}",
            ) from exc
    return frame.assign(**cast) if cast else frame
