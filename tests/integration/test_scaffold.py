"""`python -m cli.scaffold` lays out a use case that runs as it is: a sample of events made
here (seeded; epoch-second timestamps on purpose, local days in Chicago) is scaffolded into a
temporary project, the generated package is imported from there, and its declaration is taken
through the generic stages as `make run` takes it: the Feast registry, every day's
`daily_partition`, a training set over the declared split, a small model through the gate, and a
day scored by the champion. Two samples: one row per customer and day, and event data (many
ratings per user a day, some a second apart or in the same second, days without any, an item id
column).

The command line's refusals are unit tests (tests/unit/test_scaffold.py)."""

import contextlib
import datetime as dt
import importlib.util
import io
import json
import shutil
import subprocess
import sys
import zoneinfo
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import numpy as np
import pandas as pd
import pytest

from assets import asset_key
from assets.ingestion import source_key
from cli import scaffold
from declare import UseCase
from declare.feast_names import FeastNames
from ml.parts import TrainingSetFiles
from pipelines.definitions import definitions, local_resources
from pipelines.settings import Settings
from resources.expectations import GreatExpectations
from resources.feast_names import names_of, parse
from resources.feature_store import FeastFeatureStore
from resources.launchers import LocalTorchrun
from resources.registry import MlflowRegistry
from tests.samples import DAYS, EMPTY_DAYS, FIRST, TIMEZONE, write_events

# The first test on each lifecycle fixture carries its build: a use case through every stage, a
# few minutes on a quiet 2-core machine, several times that on a busy one.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
NAME = "churn_sample"
"""A name no real use case has: the generated package is put in `sys.modules` under it."""
ENTITIES = 25
QUIET = {"loggers": {"console": {"config": {"log_level": "ERROR"}}}}
TRAIN = {"optim": {"max_epochs": 3, "batch_size": 64}}
# A few hundred rows cannot clear the production floor; the test is about mechanics.
LENIENT = {"min_roc_auc": 0.5, "max_calibration_error": 0.5}
HEAVY = ("pandas", "numpy", "feast", "torch", "great_expectations", "duckdb")


def write_sample(path: Path, days: int = DAYS) -> Path:
    """One row per customer and day at a random local hour; `churned` depends on the row's
    `amount` and `plan` and on the customer's own propensity, which only their history shows."""
    rng = np.random.default_rng(2024)
    zone = zoneinfo.ZoneInfo(TIMEZONE)
    propensity = rng.normal(0, 1.5, ENTITIES)
    rows = []
    for offset in range(days):
        day = FIRST + dt.timedelta(days=offset)
        for entity in range(ENTITIES):
            hour, minute = int(rng.integers(0, 24)), int(rng.integers(0, 60))
            at = dt.datetime(day.year, day.month, day.day, hour, minute, tzinfo=zone)
            amount = float(rng.gamma(2.0, 30.0))
            plan = str(rng.choice(["basic", "plus", "pro"]))
            score = 0.04 * (amount - 60) + (plan == "pro") * 1.5 + propensity[entity]
            rows.append(
                {
                    "customer_id": 100 + entity,
                    "ts": int(at.timestamp()),
                    "amount": round(amount, 2) if rng.random() > 0.03 else None,
                    "plan": plan,
                    "visits": int(rng.poisson(3)),
                    "churned": int(rng.random() < 1 / (1 + np.exp(-score))),
                }
            )
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


EVENT_NAME = "ratings_sample"


def run_scaffold(*argv: str) -> str:
    """The command's printed summary."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert scaffold.main(list(argv)) == 0
    return out.getvalue()


def ruff(*argv: str) -> subprocess.CompletedProcess:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    assert found, "ruff is a dev dependency of the project"
    config = ["--config", str(REPO / "pyproject.toml")]
    return subprocess.run([found, *argv[:1], *config, *argv[1:]], capture_output=True, text=True)


def import_use_case(root: Path, name: str) -> UseCase:
    """The generated package, imported from `root` as `usecases.<name>` (so that its builders'
    lazy `from usecases.<name> import features` finds it)."""
    folder = root / "usecases" / name
    spec = importlib.util.spec_from_file_location(
        f"usecases.{name}", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.USE_CASE


def forget(name: str) -> None:
    for module in [m for m in sys.modules if m.split(".")[:2] == ["usecases", name]]:
        del sys.modules[module]


@dataclass
class Project:
    name: str
    root: Path
    home: Path
    summary: str
    case: UseCase
    defs: dg.Definitions
    instance: dg.DagsterInstance
    runs: dict[str, dg.ExecuteInProcessResult]

    def run(self, job: str, partition: str | None = None, ops: dict | None = None):
        config = {
            asset_key(self.case, op).to_python_identifier(): c for op, c in (ops or {}).items()
        }
        result = self.defs.resolve_job_def(self.case.name_for(job)).execute_in_process(
            instance=self.instance,
            partition_key=partition,
            run_config={**QUIET, "ops": config},
            raise_on_error=False,
        )
        self.runs[f"{job}:{partition}"] = result
        return result

    def lake(self, asset: str, day: dt.date) -> pd.DataFrame:
        return pd.read_parquet(
            self.home / "lake" / self.name / asset / f"{day.isoformat()}.parquet"
        )


def metadata(result: dg.ExecuteInProcessResult, case: UseCase, asset: str) -> dict:
    for event in result.get_asset_materialization_events():
        materialization = event.step_materialization_data.materialization
        if materialization.asset_key == asset_key(case, asset):
            return {k: getattr(v, "value", v) for k, v in materialization.metadata.items()}
    raise KeyError(asset)


def new_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project folder with the registry of use cases, and nothing else."""
    root = tmp_path_factory.mktemp("project")
    (root / "usecases").mkdir()
    shutil.copyfile(REPO / "usecases" / "__init__.py", root / "usecases" / "__init__.py")
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = new_project(tmp_path_factory)
    sample = write_sample(root / "customer_events.csv")
    yield from lifecycle(root, NAME, sample, "customer_id", "churned")


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    root = new_project(tmp_path_factory)
    sample = write_events(root / "ratings.csv")
    yield from lifecycle(root, EVENT_NAME, sample, "user_id", "liked")


def lifecycle(root: Path, name: str, sample: Path, entity: str, label: str) -> Iterator[Project]:
    """Use case `name` scaffolded from `sample` (a binary label, times in `ts`) and taken through
    every stage as `make run` takes it, with no edit: every day of its drops, the declared split,
    the model, the first test day scored."""
    summary = run_scaffold(
        *(name, "--data", str(sample), "--entity", entity, "--timestamp", "ts"),
        *("--label", label, "--task", "binary", "--timezone", TIMEZONE),
        *("--root", str(root), "--write-drops"),
    )
    case = import_use_case(root, name)
    home = root / "home"
    resources = local_resources(Settings(home=home))
    resources[source_key(case)] = case.source()  # the declaration's own drop folder
    resources["feature_store"] = FeastFeatureStore(
        repo_path=str(root / "feature_repo"), home=str(home)
    )
    resources["expectations"] = GreatExpectations(
        data_docs_dir=str(home / "docs"), build_data_docs=False
    )
    resources["launcher"] = LocalTorchrun(output_root=str(home / "models"), processes=1)
    assert isinstance(resources["mlflow"], MlflowRegistry)
    (home / "dagster_home").mkdir(parents=True)
    shutil.copyfile(REPO / "deploy" / "dagster.local.yaml", home / "dagster_home" / "dagster.yaml")
    try:
        with dg.DagsterInstance.from_config(str(home / "dagster_home")) as instance:
            defs = definitions(resources, use_cases=(case,))
            project = Project(name, root, home, summary, case, defs, instance, {})
            assert project.run("apply_feature_registry").success
            for offset in range(DAYS):
                day = (FIRST + dt.timedelta(days=offset)).isoformat()
                assert project.run("daily_partition", day).success, day
            window = {"config": dict(case.window.default)}
            assert project.run("build_training_set", ops={"training_set": window}).success
            project.run(
                "train_model",
                ops={"trained_model": {"config": TRAIN}, "model_evaluation": {"config": LENIENT}},
            )
            project.run("score_day", case.window.default["test_start"])
            yield project
    finally:
        forget(name)


def test_the_summary_lists_the_files_a_use_case_touches_and_what_to_do_next(project: Project):
    summary = project.summary
    files = [f.format(name=NAME) for f in scaffold.FILES]
    assert f"{len(files)} files:" in summary
    for file in files:
        assert file in summary
        assert (project.root / file).is_file()
    assert f"make run USE_CASE={NAME}" in summary and "make dev" in summary
    registry = (project.root / "usecases" / "__init__.py").read_text()
    assert f"from usecases.{NAME} import USE_CASE as {NAME.upper()}\n" in registry
    cases = registry.split("USE_CASES: tuple[UseCase, ...] = (", 1)[1].split(")", 1)[0]
    assert [entry.strip() for entry in cases.split(",") if entry.strip()][-1] == NAME.upper()


def python_files(root: Path, name: str, files: tuple[str, ...] = scaffold.FILES) -> list[str]:
    return [str(root / f.format(name=name)) for f in files if f.endswith(".py")]


def test_the_generated_code_passes_ruff_and_loads_without_heavy_imports(project: Project):
    files = python_files(project.root, NAME)
    checked = ruff("check", *files)
    assert checked.returncode == 0, checked.stdout
    formatted = ruff("format", "--check", *files)
    assert formatted.returncode == 0, formatted.stdout + formatted.stderr
    probe = (
        "import importlib.util, json, sys;"
        f"folder = {str(project.root / 'usecases' / NAME)!r};"
        f"spec = importlib.util.spec_from_file_location('usecases.{NAME}',"
        " folder + '/__init__.py', submodule_search_locations=[folder]);"
        "module = importlib.util.module_from_spec(spec); sys.modules[spec.name] = module;"
        "spec.loader.exec_module(module);"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=REPO
    ).stdout
    assert json.loads(out.strip().splitlines()[-1]) == []


def test_the_names_file_is_what_the_generated_feast_module_declares(project: Project):
    repo = project.root / "feature_repo" / NAME
    assert FeastNames.read(repo) == names_of(parse(repo))
    assert f"{NAME}_v1" in FeastNames.read(repo).feature_services


def test_the_declaration_is_inferred_from_the_sample(project: Project):
    case = project.case
    last = FIRST + dt.timedelta(days=DAYS - 1)
    assert (case.partitions.start, case.partitions.end) == (
        FIRST.isoformat(),
        (last + dt.timedelta(days=1)).isoformat(),
    )
    assert case.timezone == TIMEZONE
    assert case.feature_service == f"{NAME}_v1" and case.registered_model == NAME
    assert (case.label.column, case.label.task) == ("churned", "binary")
    # The last third of the days (8), split 70/15/15: 5 train, 1 validation, 2 test days.
    assert dict(case.window.default) == {
        "start": "2024-03-17",
        "validation_start": "2024-03-22",
        "test_start": "2024-03-23",
        "end": "2024-03-25",
    }
    (table,) = case.event_tables
    rules = {rule.column: rule for rule in table.contract.columns}
    assert {c: r.kind for c, r in rules.items()} == {
        "customer_id": "number", "ts": "timestamp", "amount": "number", "plan": "text",
        "visits": "number", "churned": "number",
    }  # fmt: skip
    assert not rules["amount"].required and rules["plan"].required  # the sample misses amounts
    assert rules["amount"].min_value is None  # observed ranges are comments, not rules
    assert table.contract.natural_key == ("customer_id",) and table.contract.event_time == "ts"
    drop = pd.read_csv(project.root / "usecases" / NAME / "drops" / table.name / "2024-03-10.csv")
    assert len(drop) == ENTITIES and drop["ts"].str.endswith("Z").all()


def test_every_stage_ran_from_ingestion_to_the_scored_day(project: Project):
    assert failures(project) == {}
    day = FIRST + dt.timedelta(days=DAYS - 1)
    daily = project.runs[f"daily_partition:{day.isoformat()}"]
    done = {
        e.step_materialization_data.materialization.asset_key.path[-1]
        for e in daily.get_asset_materialization_events()
    }
    tables = [t.name for t in project.case.feature_tables]
    assert {f"validated_{project.case.event_tables[0].name}", *tables, "online_features"} <= done


def test_the_entity_history_reads_only_the_days_before(project: Project):
    day = FIRST + dt.timedelta(days=12)
    events = pd.read_csv(project.root / "customer_events.csv")
    local = pd.to_datetime(events["ts"], unit="s", utc=True).dt.tz_convert(TIMEZONE)
    events["day"] = local.dt.date
    (history,) = [t.name for t in project.case.feature_tables if t.name.endswith("_history")]
    table = project.lake(history, day).set_index("customer_id")
    assert len(table) == ENTITIES
    assert (table["event_timestamp"] == pd.Timestamp(day, tz=TIMEZONE).tz_convert("UTC")).all()
    for days in (7, 28):
        window = events[(events["day"] < day) & (events["day"] >= day - dt.timedelta(days=days))]
        per_customer = window.groupby(window["customer_id"].astype(str))["churned"]
        expected = per_customer.mean().reindex(table.index)
        assert (table[f"events_{days}d"] == per_customer.size().reindex(table.index)).all()
        np.testing.assert_allclose(table[f"churned_mean_{days}d"], expected)


def test_the_model_is_gated_registered_and_scores_a_day_by_its_entities(project: Project):
    case = project.case
    trained = project.runs["train_model:None"]
    evaluation = metadata(trained, case, "model_evaluation")
    assert evaluation["decision"] == "promote" and evaluation["champion"] == "none yet"
    checks = {c.check_name: c.passed for c in trained.get_asset_check_evaluations()}
    assert checks and all(checks.values()), checks
    day = case.window.default["test_start"]
    scored = pd.read_parquet(project.home / "lake" / NAME / "batch_predictions" / f"{day}.parquet")
    assert sorted(scored["customer_id"]) == [str(100 + e) for e in range(ENTITIES)]
    assert set(scored["model_version"]) == {"1"}
    assert scored["probability"].between(0, 1).all() and "churned" not in scored.columns


def test_a_regression_with_iso_times_and_another_drop_folder_is_laid_out_clean(tmp_path: Path):
    events = pd.read_csv(write_sample(tmp_path / "sample.csv", days=5))
    times = pd.to_datetime(events["ts"], unit="s", utc=True).dt.tz_convert(TIMEZONE)
    events["ts"] = times.map(lambda t: t.isoformat())
    events.to_csv(tmp_path / "Visits Per Day.csv", index=False)
    summary = run_scaffold(
        *("spend", "--data", str(tmp_path / "Visits Per Day.csv"), "--entity", "customer_id"),
        *("--timestamp", "ts", "--label", "amount", "--task", "regression"),
        *("--root", str(tmp_path), "--drops", str(tmp_path / "elsewhere"), "--write-drops"),
    )
    new = scaffold.FILES[:-1]  # no usecases/__init__.py here to register in
    assert f"{len(new)} files:" in summary and "not registered" in summary
    files = python_files(tmp_path, "spend", new)
    assert ruff("check", *files).returncode == 0
    assert ruff("format", "--check", *files).returncode == 0
    try:
        case = import_use_case(tmp_path, "spend")
        assert case.label.task == "regression" and case.timezone == "UTC"
        assert case.event_tables[0].name == "visits_per_day"
        source = case.source()
        drops = Path(source.root).resolve()  # type: ignore[attr-defined]  # a DropFolderSource
        assert drops == (tmp_path / "elsewhere").resolve()
    finally:
        forget("spend")
    assert "../../elsewhere" in Path(files[0]).read_text()  # relative to the package
    assert len(list((tmp_path / "elsewhere" / "visits_per_day").glob("*.csv"))) == 6


def failures(project: Project) -> dict[str, list[str]]:
    """Each failed run's failed steps and why."""
    return {
        name: [
            f"{event.step_key}: {error.message.strip()}"
            for event in result.all_events
            if (error := getattr(event.event_specific_data, "error", None)) is not None
        ]
        for name, result in project.runs.items()
        if not result.success
    }


def test_event_data_runs_end_to_end_with_no_edit(events: Project):
    assert failures(events) == {}
    for offset in EMPTY_DAYS:  # published empty, not refused
        day = FIRST + dt.timedelta(days=offset)
        assert events.runs[f"daily_partition:{day.isoformat()}"].success
        assert events.lake(f"validated_{events.case.event_tables[0].name}", day).empty
    evaluation = metadata(events.runs["train_model:None"], events.case, "model_evaluation")
    assert evaluation["decision"] == "promote"


def test_event_data_is_declared_as_events_keyed_by_what_tells_them_apart(events: Project):
    (table,) = events.case.event_tables
    assert table.grain == "event"
    assert table.contract.natural_key == ("user_id", "item_id")  # item_id alone repeats
    assert table.contract.min_rows == 0  # the sample has empty days
    features = (events.root / "usecases" / EVENT_NAME / "features.py").read_text()
    assert 'EVENT_COLUMNS = ("user_id", "item_id")' in features
    assert 'EVENT_KEY = "rating_key"' in features
    assert '"item_id": ' not in features  # an identifier, no feature
    feast = (events.root / "feature_repo" / EVENT_NAME / f"{EVENT_NAME}.py").read_text()
    assert 'join_keys=["rating_key"]' in feast and 'Field(name="user_id", dtype=String)' in feast


def test_every_event_is_joined_to_its_own_row_even_in_the_same_second(events: Project):
    stored = events.home / "lake" / EVENT_NAME / "training_set" / "data"
    training = TrainingSetFiles.open(stored).read()
    assert not [c for c in training.columns if c.endswith("__item_id")]
    sample = pd.read_csv(events.root / "ratings.csv")
    sample["rating_key"] = sample["user_id"].astype(str) + ":" + sample["item_id"].astype(str)
    window = events.case.window.default
    local = pd.to_datetime(sample["ts"], unit="s", utc=True).dt.tz_convert(TIMEZONE)
    day = local.dt.strftime("%Y-%m-%d")
    inside = sample[(day >= window["start"]) & (day < window["end"])]
    same_second = inside.duplicated(["user_id", "ts"], keep=False)
    assert same_second.sum() >= 10  # the rows the old shape joined to one another
    joined = training.merge(inside, on="rating_key", validate="one_to_one")
    assert len(joined) == len(training) == len(inside)
    assert (joined["rating_features__price"] == joined["price"]).all()
    assert (joined["rating_features__genre"] == joined["genre"]).all()
    assert (joined["liked_x"] == joined["liked_y"]).all()


def test_the_summary_says_what_it_inferred_and_what_to_declare_instead(events: Project):
    warnings = [line for line in events.summary.splitlines() if line.startswith("Warning: ")]
    assert len(warnings) == 3, warnings
    events_line, empty_line, id_line = warnings
    assert 'a row is an event (grain="event"), told apart by `user_id` and `item_id`' in events_line
    assert events_line.endswith("declare the columns that do: --event-key COL[,COL].")
    assert "3 day(s) of the sample have no row (2024-03-06, 2024-03-14, 2024-03-18)" in empty_line
    assert empty_line.endswith("If a day always has events, declare min_rows=1 there.")
    assert id_line.startswith("Warning: `item_id` reads like an identifier (integers named")
    assert id_line.endswith("declare it one: --as-feature item_id.")


def test_an_identifier_becomes_a_feature_when_declared_one(tmp_path: Path):
    write_events(tmp_path / "ratings.csv", days=4)
    summary = run_scaffold(
        *("rated", "--data", str(tmp_path / "ratings.csv"), "--entity", "user_id"),
        *("--timestamp", "ts", "--label", "liked", "--task", "binary", "--root", str(tmp_path)),
        *("--event-key", "user_id,item_id", "--as-feature", "item_id"),
    )
    features = (tmp_path / "usecases" / "rated" / "features.py").read_text()
    assert '"item_id": "item_id",' in features and "reads like an identifier" not in summary
    assert "(given with --event-key)" in summary and "--event-key COL" not in summary
