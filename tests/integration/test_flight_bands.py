"""The flight-delay bands use case (multiclass) through the generic stages, as `make run` drives
them: six days of 2013's flights ingested and featured, a training set split by the window, a
small model trained with cross-entropy over the four bands, judged by the multiclass gate,
exported to ONNX (per-band probabilities and the predicted band) passing parity, registered as
the champion, and a day scored and checked for the drift of its predicted bands."""

import datetime as dt
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets import asset_key
from pipelines.definitions import definitions, local_resources
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry
from resources.sources import DropFolderSource
from tests.world import QUIET, make_drops
from usecases.flight_bands import USE_CASE as BANDS
from usecases.flight_bands.features import BANDS as BAND_EDGES

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
DAYS = [dt.date(2013, 1, 1) + dt.timedelta(days=n) for n in range(6)]
WINDOW = BANDS.window.config(DAYS[0], DAYS[-1])
SCORED = DAYS[-1].isoformat()
CLASSES = sorted(name for name, _, _ in BAND_EDGES)
TRAIN = {"optim": {"max_epochs": 4, "batch_size": 256}, "model": {"hidden_sizes": [32, 16]}}
# Six days are too few for the production floor; the test is about mechanics, not accuracy.
LENIENT = {"min_macro_roc_auc": 0.5, "max_calibration_error": 0.5}


@dataclass
class Lifecycle:
    defs: dg.Definitions
    instance: dg.DagsterInstance
    registry: MlflowRegistry
    home: Path
    runs: dict[str, dg.ExecuteInProcessResult]

    def run(self, job: str, partition: str | None = None, ops: dict | None = None):
        config = {asset_key(BANDS, op).to_python_identifier(): c for op, c in (ops or {}).items()}
        result = self.defs.resolve_job_def(BANDS.name_for(job)).execute_in_process(
            instance=self.instance,
            partition_key=partition,
            run_config={**QUIET, "ops": config},
            raise_on_error=False,
        )
        self.runs[f"{job}:{partition}"] = result
        return result

    def metadata(self, job: str, asset: str) -> dict:
        for event in self.runs[job].get_asset_materialization_events():
            materialization = event.step_materialization_data.materialization
            if materialization.asset_key == asset_key(BANDS, asset):
                return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
        raise KeyError(asset)


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lifecycle]:
    home = tmp_path_factory.mktemp("flight_bands")
    drops = make_drops(home / "drops", [d.isoformat() for d in DAYS])
    resources = local_resources(Settings(home=home))
    resources[f"{BANDS.name}_source"] = DropFolderSource(root=str(drops))
    resources["expectations"] = GreatExpectations(
        data_docs_dir=str(home / "docs"), build_data_docs=False
    )
    resources["launcher"] = LocalTorchrun(output_root=str(home / "models"), processes=1)
    registry = resources["mlflow"]
    assert isinstance(registry, MlflowRegistry)
    (home / "dagster_home").mkdir()
    shutil.copyfile(REPO / "deploy" / "dagster.local.yaml", home / "dagster_home" / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
        lifecycle = Lifecycle(definitions(resources), instance, registry, home, {})
        assert lifecycle.run("load_dimensions").success
        assert lifecycle.run("apply_feature_registry").success
        for day in DAYS:
            assert lifecycle.run("daily_partition", day.isoformat()).success, day
        built = lifecycle.run("build_training_set", ops={"training_set": {"config": WINDOW}})
        assert built.success
        trained = lifecycle.run(
            "train_model",
            ops={"trained_model": {"config": TRAIN}, "model_evaluation": {"config": LENIENT}},
        )
        assert trained.success
        assert lifecycle.run("score_day", SCORED).success
        yield lifecycle


def test_the_bands_model_is_trained_gated_exported_registered_and_serves(lifecycle: Lifecycle):
    evaluation = lifecycle.metadata("train_model:None", "model_evaluation")
    assert evaluation["decision"] == "promote"
    assert 0.5 < evaluation["test_macro_roc_auc"] <= 1
    assert 0 < evaluation["test_macro_f1"] <= 1 and evaluation["test_log_loss"] > 0
    supports = [evaluation[f"test_support/{band}"] for band in CLASSES]
    assert sum(supports) == evaluation["test_rows"] and all(n > 0 for n in supports)
    assert "test_roc_auc" not in evaluation and "test_threshold" not in evaluation
    assert {"class_recall_plot", "confusion_plot", "calibration_plot"} <= set(evaluation)
    trained = lifecycle.runs["train_model:None"]
    checks = {c.check_name: c.passed for c in trained.get_asset_check_evaluations()}
    assert checks == {
        "finite_metrics": True,
        "absolute_floor": True,
        "no_regression": True,
        "no_slice_regression": True,
        "no_fold_regression": True,
        "class_recall_floor": True,
        "onnx_parity": True,
    }
    champion = lifecycle.registry.champion(BANDS.registered_model)
    assert champion is not None and champion.version == "1"


def test_a_scored_day_carries_the_predicted_band_and_every_bands_probability(
    lifecycle: Lifecycle,
):
    scored = lifecycle.metadata(f"score_day:{SCORED}", "batch_predictions")
    path = lifecycle.home / "lake" / BANDS.name / "batch_predictions" / f"{SCORED}.parquet"
    predictions = pd.read_parquet(path)
    assert scored["dagster/row_count"] == len(predictions) > 0
    assert scored["model"].startswith("flight_delay_band v1")
    per_band = [f"probability_{band}" for band in CLASSES]
    assert {"flight_id", "predicted_class", "predicted_probability", *per_band} <= set(
        predictions.columns
    )
    assert set(predictions["predicted_class"]) <= set(CLASSES)
    assert predictions[per_band].sum(axis=1).sub(1).abs().max() < 1e-5
    top = predictions[per_band].to_numpy().argmax(axis=1)
    assert predictions["predicted_class"].tolist() == [CLASSES[k] for k in top]
    assert sum(scored["predicted_classes"].values()) == len(predictions)
    drift = lifecycle.metadata(f"score_day:{SCORED}", "feature_drift")
    assert drift["rows"] > 0 and drift["score_psi"] is not None
