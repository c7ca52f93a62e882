"""ml.model: the networks a use case chooses (`model.architecture`), their shapes, shard units,
determinism and ONNX export, and the contract a team's own network is held to before any
process starts."""

import dataclasses
from pathlib import Path

import pandas as pd
import pytest
import tomlkit
import torch

from assets.training import trained_model_config
from benchmarks.training_speed import synthetic_training_set
from declare import Catalog
from ml import export
from ml.config import ModelConfig, TrainConfig, from_args, parser, to_args
from ml.data import Preprocessor
from ml.model import FTTransformer, TabularNet, build_model, check_network, shard_units
from ml.preflight import check
from ml.training_run import plan_training
from tests.unit import team_networks
from usecases import RIDERSHIP
from usecases.models.residual_mlp import ResidualMLP

pytestmark = pytest.mark.unit

TINY = ModelConfig(architecture="ft_transformer", token_dim=8, num_blocks=1, num_heads=2)
TEAM = "tests.unit.team_networks"


def transformer(**fields) -> ModelConfig:
    return dataclasses.replace(TINY, **fields)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return synthetic_training_set(600, seed=3)


@pytest.mark.parametrize(
    ("numeric_width", "cardinalities"), [(6, [3, 5]), (6, []), (0, [3, 5])], ids=str
)
def test_the_transformer_gives_one_output_per_row_or_one_per_class(numeric_width, cardinalities):
    numeric = torch.randn(4, numeric_width)
    categorical = torch.randint(0, 3, (4, len(cardinalities)))
    for outputs, shape in ((1, (4,)), (3, (4, 3))):
        model = build_model(numeric_width, cardinalities, outputs, TINY)
        assert isinstance(model, FTTransformer)
        assert model(numeric, categorical).shape == shape


def test_the_transformer_reads_numbers_then_their_missing_flags_so_an_odd_width_is_refused():
    with pytest.raises(ValueError, match=r"numeric_width=5: .* numbers then one missing flag"):
        build_model(5, [3], 1, TINY)
    model = FTTransformer(4, [], TINY)
    tokens = model.tokenizer(torch.zeros(1, 4), torch.zeros(1, 0, dtype=torch.int64))
    assert tokens.shape == (1, 2, 8)  # one token per number, its flag folded in


def test_the_transformer_grows_to_hundreds_of_millions_of_parameters_nearly_all_in_its_blocks():
    config = transformer(token_dim=1024, num_blocks=12, num_heads=16)
    with torch.device("meta"):  # shapes only: nothing allocated
        model = build_model(40, [20] * 10, 1, config)
    total = sum(p.numel() for p in model.parameters())
    in_blocks = sum(p.numel() for unit in shard_units(model) for p in unit.parameters())
    assert total > 100_000_000
    assert len(shard_units(model)) == 12 and in_blocks / total > 0.99


def test_shard_units_are_blocks_layers_or_what_a_network_names():
    mlp = build_model(4, [3], 1, ModelConfig(hidden_sizes=(8, 4)))
    assert shard_units(mlp) == []  # the root alone
    ft = build_model(4, [3], 1, transformer(num_blocks=2))
    assert shard_units(ft) == list(ft.blocks)  # type: ignore[arg-type]
    blocks = team_networks.Blocks(4, [], 1)
    assert shard_units(blocks) == list(blocks.blocks)
    named = team_networks.ShardUnits(4, [], 1)
    assert shard_units(named) == [named.blocks[0]]
    assert shard_units(team_networks.Linear(4, [], 1)) == []


def steps_from_seed(seed: int) -> dict[str, torch.Tensor]:
    """Three AdamW steps of a transformer with dropout, from `seed`."""
    torch.manual_seed(seed)
    model = build_model(6, [3, 5], 1, transformer(dropout=0.3, attention_dropout=0.3)).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        numeric = torch.randn(16, 6, generator=generator)
        categorical = torch.randint(0, 3, (16, 2), generator=generator)
        label = torch.randint(0, 2, (16,), generator=generator).float()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(numeric, categorical), label
        )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_transformer_trains_deterministically_under_deterministic_algorithms():
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        first, again, other = steps_from_seed(1), steps_from_seed(1), steps_from_seed(2)
    finally:
        torch.use_deterministic_algorithms(was)
    assert all(torch.equal(first[k], again[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


@pytest.mark.parametrize("columns", ["all", "numbers only", "categories only"])
def test_the_transformer_exports_and_passes_parity(frame, columns, tmp_path):
    features = [c for c in frame.columns if "__" in c]
    numbers = [c for c in features if pd.api.types.is_numeric_dtype(frame[c])]
    dropped = {"all": [], "numbers only": sorted(set(features) - set(numbers))}
    frame = frame.drop(columns=dropped.get(columns, numbers))
    preprocessor = Preprocessor.fit(frame[frame["split"] == "train"])
    torch.manual_seed(0)
    model = build_model(
        preprocessor.numeric_width, preprocessor.cardinalities, 1, transformer(num_blocks=2)
    ).eval()
    exported = export.export(model, preprocessor, tmp_path / "model.onnx", {"model_version": "1"})
    report = export.parity(exported.path, model, preprocessor, frame)
    assert report.passed, report.as_dict()


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"token_dim": 10, "num_heads": 4}, r"model.token_dim=10 must be a multiple of"),
        ({"num_blocks": 0}, r"model.num_blocks=0"),
        ({"num_heads": 0}, r"model.num_heads=0"),
        ({"ffn_factor": 0.01}, r"model.ffn_factor=0.01"),
        ({"attention_dropout": 1.0}, r"model.attention_dropout=1.0"),
        ({"architecture": "transformer"}, r"'transformer': must be one of .* or an import path"),
        ({"architecture": "pkg.mod.Class"}, r"`package.module:ClassName`"),
        ({"options": '{"width": 8}'}, r"model.options=.* is for a network given by import path"),
    ],
)
def test_a_model_config_that_cannot_build_is_refused_naming_the_rule(changes, rule):
    with pytest.raises(ValueError, match=rule):
        TrainConfig(model=transformer(**changes))


@pytest.mark.parametrize(
    ("options", "rule"), [("{width: 8}", "is not JSON"), ("[8]", "must be a JSON object")]
)
def test_options_must_be_a_json_object(options, rule):
    with pytest.raises(ValueError, match=rule):
        TrainConfig(model=ModelConfig(architecture=f"{TEAM}:Linear", options=options))


def test_every_model_field_round_trips_through_the_command_line():
    model = transformer(ffn_factor=4 / 3, architecture=f"{TEAM}:Linear", options='{"a": [1, 2]}')
    config = TrainConfig(model=model)
    assert from_args(parser("t").parse_args(to_args(config))) == config
    flags = ["--model.architecture", "ft_transformer", "--model.token_dim", "64"]
    parsed = from_args(parser("t").parse_args(flags)).model
    assert (parsed.architecture, parsed.token_dim, parsed.num_heads) == ("ft_transformer", 64, 8)


def test_a_team_network_is_built_by_the_contract_with_its_options():
    config = ModelConfig(architecture=f"{TEAM}:Linear", options='{"scale": 2}')
    model = build_model(4, [3, 7], 1, config)
    assert isinstance(model, team_networks.Linear)
    assert team_networks.Linear.built_with == {
        "numeric_width": 4,
        "cardinalities": [3, 7],
        "outputs": 1,
        "options": {"scale": 2},
    }
    check_network(config, 4, [3, 7], 1)
    check_network(dataclasses.replace(config, options=""), 4, [3, 7], 5)


@pytest.mark.parametrize(
    ("path", "rule"),
    [
        ("tests.unit.no_such_module:Net", r"the module 'tests.unit.no_such_module' must be impor"),
        (f"{TEAM}:Missing", r"the module '.*team_networks' must define 'Missing'"),
        (f"{TEAM}:NotAModule", r"'NotAModule' must be a subclass of torch.nn.Module"),
        (f"{TEAM}:OwnArguments", r"its constructor must accept the keyword arguments \['card"),
        (f"{TEAM}:KeepsItsColumn", r"shape \(batch,\) .* \(2,\), not \(2, 1\)"),
        (f"{TEAM}:FailsToRun", r"forward\(numeric, categorical\) on a 2-row batch .* raised"),
    ],
)
def test_a_team_network_that_breaks_the_contract_is_refused_naming_path_and_rule(path, rule):
    with pytest.raises(ValueError, match=rule) as refused:
        check_network(ModelConfig(architecture=path), 4, [3, 7], 1)
    assert f"model.architecture={path!r}" in str(refused.value)


def test_a_team_network_with_several_outputs_must_return_one_column_each():
    path = f"{TEAM}:FailsToRun"
    with pytest.raises(ValueError, match=r"raised RuntimeError"):
        check_network(ModelConfig(architecture=path), 4, [3], 3)
    check_network(ModelConfig(architecture=f"{TEAM}:Linear"), 4, [3], 3)  # (2, 3): kept


def training_set(tmp_path: Path, frame: pd.DataFrame) -> Path:
    path = tmp_path / "training_set.parquet"
    frame.to_parquet(path)
    return path


def test_preflight_checks_a_team_network_on_the_training_sets_shapes(frame, tmp_path):
    path = training_set(tmp_path, frame)
    features = [c for c in frame.columns if "__" in c]
    numbers = [c for c in features if pd.api.types.is_numeric_dtype(frame[c])]

    def config(architecture: str) -> TrainConfig:
        return TrainConfig.from_dict(
            {
                "data": {"training_set": str(path), "label": "arrival_delayed"},
                "model": {"architecture": architecture},
                "output_dir": str(tmp_path / "run"),
            }
        )

    check(config(f"{TEAM}:Linear"))
    assert team_networks.Linear.built_with == {
        "numeric_width": 2 * len(numbers),
        "cardinalities": [2] * (len(features) - len(numbers)),
        "outputs": 1,
    }
    with pytest.raises(ValueError, match=r"KeepsItsColumn'.* not \(2, 1\)"):
        check(config(f"{TEAM}:KeepsItsColumn"))
    check(config("ft_transformer"))  # built in: not built here


def test_the_example_network_keeps_the_contract_and_refuses_an_unknown_option():
    path = "usecases.models.residual_mlp:ResidualMLP"
    check_network(ModelConfig(architecture=path, options='{"width": 16}'), 6, [3, 5], 1)
    check_network(ModelConfig(architecture=path), 6, [], 4)
    assert len(shard_units(ResidualMLP(6, [3], 1, {"num_blocks": 3}))) == 3
    with pytest.raises(ValueError, match=r"raised ValueError: unknown option\(s\) \['depth'\]"):
        build_model(6, [3], 1, ModelConfig(architecture=path, options='{"depth": 3}'))


def test_a_use_case_chooses_the_architecture_and_a_run_overrides_it(tmp_path):
    declared = {"model": {"architecture": "ft_transformer", "token_dim": 32, "num_heads": 4}}
    entries = catalog_of(tmp_path / "configs", declared)
    case = dataclasses.replace(RIDERSHIP, configs=entries, config="baseline")
    config_type = trained_model_config(case)

    def settings(**run_config) -> ModelConfig:
        chosen = config_type(**run_config).model_dump()
        return plan_training(case, chosen, tmp_path / "set", tmp_path / "run", "").settings.model

    assert settings() == ModelConfig(architecture="ft_transformer", token_dim=32, num_heads=4)
    overridden = settings(model={"architecture": "mlp", "hidden_sizes": [8]})
    assert (overridden.architecture, overridden.hidden_sizes) == ("mlp", (8,))
    assert overridden.token_dim == 32  # the rest is still the use case's
    assert isinstance(build_model(4, [3], 1, overridden), TabularNet)
    wrong = catalog_of(tmp_path / "wrong", {"model": {"architecture": "resnet"}})
    with pytest.raises(ValueError, match=r"use case 'ridership': configs: .*baseline.*'resnet'"):
        trained_model_config(dataclasses.replace(RIDERSHIP, configs=wrong, config="baseline"))


def catalog_of(folder: Path, baseline: dict) -> Catalog:
    """A catalog of one entry, `baseline`, with the settings `baseline`."""
    folder.mkdir()
    (folder / "baseline.toml").write_text(tomlkit.dumps({"training": baseline}))
    return Catalog(folder)
