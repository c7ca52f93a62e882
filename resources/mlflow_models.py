"""Building an MLflow model from a registered ONNX file (`OnnxFlavour`, `log_onnx_model`): the
registry (resources/registry.py) does it while it registers a version, so that the version's folder
is an MLflow model too. mlflow and onnx are imported inside `log_onnx_model` only: they take
seconds, and the code location must load without them.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ONNX_FLAVOUR_FILE = "model.onnx"
"""The name MLflow's onnx flavour gives its file (the MLmodel's `data`): the ONNX file of a
version registered with an `OnnxFlavour` is registered under it."""


@dataclass(frozen=True)
class OnnxFlavour:
    """A registered ONNX file as an MLflow model too (flavour `onnx`, with `python_function`):
    logged from the version's run (the run page's Models), with a signature and an input example
    from real rows, and linked to the version by tags (`LOGGED_MODEL_TAG`), so that MLflow's UI
    shows what the model takes and gives and `mlflow.pyfunc.load_model` serves it."""

    file: Path
    inputs: Mapping[str, Any]
    """The graph's inputs for a few rows: numpy arrays by input name."""
    outputs: Mapping[str, Any]
    """The graph's outputs for them: numpy arrays by output name."""


def log_onnx_model(client, run, model_name: str, flavour: OnnxFlavour, folder: Path) -> str:
    """Write `flavour` as an MLflow model into the new folder `folder` and log it as a model
    of `run` (its Models column); the model's id."""
    from importlib.metadata import version

    import mlflow.onnx
    import onnx
    from mlflow.entities import LoggedModelOutput, LoggedModelStatus
    from mlflow.models import Model, infer_signature

    logged = client.create_logged_model(
        run.info.experiment_id, name=model_name, source_run_id=run.info.run_id
    )
    mlflow.onnx.save_model(
        onnx.load(flavour.file),
        str(folder),
        mlflow_model=Model(run_id=run.info.run_id, model_id=logged.model_id),
        signature=infer_signature(dict(flavour.inputs), dict(flavour.outputs)),
        input_example=dict(flavour.inputs),
        pip_requirements=[f"{p}=={version(p)}" for p in ("onnx", "onnxruntime")],
        onnx_execution_providers=["CPUExecutionProvider"],
        save_as_external_data=False,
    )
    client.log_model_artifacts(logged.model_id, str(folder))
    client.finalize_logged_model(logged.model_id, LoggedModelStatus.READY)
    client.log_outputs(run.info.run_id, [LoggedModelOutput(logged.model_id, step=0)])
    return logged.model_id
