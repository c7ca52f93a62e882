"""The cross-run guard of `registered_model`: what it reads from the recorded decisions, and every
reason it refuses a model, whichever run produced them."""

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from assets.deployment import OnnxModel, promotion_refusal
from declare.gate import GatePolicy
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
