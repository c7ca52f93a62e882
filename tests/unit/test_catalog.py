"""A use case's catalog of named training configurations (`declare.catalog`, `ml.catalog`): what
an entry resolves to and the sha256 that names it, a run's settings from the entry it names, the
entries a tool writes, and the refusals of a wrong entry or name."""

import dataclasses
from pathlib import Path

import pytest
import tomlkit

from assets.training import trained_model_config
from declare import BASELINE, Catalog, CatalogError, DeclarationError, NamedConfig
from ml.catalog import entry_settings, resolve, save, settings_sha256
from ml.config import TrainConfig
from ml.training_run import plan_training
from usecases import FLIGHTS, RIDERSHIP

pytestmark = pytest.mark.unit
WIDE = {"model": {"hidden_sizes": [256, 128]}, "optim": {"lr": 0.001}}


def catalog(folder: Path, **entries: dict) -> Catalog:
    """A catalog in `folder` of `baseline` (the generic defaults) and `entries` (name: training)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, training in {BASELINE: {}, **entries}.items():
        (folder / f"{name}.toml").write_text(tomlkit.dumps({"training": training}))
    return Catalog(folder)


def launchpad(case_catalog: Catalog, **run_config) -> dict:
    """What the launchpad hands the asset: every setting, the default entry's unless given."""
    case = dataclasses.replace(FLIGHTS, configs=case_catalog)
    return trained_model_config(case)(**run_config).model_dump()


def test_the_bundled_use_cases_train_the_entry_they_name_by_default():
    """The flights train `baseline`; the ridership `week_residual`: `baseline`'s settings,
    correcting the week-ago forecast (`model.offset`)."""
    assert (FLIGHTS.config, RIDERSHIP.config) == (BASELINE, "week_residual")
    for case in (FLIGHTS, RIDERSHIP):
        assert {BASELINE, case.config} <= set(case.configs.names())
        settings = entry_settings(case.configs.entry(case.config))
        assert settings.catalog.name == case.config
        assert settings.catalog.sha256 == settings_sha256(settings)
    ridership = entry_settings(RIDERSHIP.configs.entry("week_residual"))
    assert (ridership.optim.batch_size, ridership.optim.max_epochs) == (32, 200)
    assert ridership.model.offset == RIDERSHIP.baseline
    plain = entry_settings(RIDERSHIP.configs.entry(BASELINE))
    assert plain.model.offset == "" and plain.optim == ridership.optim
    # The launchpad's default is the use case's entry: what the nightly retrain trains.
    chosen = trained_model_config(RIDERSHIP)().model_dump()
    assert chosen["catalog"] == {"name": "week_residual"}
    assert resolve(RIDERSHIP.configs, RIDERSHIP.config, chosen) == ridership


def test_the_hash_names_what_an_entry_trains_with_not_how_its_file_is_written(tmp_path):
    a = entry_settings(NamedConfig("a", {"optim": {"lr": 0.003}}, description="as the default"))
    b = entry_settings(NamedConfig("b", {}))
    c = entry_settings(NamedConfig("c", {"optim": {"lr": 0.002}}))
    assert a.catalog.sha256 == b.catalog.sha256  # 0.003 is the default: the same training
    assert c.catalog.sha256 != b.catalog.sha256
    # The run's own input, folder and label are not the entry's.
    elsewhere = dataclasses.replace(
        b, output_dir="/elsewhere", data=dataclasses.replace(b.data, training_set="x.parquet")
    )
    assert settings_sha256(elsewhere) == b.catalog.sha256


def test_a_run_naming_an_entry_trains_it_with_the_changes_it_makes(tmp_path):
    entries = catalog(tmp_path, wide=WIDE)

    named = resolve(entries, BASELINE, launchpad(entries, catalog={"name": "wide"}))
    assert (named.model.hidden_sizes, named.optim.lr) == ((256, 128), 0.001)
    assert named.catalog.name == "wide" and named.catalog.overridden == ()
    assert named.catalog.sha256 == entry_settings(entries.entry("wide")).catalog.sha256

    changed = launchpad(entries, catalog={"name": "wide"}, optim={"lr": 0.01, "max_epochs": 5})
    settings = resolve(entries, BASELINE, changed)
    assert (settings.model.hidden_sizes, settings.optim.lr, settings.optim.max_epochs) == (
        (256, 128),
        0.01,
        5,
    )
    assert settings.catalog.overridden == ("optim.lr", "optim.max_epochs")
    assert settings.catalog.sha256 == named.catalog.sha256  # the entry's, the changes listed

    default = resolve(entries, BASELINE, launchpad(entries, optim={"batch_size": 64}))
    assert default.catalog == dataclasses.replace(
        entry_settings(entries.entry(BASELINE)).catalog, overridden=("optim.batch_size",)
    )


def test_the_plan_records_the_entry_in_the_mlflow_tags_and_sets_what_the_use_case_declares(
    tmp_path,
):
    entries = catalog(tmp_path / "configs", wide=WIDE)
    case = dataclasses.replace(RIDERSHIP, configs=entries, config=BASELINE)
    chosen = trained_model_config(case)(catalog={"name": "wide"}).model_dump()
    plan = plan_training(case, chosen, tmp_path / "set.parquet", tmp_path / "run", "")

    sha = entry_settings(entries.entry("wide")).catalog.sha256
    assert plan.tags()["config"] == f"wide@{sha[:12]}"
    assert plan.tags()["config_overridden"] == "none"
    assert plan.params()["catalog.sha256"] == sha
    assert plan.settings.data.label == RIDERSHIP.label.column
    assert plan.settings.output_dir == str(tmp_path / "run")


def test_an_unknown_entry_is_refused_naming_those_there_are(tmp_path):
    entries = catalog(tmp_path, wide=WIDE)
    there_are = r"no such catalog entry; there are \['baseline', 'wide'\]"
    with pytest.raises(CatalogError, match=there_are):
        resolve(entries, BASELINE, launchpad(entries, catalog={"name": "wdie"}))
    with pytest.raises(DeclarationError, match=r"'flights': config: 'wdie' is no catalog entry"):
        dataclasses.replace(FLIGHTS, configs=entries, config="wdie")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("training = [1, 2]\n", r"training must be a table"),
        ("[trainig]\n", r"unknown key\(s\) \['trainig'\]"),
        ("[training.optim]\nlr = [\n", r"not TOML"),
    ],
)
def test_a_malformed_entry_is_refused_when_the_use_case_is_declared(tmp_path, text, problem):
    entries = catalog(tmp_path)
    (tmp_path / "broken.toml").write_text(text)
    with pytest.raises(DeclarationError, match=rf"'flights': configs: .*broken.toml: {problem}"):
        dataclasses.replace(FLIGHTS, configs=entries)


def test_settings_the_config_refuses_are_refused_as_the_definitions_load(tmp_path):
    entries = catalog(tmp_path, fast={"optim": {"lr": -1}})
    case = dataclasses.replace(FLIGHTS, configs=entries)  # the declaration reads: YAML is fine
    with pytest.raises(ValueError, match=r"'flights': configs: .*'fast': .*optim.lr=-1"):
        trained_model_config(case)


def test_a_catalog_without_baseline_is_refused(tmp_path):
    (tmp_path / "wide.toml").write_text(tomlkit.dumps({"training": WIDE}))
    with pytest.raises(DeclarationError, match=r"configs: has no 'baseline' entry: \['wide'\]"):
        dataclasses.replace(FLIGHTS, configs=Catalog(tmp_path), config="wide")


def test_a_written_entry_reads_back_with_its_origin_and_is_never_replaced(tmp_path):
    entries = catalog(tmp_path)
    origin = {"study": "flights-2026-12-05", "trial": 7, "value": 0.4321}
    entry = NamedConfig("tuned", WIDE, description="best of a study", origin=origin)

    path = save(entries, entry, 0o644)

    assert path == tmp_path / "tuned.toml" and path.stat().st_mode & 0o777 == 0o644
    read = entries.entry("tuned")
    assert (dict(read.origin), read.description) == (origin, "best of a study")
    assert entry_settings(read).catalog.sha256 == entry_settings(entry).catalog.sha256
    with pytest.raises(CatalogError, match=r"tuned.toml: exists; .* never replaced"):
        save(entries, dataclasses.replace(entry, training={}), 0o644)
    assert entries.entry("tuned").training == WIDE  # untouched
    with pytest.raises(CatalogError, match=r"optim.lr=0"):
        save(entries, NamedConfig("broken", {"optim": {"lr": 0}}), 0o644)
    assert not (tmp_path / "broken.toml").exists()
    with pytest.raises(CatalogError, match=r"'Tuned 2': an entry's name must match"):
        save(entries, NamedConfig("Tuned 2"), 0o644)


def test_without_a_folder_the_catalog_is_baseline_the_generic_defaults():
    entry = Catalog().entry(BASELINE)
    assert entry_settings(entry).model == TrainConfig().model
    with pytest.raises(CatalogError, match=r"no catalog folder"):
        save(Catalog(), NamedConfig("tuned"), 0o644)
