"""A lineage as a document, plain data without Dagster: a registered model version (and
optionally one prediction it made) traced back to raw partitions; its JSON form (`to_dict`,
`from_dict`) and its text view (`render`)."""

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MANIFEST_FILE = "manifest.json"
ONNX_FILE = "model.onnx"
NAMED_ASSETS = ("training_set", "feature_registry")
"""The use case's assets the text view names (by their role in the lifecycle)."""
SHOWN_METADATA = (
    "model",
    "decision",
    "onnx_sha256",
    "sha256",
    "data_fingerprint",
    "mlflow_run_id",
    "window",
    "dataset_fingerprint",
    "feature_service",
    "feature_services",
    "declarations_version",
)
"""Metadata entries the text view prints when a materialization has them (JSON keeps all)."""
_SHORT = 12


class LineageError(RuntimeError):
    """The lineage cannot be traced: an unknown version or prediction, a missing record."""


@dataclass(frozen=True)
class Input:
    """What one materialization read from one parent asset."""

    asset: str
    partitions: list[str] | None
    """The parent's partitions read, in partition order; None for an unpartitioned parent."""
    storage_ids: list[int]
    """The parent materializations found, one per partition (or one)."""
    recorded_data_version: str | None
    """The data version Dagster recorded for this input; None when it recorded none."""
    verified: bool | None
    """Whether the found materializations give the recorded data version; None when Dagster's
    record cannot tell (it kept only the newest partition's version, as for `deps`)."""


@dataclass(frozen=True)
class Materialization:
    """One materialization of one asset (partition), as the event log records it."""

    asset: str
    partition: str | None
    storage_id: int
    run_id: str
    timestamp: str
    code_version: str | None
    data_version: str | None
    metadata: dict[str, Any]
    """Its small scalar metadata (no plots, schemas or JSON documents)."""
    inputs: list[Input] = field(default_factory=list)


@dataclass(frozen=True)
class ModelFacts:
    """The registered version, as the registry describes it."""

    name: str
    version: str
    champion: bool
    aliases: list[str]
    gate_decision: str | None
    weights_sha256: str | None
    onnx_sha256: str | None
    manifest_sha256: str | None
    registered_by_run: str | None
    """The Dagster run whose `registered_model` step registered it."""
    mlflow_training_run: str | None
    created_at: str
    link: str


@dataclass(frozen=True)
class Prediction:
    """One row of `batch_predictions`."""

    day: str
    keys: dict[str, str]
    """The values it was looked up by, by column (its entity keys, as given)."""
    column: str
    """The predicted column: `probability` (binary) or `prediction` (regression)."""
    value: float
    predicted: bool | None
    """Binary: whether the probability clears the model's threshold; None for other tasks."""
    model_name: str
    model_version: str
    predicted_at: str
    file: str
    file_matches_data_version: bool
    """Whether the file read still has the sha256 its materialization recorded."""


@dataclass(frozen=True)
class Lineage:
    """A model version (and optionally a prediction it made) traced back to raw partitions."""

    model: ModelFacts
    manifest: dict[str, Any]
    """The run manifest's facts (MANIFEST_FIELDS), from the copy registered with the version."""
    materializations: list[Materialization]
    """The model's chain, `registered_model` first, then parents before grandparents."""
    prediction: Prediction | None = None
    prediction_materializations: list[Materialization] = field(default_factory=list)
    """The prediction's day: `batch_predictions` and its non-model ancestry."""
    assets: dict[str, str] = field(default_factory=dict)
    """The key (as `Materialization.asset` writes it) of each use case asset the text view names
    (NAMED_ASSETS), by its name in the lifecycle."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, document: Mapping[str, Any]) -> "Lineage":
        def materializations(items: Iterable[Mapping[str, Any]]) -> list[Materialization]:
            return [
                Materialization(
                    **{**m, "inputs": [Input(**i) for i in m.get("inputs", [])]}  # type: ignore[arg-type]
                )
                for m in items
            ]

        prediction = document.get("prediction")
        return cls(
            model=ModelFacts(**document["model"]),
            manifest=dict(document["manifest"]),
            materializations=materializations(document["materializations"]),
            prediction=Prediction(**prediction) if prediction else None,
            prediction_materializations=materializations(
                document.get("prediction_materializations", [])
            ),
            assets=dict(document.get("assets", {})),
        )

    def find(self, asset: str) -> list[Materialization]:
        """Every materialization of `asset` in the chain (the prediction's day included)."""
        return [
            m
            for m in [*self.prediction_materializations, *self.materializations]
            if m.asset == asset
        ]

    def partitions(self, asset: str) -> dict[str, str | None]:
        """Partition → data version of `asset` in the model's chain."""
        return {
            m.partition: m.data_version
            for m in self.materializations
            if m.asset == asset and m.partition is not None
        }

    def render(self) -> str:
        lines: list[str] = []
        if self.prediction is not None:
            lines += _render_prediction(self.prediction)
        lines += _render_model(self.model)
        lines += _render_manifest(self.manifest, self.materializations, self.assets)
        if self.prediction_materializations:
            lines.append(f"the prediction's day ({len(self.prediction_materializations)} records)")
            lines += _render_materializations(self.prediction_materializations)
        lines.append(f"the model's chain in the event log ({len(self.materializations)} records)")
        lines += _render_materializations(self.materializations)
        return "\n".join(lines) + "\n"


def _render_prediction(p: Prediction) -> list[str]:
    state = "file matches its data version" if p.file_matches_data_version else "FILE CHANGED"
    keys = " ".join(f"{k}={v}" for k, v in p.keys.items())
    predicted = (
        "" if p.predicted is None else f" predicted={'positive' if p.predicted else 'negative'}"
    )
    return [
        f"prediction {p.day} {keys}: {p.column}={p.value:.4f}{predicted} at {p.predicted_at}",
        f"  by {p.model_name} v{p.model_version}; {p.file} ({state})",
    ]


def _render_model(m: ModelFacts) -> list[str]:
    role = "champion" if m.champion else f"not champion (aliases: {m.aliases or 'none'})"
    return [
        f"model {m.name} v{m.version} ({role}), gate {m.gate_decision}, registered {m.created_at}",
        f"  weights sha256   {m.weights_sha256}",
        f"  {ONNX_FILE} sha256 {m.onnx_sha256}",
        f"  {MANIFEST_FILE}    {m.manifest_sha256}",
        f"  registered by Dagster run {m.registered_by_run};"
        f" MLflow training run {m.mlflow_training_run}",
        f"  {m.link}",
    ]


def _render_manifest(
    manifest: Mapping[str, Any], chain: Sequence[Materialization], assets: Mapping[str, str]
) -> list[str]:
    libraries = ", ".join(f"{k} {v}" for k, v in sorted(manifest.get("libraries", {}).items()))
    registries = [m for m in chain if m.asset == assets.get("feature_registry")]
    declarations = (
        f" (feature_registry declarations {registries[0].code_version})" if registries else ""
    )
    sets = [m for m in chain if m.asset == assets.get("training_set")]
    fingerprint = manifest.get("data_fingerprint")
    same = ""
    if sets:
        same = (
            " = training_set's data version"
            if sets[0].data_version == fingerprint
            else (f" ≠ training_set's data version {_short(sets[0].data_version)}")
        )
    return [
        f"run manifest (the registered {MANIFEST_FILE}, sha256-verified)",
        f"  git commit       {manifest.get('git_commit')}",
        f"  lock sha256      {manifest.get('lock_sha256')}",
        f"  architecture     {manifest.get('architecture')}",
        f"  config           {_catalog_entry(manifest.get('catalog'))}",
        f"  feature service  {manifest.get('feature_service')}{declarations}",
        f"  seed {manifest.get('seed')}, world size {manifest.get('world_size')},"
        f" devices {manifest.get('devices')}, python {manifest.get('python')},"
        f" image {manifest.get('image_tag')}, host {manifest.get('host')}",
        f"  data fingerprint {fingerprint}{same}",
        f"  trained in Dagster run {manifest.get('dagster_run_id')}",
        f"  libraries        {libraries}",
        f"  environment      {_environment(manifest.get('compatibility'))}",
    ]


def _catalog_entry(entry: Mapping[str, Any] | None) -> str:
    """The catalog entry the model's training started from, and what the run changed."""
    if not entry or not entry.get("name"):
        return "no catalog entry (trained before the catalog, or outside a use case)"
    changed = ", ".join(entry.get("overridden") or []) or "nothing"
    return f"{entry['name']} (settings sha256 {entry['sha256']}), the run changed {changed}"


def _environment(check: Mapping[str, Any] | None) -> str:
    """The training environment against the lock, as the manifest's `ml.compat` check found it."""
    if not check:
        return "not checked (trained before the compatibility check, `ml.compat`)"
    differences = check.get("differences") or []
    if not differences:
        return (
            f"as requirements.lock pins it ({check['num_checked']} distributions),"
            f" python {check['requires_python']}"
        )
    listed = "; ".join(f"{d['name']} {d['installed']} (locked {d['locked']})" for d in differences)
    anyway = ", trained anyway (the check was skipped)" if check.get("skipped") else ""
    return f"differs from requirements.lock in {len(differences)} place(s){anyway}: {listed}"


def _render_materializations(chain: Sequence[Materialization]) -> list[str]:
    lines: list[str] = []
    by_asset: dict[str, list[Materialization]] = {}
    for m in chain:
        by_asset.setdefault(m.asset, []).append(m)
    for asset, records in by_asset.items():
        if len(records) == 1 and records[0].partition is None:
            m = records[0]
            lines.append(f"  {asset}  {_facts(m)}")
            shown = {k: m.metadata[k] for k in SHOWN_METADATA if k in m.metadata}
            if shown:
                lines.append("      " + "  ".join(f"{k}={_short(v)}" for k, v in shown.items()))
            if m.inputs:
                lines.append("      ← " + ", ".join(_render_input(i) for i in m.inputs))
            continue
        plural = "" if len(records) == 1 else "s"
        lines.append(f"  {asset}  ({len(records)} partition{plural})")
        for m in sorted(records, key=lambda r: r.partition or ""):
            inputs = ", ".join(_render_input(i) for i in m.inputs)
            lines.append(f"    {m.partition}  {_facts(m)}" + (f"  ← {inputs}" if inputs else ""))
    return lines


def _facts(m: Materialization) -> str:
    return (
        f"data {_short(m.data_version)}  code {m.code_version}  run {m.run_id[:8]}  {m.timestamp}"
    )


def _render_input(i: Input) -> str:
    mark = {True: " ✓", False: " ≠ recorded", None: ""}[i.verified]
    if i.partitions is None:
        return f"{i.asset}{mark}"
    return f"{i.asset}[{_span(i.partitions)}]{mark}"


def _span(partitions: Sequence[str]) -> str:
    if not partitions:
        return "none materialized"
    if len(partitions) == 1:
        return partitions[0]
    return f"{partitions[0]}..{partitions[-1]} ({len(partitions)})"


def _short(value: Any) -> str:
    text = str(value)
    return text[:_SHORT] if re.fullmatch(r"[0-9a-f]{40,64}", text) else text
