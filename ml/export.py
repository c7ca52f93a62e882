"""A trained model → one ONNX file that serving runs as it is.

The served graph takes raw feature values and returns the task's output (`ml.task`): P(label =
1) for a binary classifier, the label's predicted value for a regression, P(class) of every class
and the most probable class's name for a multiclass classifier. The preprocessing
(`ml.data.Preprocessor`) is inside it, so serving needs nothing but onnxruntime and cannot drift
from training. Numbers are standardized in double precision, exactly as `Preprocessor.inputs`
does, then cast to float; categories are looked up with `ai.onnx.ml` LabelEncoder (the train
vocabulary, 0 for anything else); the network is exported by torch's TorchScript-based
exporter (docs/serving.md, "Exporter"), and the graph closes with a Sigmoid (binary), with
the label's de-standardization, output * std + mean in float (regression), or with a Softmax over
the classes in float, then ArgMax (the first class on a tie) and a LabelEncoder from the index
to the class name (multiclass).

    numeric      tensor(double) [batch, len(preprocessor.numeric)]      NaN = missing
    categorical  tensor(string) [batch, len(preprocessor.categorical)]  "" = missing
    probability  tensor(float)  [batch]    binary
    prediction   tensor(float)  [batch]    regression
    probabilities    tensor(float)  [batch, classes]  multiclass, columns in `classes` order
    predicted_class  tensor(string) [batch]           multiclass

An input group with no features is left out of the graph.
"""

import hashlib
import json
import logging
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from ml.data import UNKNOWN, Preprocessor
from ml.files import FILE_MODE, atomic_write
from ml.predict import (
    CATEGORICAL_FEATURES,
    CLASSES,
    INPUT_CATEGORICAL,
    INPUT_NUMERIC,
    LABEL_MEAN,
    LABEL_STD,
    MISSING_CATEGORY,
    NUMERIC_FEATURES,
    PREDICTED_CLASS,
    TASK,
)
from ml.task import MULTICLASS

log = logging.getLogger(__name__)

ML_OPSET = 3
"""`ai.onnx.ml` opset: LabelEncoder with string keys and int64 values."""
PRODUCER = "ml.export"
_BATCH = "batch"
_SAMPLE_ROWS = 3
"""Rows of the example inputs the exporter traces with (not 0 or 1, which it would specialize)."""


@dataclass(frozen=True)
class ExportedModel:
    """An ONNX file as written: its bytes' sha256, opset and metadata properties."""

    path: Path
    sha256: str
    opset: int
    properties: dict[str, str]


class _Network(nn.Module):
    """The network with only the inputs that have columns: the exporter cannot trace an
    input of width 0."""

    def __init__(self, model: nn.Module, numeric_width: int, num_categorical: int):
        super().__init__()
        self.model = model
        self.numeric_width = numeric_width
        self.num_categorical = num_categorical

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs[0].shape[0]
        numeric = inputs[0] if self.numeric_width else torch.zeros((rows, 0))
        categorical = (
            inputs[-1] if self.num_categorical else torch.zeros((rows, 0), dtype=torch.int64)
        )
        return self.model(numeric, categorical)


def network_onnx(model: nn.Module, preprocessor: Preprocessor) -> Any:
    """The network alone as an `onnx.ModelProto`: inputs `numeric` (float [batch, 2 *
    numeric features]) and `categorical` (int64 [batch, categorical features]), as
    `Preprocessor.inputs` makes them, output `logit` [batch]."""
    import onnx

    if not preprocessor.features:
        raise ValueError("the preprocessor has no features: nothing to export")
    numeric, categorical = preprocessor.inputs(_sample_frame(preprocessor))
    names, inputs = [], []
    if preprocessor.numeric:
        names.append(INPUT_NUMERIC)
        inputs.append(numeric)
    if preprocessor.categorical:
        names.append(INPUT_CATEGORICAL)
        inputs.append(categorical)
    # The model itself when it has both inputs: its initializers keep the state_dict's names.
    network = (
        model
        if len(inputs) == 2
        else _Network(model, preprocessor.numeric_width, len(preprocessor.categorical)).eval()
    )
    was_training = model.training
    model.eval()
    try:
        with tempfile.TemporaryDirectory(prefix="ml-export-") as folder, warnings.catch_warnings():
            # The TorchScript exporter, deprecated since torch 2.9, says so on every export
            # (docs/serving.md, "Exporter": why it is used all the same).
            warnings.filterwarnings(
                "ignore", "You are using the legacy TorchScript-based ONNX export"
            )
            warnings.filterwarnings(
                "ignore", "The feature will be removed", module=r"torch\.onnx\."
            )
            graph = Path(folder) / "network.onnx"
            torch.onnx.export(
                network,
                tuple(inputs),
                graph,
                dynamo=False,
                input_names=names,
                output_names=["logit"],
                dynamic_axes={name: {0: _BATCH} for name in [*names, "logit"]},
            )
            return onnx.load_model(str(graph))
    finally:
        model.train(was_training)


def served_onnx(model: nn.Module, preprocessor: Preprocessor) -> Any:
    """The served graph as an `onnx.ModelProto` (module docstring), without metadata."""
    from onnx import TensorProto, helper, numpy_helper

    for column, vocabulary in zip(preprocessor.categorical, preprocessor.vocabularies, strict=True):
        if MISSING_CATEGORY in vocabulary:
            raise ValueError(
                f"the vocabulary of {column!r} contains {MISSING_CATEGORY!r}, the served graph's"
                " marker of a missing value: map empty strings to a value before training"
            )
    network = network_onnx(model, preprocessor)
    graph = network.graph
    # The network's inputs become internal values, fed by the preprocessing.
    renamed = {i.name: f"network_{i.name}" for i in graph.input}
    for node in graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
    (logit,) = [o.name for o in graph.output]

    nodes, initializers, inputs = [], [], []
    if preprocessor.numeric:
        width = len(preprocessor.numeric)
        inputs.append(
            helper.make_tensor_value_info(INPUT_NUMERIC, TensorProto.DOUBLE, [_BATCH, width])
        )
        initializers += [
            numpy_helper.from_array(np.asarray(preprocessor.mean, dtype="float64"), "mean"),
            numpy_helper.from_array(np.asarray(preprocessor.std, dtype="float64"), "std"),
            numpy_helper.from_array(np.zeros((), dtype="float64"), "zero"),
        ]
        nodes += [
            helper.make_node("IsNaN", [INPUT_NUMERIC], ["missing"]),
            helper.make_node("Sub", [INPUT_NUMERIC, "mean"], ["centred"]),
            helper.make_node("Div", ["centred", "std"], ["standardized"]),
            helper.make_node("Where", ["missing", "zero", "standardized"], ["filled"]),
            helper.make_node("Cast", ["filled"], ["filled_float"], to=TensorProto.FLOAT),
            helper.make_node("Cast", ["missing"], ["missing_flags"], to=TensorProto.FLOAT),
            helper.make_node(
                "Concat", ["filled_float", "missing_flags"], [renamed[INPUT_NUMERIC]], axis=1
            ),
        ]
    if preprocessor.categorical:
        width = len(preprocessor.categorical)
        inputs.append(
            helper.make_tensor_value_info(INPUT_CATEGORICAL, TensorProto.STRING, [_BATCH, width])
        )
        columns = []
        for i, vocabulary in enumerate(preprocessor.vocabularies):
            index = f"category_{i}_position"
            initializers.append(numpy_helper.from_array(np.asarray(i, dtype="int64"), index))
            nodes += [
                helper.make_node("Gather", [INPUT_CATEGORICAL, index], [f"category_{i}"], axis=1),
                helper.make_node(
                    "LabelEncoder",
                    [f"category_{i}"],
                    [f"category_{i}_index"],
                    domain="ai.onnx.ml",
                    keys_strings=list(vocabulary),
                    values_int64s=list(range(1, len(vocabulary) + 1)),
                    default_int64=UNKNOWN,
                ),
                helper.make_node(
                    "Unsqueeze", [f"category_{i}_index", "column_axis"], [f"category_{i}_column"]
                ),
            ]
            columns.append(f"category_{i}_column")
        initializers.append(numpy_helper.from_array(np.asarray([1], dtype="int64"), "column_axis"))
        nodes.append(helper.make_node("Concat", columns, [renamed[INPUT_CATEGORICAL]], axis=1))
    output = preprocessor.task.output
    nodes += graph.node
    target = preprocessor.target
    outputs = [helper.make_tensor_value_info(output, TensorProto.FLOAT, [_BATCH])]
    if preprocessor.classes is not None:
        nodes += _class_outputs(logit, preprocessor.classes)
        outputs = [
            helper.make_tensor_value_info(
                output, TensorProto.FLOAT, [_BATCH, len(preprocessor.classes)]
            ),
            helper.make_tensor_value_info(PREDICTED_CLASS, TensorProto.STRING, [_BATCH]),
        ]
    elif target is None:
        nodes.append(helper.make_node("Sigmoid", [logit], [output]))
    else:
        initializers += [
            numpy_helper.from_array(np.asarray(target.std, dtype="float32"), "label_std"),
            numpy_helper.from_array(np.asarray(target.mean, dtype="float32"), "label_mean"),
        ]
        nodes += [
            helper.make_node("Mul", [logit, "label_std"], ["label_scaled"]),
            helper.make_node("Add", ["label_scaled", "label_mean"], [output]),
        ]
    served = helper.make_graph(
        nodes,
        f"label_{output}",
        inputs,
        outputs,
        initializer=[*initializers, *graph.initializer],
    )
    opsets = [*network.opset_import, helper.make_opsetid("ai.onnx.ml", ML_OPSET)]
    proto = helper.make_model(served, opset_imports=opsets, functions=network.functions)
    proto.ir_version = network.ir_version
    return proto


def _class_outputs(logits: str, classes: list[str]) -> list[Any]:
    """Nodes from the network's per-class logits to `probabilities` (Softmax over the classes,
    in float) and `predicted_class` (the name of the first most probable class)."""
    from onnx import helper

    probabilities, predicted = MULTICLASS.output, PREDICTED_CLASS
    return [
        helper.make_node("Softmax", [logits], [probabilities], axis=1),
        helper.make_node("ArgMax", [probabilities], ["class_index"], axis=1, keepdims=0),
        helper.make_node(
            "LabelEncoder",
            ["class_index"],
            [predicted],
            domain="ai.onnx.ml",
            keys_int64s=list(range(len(classes))),
            values_strings=list(classes),
            default_string="",
        ),
    ]


def export(
    model: nn.Module,
    preprocessor: Preprocessor,
    path: Path,
    properties: Mapping[str, str],
    permissions: int = FILE_MODE,
) -> ExportedModel:
    """Write the served graph of `model` and `preprocessor` to `path` (atomically, with mode
    `permissions`), with `properties` and the feature order as metadata, after onnx's full
    check."""
    import onnx

    proto = served_onnx(model, preprocessor)
    proto.producer_name = PRODUCER
    proto.producer_version = f"torch {torch.__version__}, onnx {onnx.__version__}"
    task, target = preprocessor.task, preprocessor.target
    proto.doc_string = (
        f"{task.meaning[0].upper()}{task.meaning[1:]} from raw feature values: input 'numeric'"
        f" (double, NaN = missing) columns {preprocessor.numeric}; input 'categorical' (string,"
        f" '' = missing) columns {preprocessor.categorical}; output '{task.output}' (float)"
        + (
            f" over the classes {preprocessor.classes} and '{task.predicted}' (string)."
            if preprocessor.classes is not None
            else "."
        )
        + " Preprocessing is in the graph."
    )
    labels = {} if target is None else {LABEL_MEAN: repr(target.mean), LABEL_STD: repr(target.std)}
    if preprocessor.classes is not None:
        labels[CLASSES] = json.dumps(preprocessor.classes)
    _set_properties(
        proto,
        {
            **properties,
            NUMERIC_FEATURES: json.dumps(preprocessor.numeric),
            CATEGORICAL_FEATURES: json.dumps(preprocessor.categorical),
            TASK: task.name,
            **labels,
        },
    )
    onnx.checker.check_model(proto, full_check=True)
    return _write(proto, Path(path), permissions)


def stamp(
    src: Path, dst: Path, properties: Mapping[str, str], permissions: int = FILE_MODE
) -> ExportedModel:
    """Copy `src` to `dst` (atomically, with mode `permissions`) with `properties` added to its
    metadata, or replacing the values of keys it has; the graph is verified unchanged."""
    import onnx

    proto = onnx.load_model(str(src))
    graph = proto.graph.SerializeToString()
    _set_properties(proto, {**_properties(proto), **properties})
    written = _write(proto, Path(dst), permissions)
    if onnx.load_model(str(dst)).graph.SerializeToString() != graph:
        raise AssertionError(f"stamping {src} changed its graph")
    return written


def read_properties(path: Path) -> dict[str, str]:
    """The metadata properties of the ONNX file at `path`."""
    import onnx

    return _properties(onnx.load_model(str(path)))


def quantize(src: Path, dst: Path, permissions: int = FILE_MODE) -> ExportedModel:
    """`src` with its weights dynamically quantized to int8 (onnxruntime), written to `dst`
    (mode `permissions`) with the same metadata plus `quantization`."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst = Path(dst)
    properties = read_properties(src)
    with tempfile.TemporaryDirectory(dir=dst.parent, prefix=f".{dst.name}.") as folder:
        staged = Path(folder) / "quantized.onnx"
        quantize_dynamic(src, staged, weight_type=QuantType.QInt8)
        proto = onnx.load_model(str(staged))
    _set_properties(proto, {**properties, "quantization": "dynamic int8 weights"})
    return _write(proto, dst, permissions)


@dataclass(frozen=True)
class ParityReport:
    """ONNX against torch on the same rows: errors, and rows outside the tolerance."""

    rows: int
    batch_sizes: tuple[int, ...]
    max_abs_error: float
    max_rel_error: float
    rtol: float
    atol: float
    mismatched_rows: int
    passed: bool

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "batch_sizes": list(self.batch_sizes)}


PARITY_SMALL_BATCH_ROWS = 2_000
"""Rows checked in batches smaller than 64 (one run per batch is slow): the frame's first."""


def parity(
    onnx_path: Path,
    model: nn.Module,
    preprocessor: Preprocessor,
    frame: pd.DataFrame,
    batch_sizes: Sequence[int] = (1, 7, 1024),
    rtol: float = 1e-3,
    atol: float = 1e-5,
) -> ParityReport:
    """The ONNX file's outputs (`ml.predict.Scorer`) against `ml.train.predictions`, both in
    the output's units: probabilities (of every class, multiclass), or the label's units for a
    regression (there `atol` is in the label's units too: scale it with the label's standard
    deviation).

    ONNX scores the whole frame in one run, then in chunks of each batch size; batch sizes
    under 64 score only the first `PARITY_SMALL_BATCH_ROWS` rows. A row mismatches unless
    |onnx - torch| <= atol + rtol * |torch| (a NaN always mismatches); a row counts once
    however many runs it fails."""
    from ml.predict import Scorer
    from ml.train import predictions

    if len(frame) == 0:
        raise ValueError("parity needs at least one row")
    scorer = Scorer.load(onnx_path)
    reference = np.asarray(predictions(model, preprocessor, frame), dtype="float64")
    inputs = scorer.inputs(frame)  # once: a batch is a slice of these rows
    runs = [(0, scorer.run(inputs))]
    for size in batch_sizes:
        rows = len(frame) if size >= 64 else min(len(frame), PARITY_SMALL_BATCH_ROWS)
        for start in range(0, rows, size):
            end = min(start + size, rows)
            runs.append((start, scorer.run({k: v[start:end] for k, v in inputs.items()})))
    mismatched = np.zeros(len(frame), dtype=bool)
    max_abs = max_rel = 0.0
    for start, scores in runs:
        expected = reference[start : start + len(scores)]
        error = np.abs(scores.astype("float64") - expected)
        bad = ~(error <= atol + rtol * np.abs(expected))  # NaN compares False: a mismatch
        # A row of a multiclass model mismatches when any class's probability does.
        mismatched[start : start + len(scores)] |= bad.reshape(len(scores), -1).any(axis=1)
        error = np.where(np.isnan(error), np.inf, error)
        max_abs = max(max_abs, float(error.max()))
        relative = error / np.maximum(np.abs(expected), np.finfo("float32").tiny)
        max_rel = max(max_rel, float(relative.max()))
    report = ParityReport(
        rows=len(frame),
        batch_sizes=tuple(batch_sizes),
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        rtol=rtol,
        atol=atol,
        mismatched_rows=int(mismatched.sum()),
        passed=not mismatched.any(),
    )
    log.info("ONNX parity on %d rows: %s", len(frame), report.as_dict())
    return report


def _sample_frame(preprocessor: Preprocessor) -> pd.DataFrame:
    columns: dict[str, Any] = {c: np.zeros(_SAMPLE_ROWS) for c in preprocessor.numeric}
    columns |= {c: [MISSING_CATEGORY] * _SAMPLE_ROWS for c in preprocessor.categorical}
    return pd.DataFrame(columns)


def _properties(proto: Any) -> dict[str, str]:
    return {p.key: p.value for p in proto.metadata_props}


def _set_properties(proto: Any, properties: Mapping[str, str]) -> None:
    from onnx import helper

    bad = sorted(k for k, v in properties.items() if not isinstance(v, str))
    if bad:
        raise ValueError(f"ONNX metadata properties must be strings; not so for {bad}")
    del proto.metadata_props[:]
    helper.set_model_props(proto, dict(properties))


def _write(proto: Any, path: Path, permissions: int) -> ExportedModel:
    """Write `proto` to `path` atomically (a temp file beside it, fsync, rename), with mode
    `permissions`: serving may run as another user, in the group."""
    data = proto.SerializeToString()
    with atomic_write(path, permissions=permissions) as file:
        file.write(data)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    return ExportedModel(
        path=path,
        sha256=hashlib.sha256(data).hexdigest(),
        opset=opset,
        properties=_properties(proto),
    )
