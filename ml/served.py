"""The names a served model goes by outside ml/: the files and tags of a registered version
(written by `ml.deploy`, read by `resources.serving` and the monitoring stages) and the check its
ONNX file passes (`onnx_model`'s). Cheap to import: the definitions import it when they load.
"""

MODEL_FILE = "model.onnx"
"""The served graph's artifact name in a registered version."""
DATA_THROUGH_TAG = "data_through"
"""Version tag: the last day of the training data (YYYY-MM-DD, data timezone)."""
REFERENCE_FILE = "drift_reference.parquet"
"""Training rows and the served graph's scores for them: what drift is measured against."""
METRICS_FILE = "metrics.json"
"""The version's metrics on its test split (overall, per slice, calibration)."""
LINES_FILE = "drift_lines.json"
"""Each column's drift lines measured on the training period (`ml.drift.natural_lines`)."""
PARITY_CHECK = "onnx_parity"
"""The blocking check that onnxruntime scores as PyTorch does (`ml.export.parity`)."""
