"""The model registry on real MLflow stores: SQLite under a temporary folder, and PostgreSQL.

Registration, the champion alias (promotion, refusal, rollback), verified fetches, and the
refusal of names that would escape their folder. One SQLite store is shared by the module
(creating MLflow's schema takes seconds); each test uses its own model name.
"""

import hashlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

from ml.training_run import EpochMetrics, TrainingData
from resources.mlflow_models import OnnxFlavour
from resources.registry import (
    CHAMPION,
    MlflowRegistry,
    ModelIntegrityError,
    ModelVersion,
    RegistryError,
    local_registry,
)

pytestmark = pytest.mark.integration

UNSAFE_NAMES = ["../x", "/etc/passwd", "a\\b", "%2e%2e", "", "a/b", ".."]
POSTGRES = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> MlflowRegistry:
    return local_registry(tmp_path_factory.mktemp("home"))


def register(
    registry: MlflowRegistry,
    model: str,
    folder: Path,
    content: bytes,
    gate: str = "promote",
    expected_version: str | None = None,
) -> ModelVersion:
    folder.mkdir(parents=True, exist_ok=True)
    onnx = folder / f"export-{secrets.token_hex(4)}.onnx"  # the artifact name is not the file's
    onnx.write_bytes(content)
    return registry.register(
        model,
        files={"model.onnx": onnx},
        documents={"gate_report.json": {"decision": gate}, "metrics.json": {"auc": 0.71}},
        tags={"gate_decision": gate, "data_fingerprint": "abc123"},
        run_name=f"register-{model}",
        expected_version=expected_version,
        description="test model",
    )


def stored_file(version: ModelVersion, artifact: str) -> Path:
    """The artifact's file in the (file-system) artifact store."""
    return Path(url2pathname(urlparse(version.source).path)) / artifact


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_live_run_shows_each_epoch_as_it_is_logged_and_ends_with_the_work(
    registry: MlflowRegistry,
):
    from mlflow import MlflowClient

    client = MlflowClient(registry.tracking_uri)
    tracking = registry.for_use_case("live")
    with tracking.live_run("training", {"optim.lr": 0.01}, {"dagster_run_id": "abc"}) as live:
        live.log({"validation_loss": 0.5, "train_loss": float("nan")}, step=1)
        # Logged from the run's thread while the work goes on: seen before the run ends.
        while not client.get_metric_history(live.run.run_id, "validation_loss"):
            time.sleep(0.01)
        assert client.get_run(live.run.run_id).info.status == "RUNNING"
        tracked = live.finish(
            epochs=[EpochMetrics(e, {"validation_loss": 0.5 / e}) for e in (1, 2, 3)],
            metrics={"validation_roc_auc": 0.7},
            tags={"data_fingerprint": "f" * 64},
            documents={"result.json": {"epochs": 3}},
            files=[],
            description="trained",
            data=TrainingData("service_v1", "f" * 64, "file:///lake/set.parquet", {"rows": 9}),
        )
    run = client.get_run(tracked.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time >= run.info.start_time
    # The epochs the live logging missed are added, the one it logged is not repeated.
    history = client.get_metric_history(tracked.run_id, "validation_loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 0.5), (2, 0.25), (3, 0.5 / 3)]
    assert "train_loss" not in run.data.metrics  # NaN is never logged
    assert run.data.params == {"optim.lr": "0.01"}
    assert run.data.tags["mlflow.note.content"] == "trained"
    (dataset,) = run.inputs.dataset_inputs
    assert (dataset.dataset.name, dataset.dataset.digest) == ("service_v1", "f" * 36)
    assert {t.key: t.value for t in dataset.tags} == {"mlflow.data.context": "training"}

    with pytest.raises(RuntimeError), tracking.live_run("broken", {}, {}) as failed:
        raise RuntimeError("training failed")
    assert client.get_run(failed.run.run_id).info.status == "FAILED"


def test_runs_left_running_by_killed_trainings_are_ended_and_no_other(registry: MlflowRegistry):
    tracking = registry.for_use_case("abandoned")
    killed = tracking.live_run("killed", {}, {"dagster_run_id": "dead"})
    alive = tracking.live_run("alive", {}, {"dagster_run_id": "alive"})
    elsewhere = tracking.live_run("elsewhere", {}, {})  # no Dagster run named: left alone
    with tracking.live_run("done", {}, {"dagster_run_id": "dead"}) as done:
        done.finish(epochs=[], metrics={}, tags={}, documents={}, files=[])
    assert all(run.run for run in (killed, alive, elsewhere))  # created (by their threads)

    ended = tracking.end_abandoned(lambda dagster_run: dagster_run == "dead")

    assert ended == [killed.run.run_id]
    client = registry.client()
    statuses = {
        run.run.run_id: client.get_run(run.run.run_id).info.status
        for run in (killed, alive, elsewhere, done)
    }
    assert list(statuses.values()) == ["KILLED", "RUNNING", "RUNNING", "FINISHED"]
    assert registry.for_use_case("no_such_experiment").end_abandoned(lambda _: True) == []


def test_versions_registered_from_a_training_run_keep_their_files_apart(
    registry: MlflowRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import mlflow
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["numeric", "axes"], ["score"], keepdims=0)],
        "sum",
        [helper.make_tensor_value_info("numeric", TensorProto.DOUBLE, ["rows", 2])],
        [helper.make_tensor_value_info("score", TensorProto.DOUBLE, ["rows"])],
        [numpy_helper.from_array(np.array([1]), "axes")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    first, second = tmp_path / "first.onnx", tmp_path / "second.onnx"
    onnx.save(model, first)
    second.write_bytes(b"v2")
    with registry.live_run("training", {}, {}) as live:
        training = live.finish(epochs=[], metrics={}, tags={}, documents={}, files=[])
    example = np.array([[1.0, 2.0], [3.0, 4.0]])
    flavour = OnnxFlavour(first, {"numeric": example}, {"score": np.array([3.0, 7.0])})
    one = registry.register(
        "from_training",
        {"model.onnx": first},
        {},
        {"gate_decision": "promote"},
        run_id=training.run_id,
        expected_version="1",
        flavour=flavour,
    )
    two = registry.register("from_training", {"model.onnx": second}, {}, {}, run_id=training.run_id)

    assert one.run_id == two.run_id == training.run_id
    assert (one.folder, two.folder) == ("model/v1", "model/v2")
    assert registry.fetch(two, "model.onnx", tmp_path / "cache").read_bytes() == b"v2"
    assert registry.fetch(one, "model.onnx", tmp_path / "cache").read_bytes() == first.read_bytes()
    client = registry.client()
    run = client.get_run(training.run_id)
    assert run.info.status == "FINISHED"  # registering does not reopen or end it
    assert not [key for key in run.data.tags if key.startswith("sha256.")]
    # The ONNX file is an MLflow model of that run too, linked to its version, which MLflow
    # loads and serves as it was registered.
    model_id = one.tags["mlflow_model"].removeprefix("models:/")
    assert [o.model_id for o in run.outputs.model_outputs] == [model_id]
    logged = client.get_logged_model(model_id)
    assert logged.source_run_id == training.run_id
    assert logged.tags == {"registered_model": "from_training", "version": "1"}
    # Not mlflow.set_tracking_uri: it sets the variable for the rest of the process too.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", registry.tracking_uri)
    served = mlflow.pyfunc.load_model(f"models:/{model_id}")
    assert served.metadata.get_input_schema().input_names() == ["numeric"]
    assert served.predict({"numeric": example})["score"].tolist() == [3.0, 7.0]
    # The version's own folder is that MLflow model as well, every file of it hashed.
    assert {"model.onnx", "MLmodel", "requirements.txt", "input_example.json"} <= set(one.files)
    assert one.sha256 == one.files["model.onnx"] and one.tags["main_file"] == "model.onnx"
    by_version = mlflow.pyfunc.load_model("models:/from_training/1")
    assert by_version.predict({"numeric": example})["score"].tolist() == [3.0, 7.0]
    with pytest.raises(RegistryError, match=r"registered as model\.onnx"):
        registry.register("from_training", {"other.onnx": first}, {}, {}, flavour=flavour)


def test_register_records_files_hashes_and_documents(registry: MlflowRegistry, tmp_path: Path):
    assert registry.next_version("delay_register") == "1"

    first = register(registry, "delay_register", tmp_path, b"onnx v1", expected_version="1")

    assert first.version == "1"
    assert first.sha256 == sha256(b"onnx v1")
    assert set(first.files) == {"model.onnx", "gate_report.json", "metrics.json"}
    assert first.gate_decision == "promote"
    assert first.tags["data_fingerprint"] == "abc123"
    assert first.source.endswith("/model")
    assert first.link.endswith("/#/models/delay_register/versions/1?workflowType=machine_learning")
    client = registry.client()
    run = client.get_run(first.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.tags["sha256.model.onnx"] == first.sha256
    listed = {Path(a.path).name for a in client.list_artifacts(first.run_id, "model")}
    assert listed == {"model.onnx", "gate_report.json", "metrics.json"}
    report = registry.fetch(first, "gate_report.json", tmp_path / "cache")
    assert '"decision": "promote"' in report.read_text()
    assert registry.next_version("delay_register") == "2"

    register(registry, "delay_register", tmp_path, b"onnx v2")

    assert [v.version for v in registry.versions("delay_register")] == ["2", "1"]
    assert registry.versions("never_registered") == []


def test_promote_moves_the_alias_and_rollback_returns_to_a_named_version(
    registry: MlflowRegistry, tmp_path: Path
):
    for content in (b"v1", b"v2"):
        register(registry, "delay_promote", tmp_path, content)
    assert registry.champion("delay_promote") is None

    first = registry.promote("delay_promote", "1", reason="first gate pass")
    second = registry.promote("delay_promote", "2", reason="beats version 1")

    assert (first.previous, first.current, first.changed) == (None, "1", True)
    assert (second.previous, second.current) == ("1", "2")
    champion = registry.champion("delay_promote")
    assert champion is not None and champion.version == "2"
    assert champion.aliases == [CHAMPION]
    assert champion.tags["promoted_from"] == "1"
    assert registry.version("delay_promote", "1").aliases == []  # still registered

    rollback = registry.promote("delay_promote", "1", reason="rollback: v2 misroutes JFK")

    assert (rollback.previous, rollback.current) == ("2", "1")
    rolled_back = registry.champion("delay_promote")
    assert rolled_back is not None and rolled_back.version == "1"
    assert rolled_back.tags["promoted_from"] == "2"
    assert rolled_back.tags["promotion_reason"] == "rollback: v2 misroutes JFK"
    again = registry.promote("delay_promote", "1", reason="click twice")
    assert again.changed is False and "already" in again.reason


def test_refused_promotions_leave_the_champion_alone(registry: MlflowRegistry, tmp_path: Path):
    register(registry, "delay_refuse", tmp_path, b"good")
    register(registry, "delay_refuse", tmp_path, b"worse", gate="reject")
    registry.promote("delay_refuse", "1", reason="gate passed")

    with pytest.raises(RegistryError, match=r"delay_refuse version 2.*'reject'"):
        registry.promote("delay_refuse", "2", reason="try anyway")
    with pytest.raises(RegistryError, match="delay_refuse version 7 does not exist"):
        registry.promote("delay_refuse", "7", reason="typo")
    with pytest.raises(RegistryError, match="not a version number"):
        registry.promote("delay_refuse", "1 ", reason="typo")
    with pytest.raises(RegistryError, match="needs a reason"):
        registry.promote("delay_refuse", "1", reason=" ")

    champion = registry.champion("delay_refuse")
    assert champion is not None and champion.version == "1"
    assert registry.champion("no_such_model") is None
    register(registry, "delay_no_alias", tmp_path, b"x")
    assert registry.champion("delay_no_alias") is None


def test_a_version_without_its_hash_tags_is_not_promoted(registry: MlflowRegistry, tmp_path: Path):
    register(registry, "delay_untagged", tmp_path, b"x")
    registry.client().delete_model_version_tag("delay_untagged", "1", "sha256.model.onnx")

    with pytest.raises(RegistryError, match="sha256 tag is missing"):
        registry.promote("delay_untagged", "1", reason="gate passed")
    assert registry.champion("delay_untagged") is None


def test_fetch_gives_a_verified_copy_and_replaces_a_tampered_one(
    registry: MlflowRegistry, tmp_path: Path
):
    version = register(registry, "delay_fetch", tmp_path, b"weights")
    cache = tmp_path / "cache"

    path = registry.fetch(version, "model.onnx", cache)

    assert path == cache / "delay_fetch" / "1" / "model.onnx"
    assert path.read_bytes() == b"weights"
    path.write_bytes(b"tampered in the cache")
    assert registry.fetch(version, "model.onnx", cache).read_bytes() == b"weights"
    assert sorted(p.name for p in path.parent.iterdir()) == ["model.onnx"]  # no temp folder left
    with pytest.raises(RegistryError, match="no sha256 recorded"):
        registry.fetch(version, "other.onnx", cache)


def test_fetch_refuses_a_tampered_store_and_keeps_nothing(registry: MlflowRegistry, tmp_path: Path):
    version = register(registry, "delay_tamper", tmp_path, b"weights")
    cache = tmp_path / "cache"
    registry.fetch(version, "model.onnx", cache).write_bytes(b"stale cached copy")
    stored_file(version, "model.onnx").write_bytes(b"evil weights")

    with pytest.raises(ModelIntegrityError) as refused:
        registry.fetch(version, "model.onnx", cache)

    assert sha256(b"evil weights") in str(refused.value)
    assert sha256(b"weights") in str(refused.value)
    assert list((cache / "delay_tamper" / "1").iterdir()) == []


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_unsafe_names_are_refused_before_anything_is_written(
    registry: MlflowRegistry, tmp_path: Path, name: str
):
    good = register(registry, "delay_names", tmp_path / "good", b"x")
    onnx = tmp_path / "model.onnx"
    onnx.write_bytes(b"x")
    client = registry.client()
    experiment_id = registry.experiment_id(client)
    runs_before = len(client.search_runs([experiment_id], max_results=1000))
    upcoming = registry.next_version("delay_names")

    with pytest.raises(RegistryError, match="not a safe path component"):
        registry.register("delay_names", {name: onnx}, {}, {}, run_name="bad file")
    with pytest.raises(RegistryError, match="not a safe path component"):
        registry.register(
            "delay_names", {"model.onnx": onnx}, {name: {}}, {}, run_name="bad document"
        )
    with pytest.raises(RegistryError, match="not a safe path component"):
        registry.register(name, {"model.onnx": onnx}, {}, {}, run_name="bad model")
    cache = tmp_path / "cache"
    with pytest.raises(RegistryError, match="not a safe path component"):
        registry.fetch(good, name, cache)
    forged = ModelVersion(**{**good.__dict__, "name": name})
    with pytest.raises(RegistryError, match="not a safe path component"):
        registry.fetch(forged, "model.onnx", cache)

    assert not cache.exists()
    assert len(client.search_runs([experiment_id], max_results=1000)) == runs_before
    assert registry.next_version("delay_names") == upcoming


def test_a_version_number_other_than_the_stamped_one_is_refused(
    registry: MlflowRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    with pytest.raises(RegistryError, match=r"expected to register version 2.*next version is 1"):
        register(registry, "delay_expected", tmp_path, b"x", expected_version="2")
    assert registry.next_version("delay_expected") == "1"
    register(registry, "delay_expected", tmp_path, b"v1", expected_version="1")

    # Another registration between next_version and register: MLflow assigns 2, not 1.
    monkeypatch.setattr(MlflowRegistry, "next_version", lambda self, model_name: "1")
    with pytest.raises(RegistryError, match=r"assigned version 2.*carry version 1"):
        register(registry, "delay_expected", tmp_path, b"v1 again", expected_version="1")
    monkeypatch.undo()

    assert registry.next_version("delay_expected") == "3"
    orphan = registry.version("delay_expected", "2")
    assert registry.client().get_run(orphan.run_id).info.status == "FAILED"
    with pytest.raises(RegistryError, match="assigned version 2"):
        registry.promote("delay_expected", "2", reason="gate passed")


@pytest.fixture
def postgres_registry(tmp_path: Path) -> Iterator[MlflowRegistry]:
    psycopg2 = pytest.importorskip("psycopg2")
    try:
        admin = psycopg2.connect(dbname="postgres", connect_timeout=3, **POSTGRES)
    except psycopg2.OperationalError as error:
        pytest.skip(f"PostgreSQL at {POSTGRES['host']}:{POSTGRES['port']} unreachable: {error}")
    admin.autocommit = True
    database = f"mlflow_test_{secrets.token_hex(6)}"
    with admin.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {database}")
    try:
        yield MlflowRegistry(
            tracking_uri=f"postgresql://postgres@127.0.0.1:5432/{database}",
            artifact_root=(tmp_path / "artifacts").as_uri(),
        )
    finally:
        # MLflow keeps a pooled engine per URI; FORCE ends its connections (PostgreSQL 13+).
        with admin.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
        admin.close()


def test_register_promote_and_fetch_on_postgresql(
    postgres_registry: MlflowRegistry, tmp_path: Path
):
    registry = postgres_registry
    assert registry.next_version("delay_pg") == "1"
    register(registry, "delay_pg", tmp_path, b"pg v1", expected_version="1")
    register(registry, "delay_pg", tmp_path, b"pg v2", expected_version="2")
    register(registry, "delay_pg", tmp_path, b"pg v3", gate="reject")

    registry.promote("delay_pg", "1", reason="first")
    promotion = registry.promote("delay_pg", "2", reason="better")
    with pytest.raises(RegistryError, match="'reject'"):
        registry.promote("delay_pg", "3", reason="try anyway")

    assert (promotion.previous, promotion.current) == ("1", "2")
    champion = registry.champion("delay_pg")
    assert champion is not None and champion.version == "2"
    assert registry.champion("no_such_model") is None
    path = registry.fetch(champion, "model.onnx", tmp_path / "cache")
    assert path.read_bytes() == b"pg v2"
    assert [v.version for v in registry.versions("delay_pg")] == ["3", "2", "1"]
    registry.promote("delay_pg", "1", reason="rollback")
    rolled_back = registry.champion("delay_pg")
    assert rolled_back is not None and rolled_back.tags["promoted_from"] == "2"
