"""The cross-run guard of `registered_model` (`ml.deploy.promotion_refusal`, `check_promotion`):
what it reads from the recorded decisions, every reason it refuses a model, whichever run produced
them, and when the champion already is the model."""

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from declare.gate import GatePolicy
from ml.deploy import OnnxModel, RegistrationRefused, check_promotion, promotion_refusal
from ml.evaluate import ModelEvaluation
from ml.gate import decide
from ml.metrics import evaluate
from ml.results import TrainedRun

pytestmark = pytest.mark.unit

WEIGHTS = "a" * 64


def evaluation(probabilities: np.ndarray, champion_version: str | None = None) -> ModelEvaluation:
    rng = np.random.default_rng(0)
    labels = (rng.random(len(probabilities)) < probabilities).astype(int)
    judged = evaluate(labels, probabilities, pd.DataFrame(index=labels), [], 0.5, 200)
    champion = judged if champion_version else None
    report = decide(
        judged, champion, GatePolicy(), champion_version=champion_version, subject=WEIGHTS
    )
    return ModelEvaluation(
        report=report,
        trained=TrainedRun("/nowhere", "", "", ""),
        weights_sha256=WEIGHTS,
        threshold=0.5,
    )


@pytest.fixture
def good() -> ModelEvaluation:
    # Probabilities that are their own outcome rates: calibrated and well separated.
    return evaluation(np.linspace(0.01, 0.99, 2_000))


@pytest.fixture
def onnx_file(tmp_path: Path) -> OnnxModel:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"graph")
    return OnnxModel(
        path=str(path),
        sha256=hashlib.sha256(b"graph").hexdigest(),
        weights_sha256=WEIGHTS,
        parity={"passed": True},
        quantized=False,
    )


def test_a_model_that_passed_every_gate_is_not_refused(good, onnx_file):
    assert good.report.decision == "promote"
    assert promotion_refusal(good, onnx_file, champion_now=None) is None


def test_a_rejected_gate_is_refused_with_its_reasons(onnx_file):
    rejected = evaluation(np.full(2_000, 0.3))  # one score for all: AUC 0.5, under the floor
    refusal = promotion_refusal(rejected, onnx_file, champion_now=None)
    assert refusal is not None and "the gate rejected it" in refusal and "roc_auc" in refusal


def test_a_report_edited_to_promote_without_passing_rules_is_refused(onnx_file):
    document = evaluation(np.full(2_000, 0.3)).to_document()
    document["report"]["decision"] = "promote"  # passed stays false: the two must agree
    with pytest.raises(ValueError, match="contradicts"):
        ModelEvaluation.from_document(document)  # as the registration step loads it


def test_an_onnx_file_of_other_weights_is_refused(good, onnx_file):
    other = OnnxModel(**{**onnx_file.__dict__, "weights_sha256": "b" * 64})
    assert "exported from weights bbbbbbbbbbbb" in str(promotion_refusal(good, other, None))


def test_a_failed_parity_check_is_refused(good, onnx_file):
    failed = OnnxModel(**{**onnx_file.__dict__, "parity": {"passed": False}})
    assert "parity" in str(promotion_refusal(good, failed, None))


def test_an_onnx_file_changed_after_export_is_refused(good, onnx_file):
    Path(onnx_file.path).write_bytes(b"tampered")
    assert "no longer has the sha256" in str(promotion_refusal(good, onnx_file, None))
    Path(onnx_file.path).unlink()
    assert "missing" in str(promotion_refusal(good, onnx_file, None))


def test_a_champion_that_moved_since_the_evaluation_is_refused(onnx_file):
    judged_against_v1 = evaluation(np.linspace(0.01, 0.99, 2_000), champion_version="1")
    assert promotion_refusal(judged_against_v1, onnx_file, champion_now="1") is None
    refusal = promotion_refusal(judged_against_v1, onnx_file, champion_now="2")
    assert refusal is not None and "evaluate again" in refusal


@dataclass(frozen=True)
class Version:
    """A registered version as the registry describes it (`ml.deploy.RegisteredVersion`)."""

    version: str
    tags: dict[str, str]
    name: str = "flight_delay"
    source: str = "file:///mlflow/model"
    files: dict[str, str] = field(default_factory=lambda: {"model.onnx": "cd" * 32})
    link: str = "http://mlflow/models/flight_delay/versions/1"


def test_registration_refuses_what_the_guard_refuses_and_says_it_was_not_promoted(onnx_file):
    rejected = evaluation(np.full(2_000, 0.3))
    with pytest.raises(RegistrationRefused, match=r"^not promoted: the gate rejected it"):
        check_promotion(rejected, onnx_file, champion=None)
    judged_against_v1 = evaluation(np.linspace(0.01, 0.99, 2_000), champion_version="1")
    with pytest.raises(RegistrationRefused, match="evaluate again"):
        check_promotion(judged_against_v1, onnx_file, Version("2", {}))


def test_the_champions_own_weights_register_nothing_and_other_weights_a_new_version(
    onnx_file,
):
    judged_against_v1 = evaluation(np.linspace(0.01, 0.99, 2_000), champion_version="1")
    same = check_promotion(judged_against_v1, onnx_file, Version("1", {"weights_sha256": WEIGHTS}))
    assert same is not None and same.unchanged
    assert (same.version, same.previous_champion, same.sha256) == ("1", "1", "cd" * 32)
    other = Version("1", {"weights_sha256": "b" * 64})
    assert check_promotion(judged_against_v1, onnx_file, other) is None
    first = evaluation(np.linspace(0.01, 0.99, 2_000))  # no champion yet
    assert check_promotion(first, onnx_file, champion=None) is None
