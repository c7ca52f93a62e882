"""What the lifecycle's stages hand each other and show, Dagster-free: the typed results that
cross from one stage to the next (stored as JSON documents by the `documents` IO manager), and
the kinds of metadata value a result describes itself with (`metadata()`), which the asset layer
turns into Dagster's (`assets.dagster_metadata`).

A result that crosses stages is a frozen dataclass; one with fields of its own kinds (a gate
report, another result) says how it is stored with `to_document()` and `from_document()`.
"""

import base64
from dataclasses import dataclass, field
from typing import Any, Literal


class Refused(ValueError):
    """A stage refuses its input (a changed training set, NaN scores, ...); the message says
    why. Never retried: the same input is refused again."""


class Markdown(str):
    """A metadata value shown as Markdown: a table, a list, an embedded plot."""


class Link(str):
    """A metadata value that is a URL (an MLflow run, a Data Docs page)."""


class FilePath(str):
    """A metadata value that is a file's path or URL (a gate report, a model file)."""


class Unrounded(float):
    """A metadata number shown with every digit, where rounding to a few decimals would hide it:
    an error of 1e-7, a throughput of 123,456.789 rows/s."""


def image(title: str, png: bytes) -> Markdown:
    """A PNG embedded in Markdown, shown in the asset's metadata."""
    return Markdown(f"![{title}](data:image/png;base64,{base64.b64encode(png).decode()})")


def bullets(lines: list[str]) -> Markdown:
    return Markdown("\n".join(f"- {line}" for line in lines))


@dataclass(frozen=True)
class CheckOutcome:
    """The outcome of one of a stage's checks (an asset check in Dagster)."""

    name: str
    passed: bool
    description: str
    """One line with the numbers."""
    severity: Literal["error", "warn"] = "error"
    """How a failure counts: "error" blocks what follows, "warn" is reported."""
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainedRun:
    """What `trained_model` hands downstream: where the run's files are and what they are."""

    folder: str
    """The run's folder: weights, preprocessor, manifest, checkpoints."""
    data_fingerprint: str
    feature_service: str
    mlflow_run_id: str
