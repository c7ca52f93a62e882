"""Assets of the lifecycle, one module per stage; thin glue around ml/ and the resources.

Every process that loads the definitions (the code server, the daemon, a run's worker, `make run`)
imports this package right after dagster, and keeps what `import dagster` made for its whole
life: those objects are moved out of the cyclic garbage collector's reach here (`gc.freeze`), so
that the collections that building the definitions (and later every run) triggers do not walk
them again. A full collection over them is ~50 ms, a fifth of what loading the definitions takes
after `import dagster` (docs/benchmarks.md, P1).
"""

import gc
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg

if TYPE_CHECKING:
    from declare import UseCase

gc.freeze()

EXTERNAL_RETRY = dg.RetryPolicy(
    max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
"""For steps that talk to another system (the drop folder or object store, the Feast registry and
stores, the MLflow server): a dropped connection or a busy database usually passes within
seconds, so two more tries, 5 s and then ~10 s later. Bad data is never retried: those steps
raise `dg.Failure(allow_retries=False)`, which a retry policy does not repeat."""


def asset_key(case: "UseCase", asset: str) -> dg.AssetKey:
    """A use case's asset key: the asset under the use case's name (`<case>/trained_model`)."""
    return dg.AssetKey([case.name, asset])


def daily_partitions(case: "UseCase") -> dg.DailyPartitionsDefinition:
    """A use case's daily partitions (`declare.DailyPartitions`) as Dagster's definition."""
    days = case.partitions
    return dg.DailyPartitionsDefinition(
        start_date=days.start, end_date=days.end, timezone=days.timezone, fmt="%Y-%m-%d"
    )


def with_inputs(fn: Callable[..., Any], inputs: Mapping[str, Any]) -> Callable[..., Any]:
    """`fn`, whose inputs arrive as `**inputs`, with one parameter per input instead, annotated
    with its type: Dagster matches a step's ins to its function's parameters (an asset check
    takes no `**inputs`) and reads an input's type from its annotation, and a factory knows a
    declared table's inputs only when it builds the step."""
    fixed = [p for p in inspect.signature(fn).parameters.values() if p.kind != p.VAR_KEYWORD]
    named = [
        inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=kind)
        for name, kind in inputs.items()
    ]
    fn.__signature__ = inspect.Signature([*fixed, *named])  # type: ignore[attr-defined]
    return fn


def figure(value: object, digits: int = 4) -> float | int | None:
    """A number as a metadata table shows it: a float rounded to `digits` decimals (the files
    and MLflow keep every digit), an int as it is, None for anything else or not finite."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's scalars too
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    return round(float(value), digits) if math.isfinite(value) else None
