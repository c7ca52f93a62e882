"""Assets of the lifecycle, one module per stage; thin glue around ml/ and the resources."""

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

EXTERNAL_RETRY = dg.RetryPolicy(
    max_retries=2, delay=5, backoff=dg.Backoff.EXPONENTIAL, jitter=dg.Jitter.PLUS_MINUS
)
"""For steps that talk to another system (the drop folder or object store, the Feast registry and
stores, the MLflow server): a dropped connection or a busy database usually passes within
seconds, so two more tries, 5 s and then ~10 s later. Bad data is never retried: those steps
raise `dg.Failure(allow_retries=False)`, which a retry policy does not repeat."""


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
