"""Lineage of a registered model version, or of one prediction: the chain back to the raw
partitions, their data versions, the feature service, the code commit and the environment lock.

    python -m cli.lineage model [--use-case NAME] [--name MODEL] [--version N] [--json]
    python -m cli.lineage prediction DAY KEY=VALUE [KEY=VALUE ...] [--use-case NAME] [--json]

e.g. `prediction 2013-01-07 customer_id=42` where the FeatureService joins on `customer_id`: a
prediction is found by the values of its row's entity keys (the FeatureService's join keys and
`event_timestamp`, the columns `batch_predictions` keeps), all of them or enough to name one row.

Nothing here is a hand-kept list of what was used. The model version comes from the MLflow
registry (its tags name the Dagster run that registered it, its files' sha256); the run manifest
is the copy registered with the version, fetched sha256-verified; every materialization below
`registered_model` is found in Dagster's event log by walking the asset graph's parents of each
recorded materialization: an unpartitioned parent through the `dagster/input_event_pointer/<key>`
tag Dagster wrote, a partitioned parent as the latest materialization of each mapped partition
recorded before the child's. Dagster also records, per input, one data version for the mapped
partitions together (sha256 of their versions in partition order); where it did, the walk
recomputes it from the partitions it found and marks the input verified or not.

A partitioned parent of an unpartitioned child (the feature tables of `training_set`, which
Dagster maps with "all partitions") is narrowed to the days of the child's `window` metadata.
"""

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli.lineage_document import (
    MANIFEST_FILE,
    NAMED_ASSETS,
    ONNX_FILE,
    Lineage,
    LineageError,
    ModelFacts,
    Prediction,
)
from cli.lineage_walk import data_version_of, registration, walk

# Nothing heavy is imported when this module loads (not `assets` either: the package imports
# Dagster), so that the command can set the garbage collector up first (the end of the file).
if TYPE_CHECKING:
    import dagster as dg
    import pyarrow as pa
    import pyarrow.compute as pc

    from declare import UseCase
    from resources.registry import MlflowRegistry, ModelVersion

PREDICTION_COLUMNS = ("probability", "prediction")
"""The predicted value in a `batch_predictions` file: a probability (binary) or a number."""
OUTPUT_COLUMNS = (*PREDICTION_COLUMNS, "predicted", "model_name", "model_version", "predicted_at")
"""The columns of a `batch_predictions` file that are not the scored row's keys."""
MANIFEST_FIELDS = (
    "git_commit",
    "lock_sha256",
    "seed",
    "world_size",
    "feature_service",
    "data_fingerprint",
    "shards_fingerprint",
    "dagster_run_id",
    "image_tag",
    "python",
    "host",
    "devices",
    "libraries",
    "compatibility",
)
"""The manifest's facts a lineage reports (its training config stays in the registered file)."""


def model_lineage(
    instance: "dg.DagsterInstance",
    defs: "dg.Definitions",
    registry: "MlflowRegistry",
    case: "UseCase",
    version: str | None = None,
    name: str | None = None,
) -> Lineage:
    """The lineage of `case`'s registered model (or the model `name`) version `version` (the
    champion when None), walked through the asset graph of `defs` in `instance`'s event log."""
    from assets import asset_key

    name = name or case.registered_model
    model = _model_version(registry, name, version)
    run_id = model.tags.get("dagster_run_id")
    if not run_id:
        raise LineageError(f"{name} v{model.version}: no dagster_run_id tag; not registered by us")
    start = registration(instance, case, run_id, name, model.version)
    chain = walk(instance, defs.resolve_asset_graph(), [start])
    return Lineage(
        model=_model_facts(model),
        manifest=_manifest(registry, model),
        materializations=chain,
        assets={asset: asset_key(case, asset).to_user_string() for asset in NAMED_ASSETS},
    )


def prediction_lineage(
    instance: "dg.DagsterInstance",
    defs: "dg.Definitions",
    registry: "MlflowRegistry",
    case: "UseCase",
    day: str,
    keys: Mapping[str, str],
) -> Lineage:
    """The lineage of the prediction on `day` whose row has the values `keys` (column → value):
    its row of `case`'s `batch_predictions`, that day's materialization and feature partitions,
    and the model version that scored it."""
    import dagster as dg

    from assets import asset_key

    key = asset_key(case, "batch_predictions")
    asset = key.to_user_string()
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=key, asset_partitions=[day]), limit=1
    ).records
    if not records:
        raise LineageError(f"{asset} has no materialization for day {day!r}")
    record = records[0]
    path_value = record.asset_materialization.metadata.get("path")  # type: ignore[union-attr]
    if path_value is None:
        raise LineageError(f"{asset} {day}: its materialization records no path")
    prediction = read_prediction(
        Path(str(path_value.value)), day, keys, data_version_of(record), asset
    )
    model = model_lineage(
        instance, defs, registry, case, prediction.model_version, prediction.model_name
    )
    day_chain = walk(
        instance, defs.resolve_asset_graph(), [record], stop={asset_key(case, "registered_model")}
    )
    return dataclasses.replace(model, prediction=prediction, prediction_materializations=day_chain)


def _model_version(registry: "MlflowRegistry", name: str, version: str | None) -> "ModelVersion":
    from resources.registry import RegistryError

    try:
        if version is None:
            found = registry.champion(name)
            if found is None:
                raise LineageError(f"{name} has no champion; name a version with --version")
            return found
        return registry.version(name, version)
    except RegistryError as error:
        raise LineageError(str(error)) from error


def _model_facts(model: "ModelVersion") -> ModelFacts:
    from resources.registry import CHAMPION

    return ModelFacts(
        name=model.name,
        version=model.version,
        champion=CHAMPION in model.aliases,
        aliases=list(model.aliases),
        gate_decision=model.gate_decision,
        weights_sha256=model.tags.get("weights_sha256"),
        onnx_sha256=model.files.get(ONNX_FILE),
        manifest_sha256=model.files.get(MANIFEST_FILE),
        registered_by_run=model.tags.get("dagster_run_id"),
        mlflow_training_run=model.tags.get("training_run_id"),
        created_at=model.created_at.isoformat(timespec="seconds"),
        link=model.link,
    )


def _manifest(registry: "MlflowRegistry", model: "ModelVersion") -> dict[str, Any]:
    if MANIFEST_FILE not in model.files:
        raise LineageError(f"{model.name} v{model.version}: no {MANIFEST_FILE} was registered")
    with tempfile.TemporaryDirectory(prefix="lineage-") as cache:
        path = registry.fetch(model, MANIFEST_FILE, Path(cache))  # sha256-verified
        document = json.loads(path.read_text())
    architecture = document["config"]["model"].get("architecture", "mlp")  # mlp before the choice
    return {
        **{k: document[k] for k in MANIFEST_FIELDS if k in document},
        "architecture": architecture,
        "catalog": document["config"].get("catalog"),  # none before the catalog
    }


def read_prediction(
    path: Path,
    day: str,
    keys: Mapping[str, str],
    data_version: str | None,
    asset: str = "batch_predictions",
) -> Prediction:
    """The one row of the predictions file `path` (of `asset` on `day`, recorded with
    `data_version`) whose columns have the values `keys`, each given as text and read as its
    column's type."""
    import pyarrow.parquet as pq

    if not path.is_file():
        raise LineageError(f"{asset} {day}: {path} is gone")
    schema = pq.read_schema(path)
    key_columns = [name for name in schema.names if name not in OUTPUT_COLUMNS]
    wanted = ", ".join(f"{k}={v!r}" for k, v in keys.items())
    if not keys:
        raise LineageError(f"name the prediction by its keys: {', '.join(key_columns)}")
    unknown = [k for k in keys if k not in key_columns]
    if unknown:
        raise LineageError(
            f"{asset} {day}: {unknown} are not key columns of its predictions;"
            f" use {', '.join(key_columns)}"
        )
    rows = pq.read_table(path, filters=_matching(schema, keys)).to_pylist()
    if not rows:
        raise LineageError(f"{asset} {day} has no prediction for {wanted}")
    if len(rows) > 1:
        raise LineageError(
            f"{asset} {day} holds {len(rows)} predictions for {wanted};"
            f" name more of its keys: {', '.join(key_columns)}"
        )
    row = rows[0]
    column = next((c for c in PREDICTION_COLUMNS if c in row), None)
    if column is None:
        raise LineageError(f"{path} has none of the prediction columns {PREDICTION_COLUMNS}")
    with path.open("rb") as source:
        digest = hashlib.file_digest(source, "sha256").hexdigest()
    return Prediction(
        day=day,
        keys=dict(keys),
        column=column,
        value=float(row[column]),
        predicted=bool(row["predicted"]) if "predicted" in row else None,
        model_name=str(row["model_name"]),
        model_version=str(row["model_version"]),
        predicted_at=row["predicted_at"].isoformat(timespec="seconds"),
        file=str(path),
        file_matches_data_version=digest == data_version,
    )


def _matching(schema: "pa.Schema", keys: Mapping[str, str]) -> "pc.Expression | None":
    """The filter of the rows whose columns have the values `keys`, each given as text and read
    as its column's type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    condition = None
    for column, text in keys.items():
        kind = schema.field(column).type
        try:
            value = pa.scalar(text).cast(kind)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            raise LineageError(f"{column}={text!r} is not a value of type {kind}") from None
        test = pc.field(column) == value
        condition = test if condition is None else condition & test
    return condition


def _pair(text: str) -> tuple[str, str]:
    """A `KEY=VALUE` argument."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    return key, value


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m cli.lineage",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print a JSON document")
    parser.add_argument("--use-case", metavar="NAME", help="default: the first declared")
    commands = parser.add_subparsers(dest="command", required=True)
    model = commands.add_parser("model", help="the lineage of a registered model version")
    model.add_argument("--name", help="registered model name (default: the use case's)")
    model.add_argument("--version", help="version number (default: the champion)")
    prediction = commands.add_parser("prediction", help="the lineage of one batch prediction")
    prediction.add_argument("day", help="the batch_predictions partition, YYYY-MM-DD")
    prediction.add_argument(
        "keys", nargs="+", type=_pair, metavar="KEY=VALUE", help="the prediction row's keys"
    )
    for sub in (model, prediction):  # accepted after the command as well
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS)
        sub.add_argument("--use-case", metavar="NAME", default=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    keys = dict(args.keys) if args.command == "prediction" else {}
    if len(keys) < len(getattr(args, "keys", ())):
        parser.error("a key is given twice")

    import dagster as dg

    from cli.run import choose_use_case
    from pipelines.definitions import USE_CASES, defs
    from resources.registry import MlflowRegistry

    try:
        case = choose_use_case(USE_CASES, args.use_case)
    except ValueError as error:
        parser.error(str(error))
    home = os.environ.get("DAGSTER_HOME")
    if not home:
        sys.stderr.write(
            "lineage: DAGSTER_HOME is not set: `make lineage` sets it to this checkout's"
            " instance; elsewhere, set it to the folder of the Dagster instance to read\n"
        )
        return 2
    if not Path(home).is_dir():
        sys.stderr.write(f"lineage: DAGSTER_HOME={home} is not the folder of a Dagster instance\n")
        return 2
    registry = (defs.resources or {}).get("mlflow")
    if not isinstance(registry, MlflowRegistry):
        sys.stderr.write("lineage: the definitions have no MLflow registry (resource `mlflow`)\n")
        return 2
    try:
        with (
            dg.DagsterInstance.get() as instance,
            # Its EnvVar settings, read now; on the open instance (alone, it would start an
            # ephemeral one: a second or more).
            dg.build_resources({"mlflow": registry}, instance=instance) as resources,
        ):
            registry = resources.mlflow
            if args.command == "model":
                lineage = model_lineage(instance, defs, registry, case, args.version, args.name)
            else:
                lineage = prediction_lineage(instance, defs, registry, case, args.day, keys)
    except LineageError as error:
        sys.stderr.write(f"lineage: {error}\n")
        return 2
    if args.json:
        sys.stdout.write(json.dumps(lineage.to_dict(), indent=2, default=str) + "\n")
    else:
        sys.stdout.write(lineage.render())
    return 0


if __name__ == "__main__":
    # A one-shot command. Dagster's and MLflow's imports create ~400,000 objects that live until
    # exit; with the cyclic collector on, Python scans them ~1,000 times while they load and again
    # at exit: 3 s of CPU in a 7 s lineage. What the command creates and drops is freed by
    # reference counting. Frozen, the objects are skipped by the collections at exit.
    gc.disable()
    try:
        sys.exit(main())
    finally:
        gc.freeze()
