"""The training core as plain functions: config, preprocessing, sharding, the model."""

import json
import re

import numpy as np
import pandas as pd
import pytest
import torch

from ml.config import ModelConfig, TrainConfig, from_args, parser
from ml.data import UNKNOWN, Preprocessor, Shards, TargetScaler
from ml.model import TabularNet
from ml.task import BINARY, REGRESSION

pytestmark = pytest.mark.unit


def frame(carriers, temps, labels) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "flight_id": [f"f{i}" for i in range(len(labels))],
            "flight_schedule__carrier_code": pd.array(carriers, dtype="string"),
            "origin_weather__temp_f": temps,
            "arrival_delayed": labels,
        }
    )


def test_the_command_line_and_the_nested_dict_build_the_same_validated_config():
    args = parser("train").parse_args(["--optim.lr", "0.01", "--model.hidden_sizes", "32,8"])
    config = from_args(args)
    assert config.optim.lr == 0.01 and config.model.hidden_sizes == (32, 8)
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert "--process_group_timeout_s" in parser("train").format_help()


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"optim": {"lr": 0.0}}, "optim.lr=0.0"),
        ({"model": {"dropout": 1.5}}, "model.dropout=1.5"),
        ({"optim": {"batchsize": 3}}, "unknown field(s) ['optim.batchsize']"),
        ({"data": {"task": "ranking"}}, "data.task='ranking': must be one of"),
    ],
)
def test_a_bad_config_is_refused_naming_the_field(values, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        TrainConfig.from_dict(values)


def test_preprocessing_is_fitted_on_train_only_and_maps_unseen_values_to_unknown():
    train = frame(["AA", "UA", "AA", None], [10.0, 20.0, np.nan, 30.0], [0, 1, 0, 1])
    fitted = Preprocessor.fit(train)
    assert fitted.categorical == ["flight_schedule__carrier_code"]
    assert fitted.vocabularies == [["AA", "UA"]] and fitted.cardinalities == [3]
    assert fitted.mean == [20.0]

    later = fitted.transform(
        frame(["UA", "ZZ", None], [20.0, np.nan, 40.0], [1, 0, 1]), "arrival_delayed"
    )
    assert later.categorical[:, 0].tolist() == [2, UNKNOWN, UNKNOWN]
    scaled, absent = later.numeric[:, 0], later.numeric[:, 1]
    assert scaled.tolist()[0] == 0.0 and absent.tolist() == [0.0, 1.0, 0.0]
    assert scaled[2].item() == pytest.approx(20.0 / np.std([10.0, 20.0, 30.0]))
    # Row-major: a batch gather reads each row in one place; onnxruntime takes it without a copy.
    assert later.numeric.is_contiguous() and later.categorical.is_contiguous()
    assert Preprocessor.from_json(fitted.to_json()) == fitted


def test_a_regression_label_is_standardized_with_the_train_splits_mean_and_std():
    train = frame(["AA", "UA", "AA", "UA"], [1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 30.0, 40.0])
    fitted = Preprocessor.fit(train, standardized_label="arrival_delayed")
    assert fitted.task == REGRESSION and Preprocessor.fit(train).task == BINARY
    assert fitted.target == TargetScaler(mean=25.0, std=float(np.std([10, 20, 30, 40])))
    later = fitted.transform(frame(["AA"], [1.0], [35.0]), "arrival_delayed")
    assert later.label.dtype == torch.float32
    assert later.label.item() == pytest.approx(10.0 / fitted.target.std)
    assert Preprocessor.from_json(fitted.to_json()) == fitted
    assert "target" not in json.loads(Preprocessor.fit(train).to_json())  # binary files as before
    constant = Preprocessor.fit(train.assign(arrival_delayed=7.0), "arrival_delayed")
    assert constant.target == TargetScaler(mean=7.0, std=1.0)


def test_a_missing_or_infinite_regression_label_is_refused_by_name():
    train = frame(["AA", "UA"], [1.0, 2.0], [10.0, 20.0])
    fitted = Preprocessor.fit(train, standardized_label="arrival_delayed")
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"1 value\(s\) of the label column 'arrival_delayed'"):
            fitted.transform(frame(["AA", "UA"], [1.0, 2.0], [bad, 3.0]), "arrival_delayed")
    with pytest.raises(ValueError, match="lacks the label column 'y'"):
        Preprocessor.fit(train, standardized_label="y")


def test_a_missing_feature_column_is_refused_by_name():
    fitted = Preprocessor.fit(frame(["AA"], [1.0], [0]))
    with pytest.raises(ValueError, match="origin_weather__temp_f"):
        fitted.transform(
            frame(["AA"], [1.0], [0]).drop(columns="origin_weather__temp_f"), "arrival_delayed"
        )


def test_shards_cover_every_row_each_epoch_in_global_batches_reproducibly():
    shards = Shards(rows=10, global_batch_size=6, seed=7)
    epoch0 = [shards.indices(rank, 3, 0) for rank in range(3)]
    assert {len(s) for s in epoch0} == {4}  # 10 rows wrapped to 2 global batches of 6
    assert set(torch.cat(epoch0).tolist()) == set(range(10))
    assert not torch.equal(shards.indices(0, 3, 0), shards.indices(0, 3, 1))
    assert (
        shards.fingerprint(2) == Shards(10, 6, 7).fingerprint(2) != Shards(10, 6, 8).fingerprint(2)
    )
    with pytest.raises(ValueError, match="rank 3"):
        shards.indices(3, 3, 0)
    with pytest.raises(ValueError, match="6 rows does not divide over 4 ranks"):
        shards.indices(0, 4, 0)


def test_every_world_size_trains_the_same_global_batches():
    shards = Shards(rows=50, global_batch_size=12, seed=1)
    for world_size in (1, 2, 3, 4, 6):
        per_rank = [
            shards.indices(r, world_size, 2).view(-1, 12 // world_size) for r in range(world_size)
        ]
        for step, batch in enumerate(shards.order(2).view(-1, 12)):
            rows = torch.cat([rank[step] for rank in per_rank])
            assert sorted(rows.tolist()) == sorted(batch.tolist()), (world_size, step)


def test_the_model_gives_one_logit_per_row_and_the_same_seed_the_same_weights():
    def build() -> TabularNet:
        torch.manual_seed(0)
        return TabularNet(4, [3, 10], ModelConfig(hidden_sizes=(8,), max_embedding_dim=4))

    model = build()
    logits = model(torch.zeros(5, 4), torch.tensor([[0, 9]] * 5))
    assert logits.shape == (5,)
    assert [e.embedding_dim for e in model.embeddings] == [3, 4]
    assert all(
        torch.equal(a, b)
        for a, b in zip(model.state_dict().values(), build().state_dict().values(), strict=True)
    )


def test_an_epochs_batches_are_its_rows_in_order_from_any_batch_on():
    from ml.data import Tensors
    from ml.train import epoch_batches

    numeric = torch.arange(30.0).reshape(15, 2)
    data = Tensors(numeric, torch.arange(15).reshape(15, 1), torch.arange(15.0))
    rows = torch.randperm(15, generator=torch.Generator().manual_seed(3))
    for first in (0, 2):
        batches = list(epoch_batches(data, rows, 4, first, torch.device("cpu")))
        assert len(batches) == 4 - first  # ceil(15 / 4) batches, the last of 3 rows
        for batch, (n, c, y) in enumerate(batches, start=first):
            index = rows[batch * 4 : (batch + 1) * 4]
            assert torch.equal(n, numeric[index]) and n.is_contiguous()
            assert torch.equal(c, data.categorical[index]) and torch.equal(y, data.label[index])


def test_ranks_vote_on_a_stop_about_every_half_second_of_steps_whatever_a_step_takes():
    from ml.preemption import MAX_STEPS_BETWEEN_VOTES, VOTE_EVERY_S, steps_between_votes

    assert steps_between_votes(0.0) == 1  # no step timed yet: vote at the next one
    assert steps_between_votes(0.004) == int(VOTE_EVERY_S / 0.004)  # a small MLP's step
    assert steps_between_votes(2.0) == 1  # a step longer than the interval: every step
    assert steps_between_votes(1e-7) == MAX_STEPS_BETWEEN_VOTES
