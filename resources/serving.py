"""Serving: the registered models this machine runs, as verified local copies with an
onnxruntime session over each.

A model file is fetched from the registry into a local cache and used only after its sha256
matches the one recorded at registration (`MlflowRegistry.fetch`); the session is built by
`ml.predict.Scorer`, which checks the hash again on the bytes it loads.
"""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

from ml.served import DATA_THROUGH_TAG, LINES_FILE, METRICS_FILE, MODEL_FILE, REFERENCE_FILE
from resources.registry import CHAMPION, MlflowRegistry, ModelVersion, RegistryError

if TYPE_CHECKING:
    from ml.drift import NaturalLines
    from ml.predict import Scorer


@dataclass(frozen=True)
class ServedModel:
    version: ModelVersion
    scorer: "Scorer"

    @property
    def label(self) -> str:
        return f"{self.version.name} v{self.version.version}"


class ModelServing(dg.ConfigurableResource):
    """Registered models, loaded for scoring."""

    registry: MlflowRegistry
    cache_dir: str = Field(description="Folder of verified local copies of registered models.")
    threads: int | None = Field(
        default=None, description="onnxruntime intra-op threads; unset: onnxruntime's default."
    )

    def champion(self, model_name: str) -> ServedModel | None:
        """The version the `champion` alias points at, ready to score; None before the first
        promotion."""
        version = self.registry.champion(model_name)
        return None if version is None else self.load(version)

    def load(self, version: ModelVersion) -> ServedModel:
        from ml.predict import Scorer

        path = self.registry.fetch(version, MODEL_FILE, Path(self.cache_dir))
        scorer = Scorer.load(path, expected_sha256=version.sha256, threads=self.threads)
        return ServedModel(version, scorer)

    def drift_reference(self, version: ModelVersion) -> Path:
        """The verified local copy of the version's drift reference (`ml.drift`)."""
        if REFERENCE_FILE not in version.files:
            raise RegistryError(
                f"{version.name} v{version.version} was registered without {REFERENCE_FILE}"
                " (before drift monitoring existed); retrain to get a reference"
            )
        return self.registry.fetch(version, REFERENCE_FILE, Path(self.cache_dir))

    def test_metrics(self, version: ModelVersion) -> dict[str, float]:
        """The version's overall metrics on its own test split, as its gate judged them (the
        registered `metrics.json`)."""
        import json

        if METRICS_FILE not in version.files:
            raise RegistryError(
                f"{version.name} v{version.version} was registered without {METRICS_FILE}"
            )
        path = self.registry.fetch(version, METRICS_FILE, Path(self.cache_dir))
        return dict(json.loads(path.read_text())["overall"])

    def drift_lines(self, version: ModelVersion) -> "NaturalLines | None":
        """The version's drift lines measured on its training period; None for a version
        registered without them (before they existed, or a training period too short)."""
        import json

        from ml.drift import NaturalLines

        if LINES_FILE not in version.files:
            return None
        path = self.registry.fetch(version, LINES_FILE, Path(self.cache_dir))
        return NaturalLines.from_dict(json.loads(path.read_text()))


__all__ = [
    "CHAMPION",
    "DATA_THROUGH_TAG",
    "LINES_FILE",
    "METRICS_FILE",
    "MODEL_FILE",
    "REFERENCE_FILE",
    "ModelServing",
    "ServedModel",
]
