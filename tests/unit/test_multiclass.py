"""Multiclass as a task: class names fitted on the train split, labels as class indices,
cross-entropy and softmax in training, and metrics (overall, per class, per slice) that agree
with scikit-learn."""

import datetime as dt
import json
import math
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn import metrics as sk

from ml.data import Preprocessor
from ml.dataset import LabelSpec
from ml.metrics import (
    Evaluation,
    MulticlassMetrics,
    SliceSpec,
    evaluate,
    multiclass_metrics,
    top_class_calibration,
)
from ml.task import MULTICLASS, task_named
from ml.train import LOSSES, scores, validation_metrics

pytestmark = pytest.mark.unit

CLASSES = ["early", "late", "on_time"]


def frame(rows: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "trip__speed": rng.normal(0, 1, rows),
            "route__line": rng.choice(["red", "blue"], rows),
            "band": rng.choice(CLASSES, rows),
        }
    )


def probabilities_for(labels: Any, seed: int = 0) -> np.ndarray:
    """Informative, imperfect probabilities: the label's class gets a head start."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1, (len(labels), len(CLASSES)))
    logits[np.arange(len(labels)), [CLASSES.index(v) for v in labels]] += 1.5
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def test_multiclass_is_a_task_serving_probabilities_and_the_predicted_class():
    assert task_named("multiclass") is MULTICLASS
    assert (MULTICLASS.output, MULTICLASS.predicted) == ("probabilities", "predicted_class")
    assert LabelSpec("outcomes", "band", task="multiclass").dtype == "string"


def test_the_class_names_are_the_train_splits_label_values_sorted_as_strings():
    train = frame().assign(band=np.resize([2, 0, 1, 10], 300))
    fitted = Preprocessor.for_task(MULTICLASS, train, "band")
    assert fitted.classes == ["0", "1", "10", "2"]
    assert (fitted.task, fitted.outputs) == (MULTICLASS, 4)
    labels = fitted.transform(train.head(4), "band").label
    assert labels.dtype == torch.int64
    assert labels.tolist() == [3, 0, 1, 2]


def test_the_class_names_survive_the_json_and_an_old_json_still_loads():
    fitted = Preprocessor.for_task(MULTICLASS, frame(), "band")
    again = Preprocessor.from_json(fitted.to_json())
    assert again == fitted and again.task == MULTICLASS
    old = json.loads(fitted.to_json())
    del old["classes"]
    binary = Preprocessor.from_json(json.dumps(old))
    assert binary.classes is None and binary.outputs == 1 and binary.task.name == "binary"


def test_a_class_the_train_split_lacks_is_refused_naming_it_and_the_count():
    fitted = Preprocessor.for_task(MULTICLASS, frame(), "band")
    validation = frame(20, seed=1)
    validation.loc[[3, 7], "band"] = "cancelled"
    with pytest.raises(ValueError, match=r"'band'.*2 label\(s\).*\(first 'cancelled'\)"):
        fitted.transform(validation, "band")


def test_a_label_with_one_class_in_the_train_split_is_refused():
    with pytest.raises(ValueError, match=r"'band' has 1 class\(es\).*at least 2"):
        Preprocessor.for_task(MULTICLASS, frame().assign(band="late"), "band")


def test_training_uses_cross_entropy_and_softmax_probabilities_of_the_classes():
    fitted = Preprocessor.for_task(MULTICLASS, frame(), "band")
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 3.0]])
    probabilities = scores(logits, fitted)
    assert torch.allclose(probabilities.sum(dim=1), torch.ones(2))
    assert probabilities.argmax(dim=1).tolist() == [0, 2]
    loss = LOSSES["multiclass"](logits, torch.tensor([0, 2]))
    expected = -torch.log(probabilities[[0, 1], [0, 2]]).mean()
    assert float(loss) == pytest.approx(float(expected), rel=1e-6)
    measured = validation_metrics(fitted, logits, pd.Series(["early", "on_time"], name="band"))
    assert isinstance(measured, MulticlassMetrics)
    assert measured.accuracy == 1.0


def test_metrics_agree_with_scikit_learn():
    labels = np.random.default_rng(3).choice(CLASSES, 600, p=[0.2, 0.3, 0.5])
    probabilities = probabilities_for(labels)
    got = multiclass_metrics(labels, probabilities, CLASSES)
    predicted = np.array(CLASSES)[probabilities.argmax(axis=1)]
    onehot = np.eye(3)[[CLASSES.index(v) for v in labels]]
    assert got.rows == 600
    assert got.log_loss == pytest.approx(sk.log_loss(labels, probabilities, labels=CLASSES))
    assert got.accuracy == pytest.approx(sk.accuracy_score(labels, predicted))
    assert got.macro_f1 == pytest.approx(sk.f1_score(labels, predicted, average="macro"))
    assert got.macro_recall == pytest.approx(sk.balanced_accuracy_score(labels, predicted))
    assert got.macro_roc_auc == pytest.approx(
        sk.roc_auc_score(labels, probabilities, multi_class="ovr", average="macro")
    )
    assert got.brier == pytest.approx(np.square(probabilities - onehot).sum(axis=1).mean())
    precision, recall, f1, support = (
        np.asarray(figure)
        for figure in sk.precision_recall_fscore_support(labels, predicted, labels=CLASSES)
    )
    for k, name in enumerate(CLASSES):
        figures = got.of_class(name)
        assert (figures.support, figures.precision) == (support[k], pytest.approx(precision[k]))
        assert (figures.recall, figures.f1) == (pytest.approx(recall[k]), pytest.approx(f1[k]))
    assert got.min_recall == pytest.approx(recall.min())


def test_the_calibration_error_is_of_the_top_class_probability():
    labels = np.array(["late"] * 10)
    confident = np.tile([0.05, 0.9, 0.05], (10, 1))  # right every time at 0.9: off by 0.1
    got = multiclass_metrics(labels, confident, CLASSES)
    assert got.calibration_error == pytest.approx(0.1)
    (only,) = top_class_calibration(labels, confident, CLASSES)
    assert (only.rows, only.mean_probability, only.observed_rate) == (10, 0.9, 1.0)


def test_a_class_absent_from_the_rows_has_zero_figures_and_no_roc_auc():
    labels = np.array(["late", "on_time"] * 5)
    got = multiclass_metrics(labels, probabilities_for(labels), CLASSES)
    early = got.of_class("early")
    assert (early.support, early.recall) == (0, 0.0)
    assert math.isfinite(got.macro_roc_auc)  # over the two classes that occur
    single = multiclass_metrics(np.array(["late"] * 4), probabilities_for(["late"] * 4), CLASSES)
    assert math.isnan(single.macro_roc_auc)


def test_metrics_refuse_probabilities_that_do_not_fit_the_classes():
    with pytest.raises(ValueError, match=r"expected \[rows, 3\]"):
        multiclass_metrics(np.array(["late"]), np.array([[0.5, 0.5]]), CLASSES)
    with pytest.raises(ValueError, match="1 probabilities are NaN"):
        multiclass_metrics(np.array(["late"]), np.array([[0.5, math.nan, 0.5]]), CLASSES)


def test_an_evaluation_has_per_slice_metrics_and_survives_its_json():
    rows = frame(400, seed=2)
    labels = rows["band"].to_numpy()
    evaluation = evaluate(
        labels,
        probabilities_for(labels),
        rows,
        [SliceSpec("line", "route__line")],
        task="multiclass",
        classes=CLASSES,
        min_slice_rows=10,
    )
    assert evaluation.task == "multiclass"
    assert {s.value for s in evaluation.slices} == {"blue", "red"}
    assert all(isinstance(s.metrics, MulticlassMetrics) for s in evaluation.slices)
    assert sum(b.rows for b in evaluation.calibration) == 400
    document = json.loads(json.dumps(evaluation.to_dict()))
    assert document["task"] == "multiclass"
    assert "recall/late" in document["overall"]
    again = Evaluation.from_dict(document)
    assert again == evaluation


def test_a_multiclass_evaluation_needs_the_class_names_and_takes_no_threshold():
    rows = frame(10)
    labels, probabilities = rows["band"].to_numpy(), probabilities_for(rows["band"].to_numpy())
    with pytest.raises(ValueError, match="needs the model's class names"):
        evaluate(labels, probabilities, rows, [], task="multiclass")
    with pytest.raises(ValueError, match="neither threshold nor baseline"):
        evaluate(labels, probabilities, rows, [], task="multiclass", classes=CLASSES, threshold=0.5)


def test_a_multiclass_label_of_fractions_is_refused_before_training(tmp_path):
    from ml.config import TrainConfig
    from ml.train import check

    path = tmp_path / "training_set.parquet"
    frame(20).assign(band=0.5, split="train").to_parquet(path)
    data = {"training_set": str(path), "label": "band", "task": "multiclass"}
    with pytest.raises(ValueError, match="the multiclass label 'band' holds double"):
        check(TrainConfig.from_dict({"data": data, "output_dir": str(tmp_path / "run")}))
    frame(20).assign(split="train").to_parquet(path)
    check(TrainConfig.from_dict({"data": data, "output_dir": str(tmp_path / "run")}))


def judged_evaluation(probabilities: np.ndarray, labels: np.ndarray, rows: pd.DataFrame):
    return evaluate(
        labels,
        probabilities,
        rows,
        [SliceSpec("line", "route__line")],
        task="multiclass",
        classes=CLASSES,
        min_slice_rows=10,
    )


def test_the_multiclass_gate_promotes_a_good_model_and_judges_the_champion_by_its_metrics():
    from declare.gate import MulticlassGatePolicy, policy_from_dict, rule_names
    from ml.gate import GateReport, decide

    rows = frame(600, seed=4)
    labels = rows["band"].to_numpy()
    good = probabilities_for(labels, seed=5)
    policy = MulticlassGatePolicy(min_slice_rows=50)
    first = decide(judged_evaluation(good, labels, rows), None, policy)
    assert first.passed, first.reasons
    assert [r.rule for r in first.rules] == list(rule_names("multiclass"))
    assert "class_recall_floor" in rule_names("multiclass")
    assert "class_recall_floor" not in rule_names("binary")
    noise = np.random.default_rng(6).dirichlet(np.ones(3), len(labels))
    worse = decide(
        judged_evaluation(noise, labels, rows),
        judged_evaluation(good, labels, rows),
        policy,
        champion_version="3",
    )
    assert worse.decision == "reject"
    assert not worse.rule("no_regression").passed
    assert "macro_f1" in worse.rule("no_regression").summary
    assert not worse.rule("no_slice_regression").passed
    again = GateReport.from_json(worse.to_json())
    assert again.policy == policy and again.challenger == worse.challenger
    assert policy_from_dict(policy.to_dict()) == policy


def test_a_class_never_predicted_fails_the_recall_floor_naming_the_class():
    from declare.gate import MulticlassGatePolicy
    from ml.gate import decide

    rows = frame(300, seed=7)
    labels = rows["band"].to_numpy()
    never_early = probabilities_for(labels, seed=8)
    never_early[:, 0] = 0.0
    never_early /= never_early.sum(axis=1, keepdims=True)
    evaluation = judged_evaluation(never_early, labels, rows)
    report = decide(evaluation, None, MulticlassGatePolicy(min_class_recall=0.2))
    rule = report.rule("class_recall_floor")
    assert not rule.passed
    assert rule.failures == [
        f"early: recall 0.000 < floor 0.200 ({int((labels == 'early').sum()):,} rows)"
    ]
    assert decide(evaluation, None, MulticlassGatePolicy()).rule("class_recall_floor").passed


def test_multiclass_evaluations_of_different_test_sets_cannot_be_compared():
    from declare.gate import MulticlassGatePolicy
    from ml.gate import decide

    rows = frame(300, seed=9)
    labels = rows["band"].to_numpy()
    ours = judged_evaluation(probabilities_for(labels), labels, rows)
    other = rows.assign(band=np.roll(labels, 1))
    moved = other["band"].to_numpy()
    theirs = judged_evaluation(
        probabilities_for(moved), np.where(moved == "late", "early", moved), other
    )
    result = decide(ours, theirs, MulticlassGatePolicy()).rule("no_regression")
    assert not result.passed and "different test sets" in result.summary


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"min_class_recall": 1.5}, "min_class_recall"),
        ({"compared_metrics": ("rmse",)}, "compared"),
    ],
)
def test_a_bad_multiclass_policy_is_refused_naming_the_field(changes, field):
    from declare.gate import MulticlassGatePolicy

    with pytest.raises(ValueError, match=field):
        MulticlassGatePolicy(**changes)


@pytest.fixture(scope="module")
def served_multiclass(tmp_path_factory: pytest.TempPathFactory):
    """A small network fitted for a few steps on a learnable three-class label, exported."""
    from ml import export
    from ml.config import ModelConfig
    from ml.model import build_model

    rows = frame(600, seed=11)
    speed = rows["trip__speed"].to_numpy()
    rows["band"] = np.where(speed < -0.5, "early", np.where(speed > 0.5, "late", "on_time"))
    rows.loc[rows.index[:30], "trip__speed"] = np.nan  # missing numbers are in the graph too
    fitted = Preprocessor.for_task(MULTICLASS, rows, "band")
    torch.manual_seed(0)
    model = build_model(fitted.numeric_width, fitted.cardinalities, fitted.outputs, ModelConfig())
    data = fitted.transform(rows, "band")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(60):
        loss = LOSSES["multiclass"](model(data.numeric, data.categorical), data.label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    path = tmp_path_factory.mktemp("multiclass") / "model.onnx"
    return model, fitted, export.export(model, fitted, path, {"feature_service": "trips_v1"}), rows


def test_the_served_graph_gives_every_classs_probability_and_the_predicted_class(
    served_multiclass,
):
    import onnxruntime as ort

    from ml import export
    from ml.predict import Scorer
    from ml.train import predictions

    model, fitted, exported, rows = served_multiclass
    scorer = Scorer.load(exported.path)
    assert scorer.task == MULTICLASS and scorer.classes == CLASSES
    onnx_probabilities = scorer.predict(rows)
    torch_probabilities = predictions(model, fitted, rows)
    assert onnx_probabilities.shape == (600, 3) and onnx_probabilities.dtype == np.float32
    np.testing.assert_allclose(onnx_probabilities, torch_probabilities, rtol=1e-5, atol=1e-6)
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    (named,) = session.run(["predicted_class"], scorer.inputs(rows))
    assert np.asarray(named).tolist() == [CLASSES[k] for k in torch_probabilities.argmax(axis=1)]
    learned = multiclass_metrics(rows["band"].to_numpy(), onnx_probabilities, CLASSES)
    assert learned.accuracy > 0.8  # it learned the bands, so the classes' order matters
    report = export.parity(exported.path, model, fitted, rows, batch_sizes=(1, 7, 1024))
    assert report.passed and report.mismatched_rows == 0, report.as_dict()


def test_a_wrong_class_probability_fails_parity_on_its_rows(served_multiclass, tmp_path):
    import onnx
    from onnx import numpy_helper

    from ml import export

    model, fitted, exported, rows = served_multiclass
    proto = onnx.load_model(str(exported.path))
    last_bias = [t for t in proto.graph.initializer if t.name.endswith("bias")][-1]
    changed = numpy_helper.to_array(last_bias).copy()
    changed[1] += 1.0  # one class's logit: the probabilities of rows not yet certain move
    last_bias.CopyFrom(numpy_helper.from_array(changed, last_bias.name))
    onnx.save_model(proto, str(tmp_path / "tampered.onnx"))
    report = export.parity(tmp_path / "tampered.onnx", model, fitted, rows, batch_sizes=())
    assert not report.passed and report.mismatched_rows > len(rows) // 10
    assert 0.05 < report.max_abs_error < 0.5


def test_scored_rows_carry_the_predicted_class_its_probability_and_each_classs(
    served_multiclass, tmp_path
):
    from ml.predict import Scorer, score_to_parquet

    _, _, exported, rows = served_multiclass
    scorer = Scorer.load(exported.path)
    with pytest.raises(ValueError, match="a multiclass model takes none"):
        score_to_parquet(
            scorer, [rows], tmp_path / "x.parquet", keep=[], constants={}, threshold=0.5
        )
    batches = [rows.iloc[i : i + 128] for i in range(0, len(rows), 128)]
    summary = score_to_parquet(
        scorer,
        batches,
        tmp_path / "scored.parquet",
        keep=["band"],
        constants={"model_version": "1"},
    )
    scored = pd.read_parquet(tmp_path / "scored.parquet")
    assert list(scored.columns) == [
        "band",
        "predicted_class",
        "predicted_probability",
        "probability_early",
        "probability_late",
        "probability_on_time",
        "model_version",
    ]
    probabilities = scorer.predict(rows)
    assert scored["predicted_class"].tolist() == [CLASSES[k] for k in probabilities.argmax(axis=1)]
    np.testing.assert_allclose(scored["predicted_probability"], probabilities.max(axis=1))
    np.testing.assert_allclose(scored["probability_late"], probabilities[:, 1])
    counts = scored["predicted_class"].value_counts()
    assert summary.predicted_classes == {c: int(counts.get(c, 0)) for c in CLASSES}
    assert summary.rows == 600
    assert summary.mean == pytest.approx(float(probabilities.max(axis=1).mean()), rel=1e-6)


def predicted_frame(shares: list[float], rows: int = 2_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {
            "trip__speed": rng.normal(0, 1, rows),
            "probability": rng.choice(CLASSES, rows, p=shares).astype(object),
        }
    )


def test_the_drift_of_predicted_classes_is_the_psi_of_their_shares():
    from ml.drift import compare, psi

    reference = predicted_frame([0.2, 0.3, 0.5])
    same = compare(reference, predicted_frame([0.2, 0.3, 0.5], seed=1), ["trip__speed"], [])
    moved = compare(reference, predicted_frame([0.6, 0.3, 0.1], seed=2), ["trip__speed"], [])
    assert same.score is not None and moved.score is not None
    assert same.score.level == "ok" and same.score.ks_statistic is None
    assert moved.score.level == "fail" and moved.drift_event
    assert moved.summary().startswith("score PSI 1.035 (fail); 0 of 1 features drifted")
    assert "| probability | score | fail |" in moved.table()
    shares = [reference["probability"].value_counts()[c] for c in CLASSES]
    today = predicted_frame([0.6, 0.3, 0.1], seed=2)["probability"].value_counts()
    # Over the classes, plus empty bins for a class the reference never predicted and missing.
    expected = psi(np.array([*shares, 0, 0]), np.array([*(today[c] for c in CLASSES), 0, 0]))
    assert moved.score.psi == pytest.approx(expected)


def test_lines_measured_on_the_training_period_bin_predicted_classes_as_categories():
    from declare.policies import LineRule
    from ml.drift import ColumnLines, natural_lines

    rows = predicted_frame([0.2, 0.3, 0.5], rows=1_400)
    days = pd.Series(np.repeat(pd.date_range("2024-01-01", periods=14).date, 100))
    lines = natural_lines(
        rows, days, ["trip__speed"], [], 7, ColumnLines(1e-9, 1e-9, 1e-9, 1e-9), LineRule()
    )
    assert lines is not None
    measured = lines.columns["probability"]
    # The shares wobble from window to window (as numbers, every class would be missing alike).
    assert 1e-4 < measured.psi_warn < 0.1


def test_a_scorer_monitors_the_predicted_class(served_multiclass):
    from ml.predict import Scorer

    _, _, exported, rows = served_multiclass
    scorer = Scorer.load(exported.path)
    monitored = scorer.monitored(rows.head(50))
    assert monitored.tolist() == [CLASSES[k] for k in scorer.predict(rows.head(50)).argmax(axis=1)]


def test_realized_performance_judges_macro_f1_with_a_bootstrap_interval():
    from declare.policies import DecayPolicy
    from ml.realized import realized

    labels = np.random.default_rng(12).choice(CLASSES, 500, p=[0.2, 0.3, 0.5])
    probabilities = probabilities_for(labels, seed=13)
    tested = multiclass_metrics(labels, probabilities, CLASSES)
    policy = DecayPolicy(samples=50, min_rows=50)
    assert policy.metric_for("multiclass") == "macro_f1"
    report = realized(
        labels, probabilities, "multiclass", {"macro_f1": tested.macro_f1}, policy, classes=CLASSES
    )
    assert report.metric == "macro_f1" and report.overall.verdict == "ok"
    measured = report.overall.measured
    assert measured.low <= tested.macro_f1 <= measured.high
    assert report.metrics["recall/late"] == pytest.approx(tested.of_class("late").recall)
    shuffled = probabilities[np.random.default_rng(14).permutation(500)]
    decayed = realized(
        labels, shuffled, "multiclass", {"macro_f1": tested.macro_f1}, policy, classes=CLASSES
    )
    assert decayed.overall.verdict == "failed"


def test_the_per_class_plots_draw_and_refuse_an_evaluation_without_classes():
    from ml.plots import class_bars, confusion_matrix

    rows = frame(200, seed=15)
    labels = rows["band"].to_numpy()
    probabilities = probabilities_for(labels)
    evaluation = judged_evaluation(probabilities, labels, rows)
    assert class_bars({"challenger": evaluation, "champion v1": evaluation}).startswith(b"\x89PNG")
    assert confusion_matrix(labels, probabilities, CLASSES).startswith(b"\x89PNG")
    binary = evaluate(
        np.array([0, 1] * 50), np.linspace(0, 1, 100), rows.head(100), [], threshold=0.5
    )
    with pytest.raises(ValueError, match="binary evaluation has no per-class figures"):
        class_bars({"challenger": binary})


def test_a_multiclass_label_is_read_as_class_names_and_counted_per_split():
    from ml.dataset import TimeSplit, assemble, labelled_rows

    stamps = pd.to_datetime(
        ["2013-01-01T06:00Z", "2013-01-02T06:00Z", "2013-01-03T06:00Z", "2013-01-04T06:00Z"]
    )
    outcomes = pd.DataFrame(
        {"flight_id": list("abcd"), "event_timestamp": stamps, "band": [2, 0, 2, None]}
    )
    spec = LabelSpec(view="outcome", label="band", task="multiclass")
    entity, unlabelled = labelled_rows(outcomes, spec, ["flight_id"])
    assert entity["band"].tolist() == ["2", "0", "2"] and unlabelled == 1
    day = dt.date.fromisoformat
    split = TimeSplit(day("2013-01-01"), day("2013-01-03"), day("2013-01-04"), day("2013-01-05"))
    _, summary = assemble(entity.assign(f__x=1.0), spec, split, ["f__x"], 1)
    assert summary.classes == {
        "train": {"0": 1, "2": 1},
        "validation": {"0": 0, "2": 1},
        "test": {"0": 0, "2": 0},
    }
    assert summary.label_mean == {} and summary.positives == {}
