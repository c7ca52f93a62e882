"""Assets of the lifecycle, one module per stage; thin glue around ml/ and the resources.

Every process that loads the definitions (the code server, the daemon, a run's worker, `make run`)
imports this package right after dagster, and keeps what `import dagster` made for its whole
life: those objects are moved out of the cyclic garbage collector's reach here (`gc.freeze`), so
that the collections that building the definitions (and later every run) triggers do not walk
them again. A full collection over them is ~50 ms, a fifth of what loading the definitions takes
after `import dagster` (docs/benchmarks.md, P1).
"""

import contextlib
import functools
import gc
import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import dagster as dg

from ml.results import CheckOutcome, FilePath, Link, Markdown, Refused, Unrounded, image

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


class ResultType(dg.DagsterType):
    """The Dagster type of an `ml/` result that crosses stages, named by its dotted path: its
    module (which may import numpy or pandas) is imported only when a step checks or loads a
    value, never when the definitions load. The `documents` IO manager loads a stored result
    back through `load_document`."""

    def __init__(self, path: str) -> None:
        module, name = path.rsplit(".", 1)
        self.result_path = path
        super().__init__(
            type_check_fn=lambda _, value: isinstance(value, self.python_type()),
            name=name,
            description=f"`{path}`, stored as a JSON document.",
        )
        self._module, self._name = module, name

    def python_type(self) -> type:
        return getattr(importlib.import_module(self._module), self._name)

    def load_document(self, document: Mapping[str, Any]) -> Any:
        kind = self.python_type()
        if hasattr(kind, "from_document"):
            return kind.from_document(document)
        from resources.documents import from_document

        return from_document(kind, document)


@functools.cache
def result_type(path: str) -> ResultType:
    """The one `ResultType` of the result class at `path` (Dagster refuses two types of a name)."""
    return ResultType(path)


def dagster_metadata(values: Mapping[str, Any]) -> dict[str, Any]:
    """The metadata an `ml/` result describes itself with (`result.metadata()`), as Dagster shows
    it: `ml.results.Markdown` as Markdown, `Link` as a URL, `FilePath` as a path, mappings and
    lists as JSON, floats rounded (`figure`) unless `Unrounded`; text and whole numbers as they
    are."""
    shown: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Markdown):
            shown[key] = dg.MetadataValue.md(str(value))
        elif isinstance(value, Link):
            shown[key] = dg.MetadataValue.url(str(value))
        elif isinstance(value, FilePath):
            shown[key] = dg.MetadataValue.path(str(value))
        elif isinstance(value, Mapping | list | tuple):
            shown[key] = dg.MetadataValue.json(value)
        elif isinstance(value, Unrounded):
            shown[key] = float(value)
        elif isinstance(value, float):
            shown[key] = figure(value)
        else:
            shown[key] = value
    return shown


@contextlib.contextmanager
def refusing(step: str) -> Iterator[None]:
    """An `ml/` service's refusal of its input (`ml.results.Refused`) as the step's failure,
    never retried; any other error is left to the step's retry policy."""
    try:
        yield
    except Refused as refused:
        raise dg.Failure(f"{step}: {refused}", allow_retries=False) from None


SEVERITY = {"error": dg.AssetCheckSeverity.ERROR, "warn": dg.AssetCheckSeverity.WARN}


def check_result(outcome: CheckOutcome) -> dg.AssetCheckResult:
    """A stage's check outcome (`ml.results.CheckOutcome`) as Dagster's check result."""
    return dg.AssetCheckResult(
        check_name=outcome.name,
        passed=outcome.passed,
        severity=SEVERITY[outcome.severity],
        description=outcome.description,
        metadata=dagster_metadata(outcome.metadata),
    )


def markdown_image(title: str, png: bytes) -> dg.MetadataValue:
    """A PNG shown in an asset's metadata."""
    return dg.MetadataValue.md(image(title, png))


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
