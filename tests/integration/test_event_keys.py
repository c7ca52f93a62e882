"""Events that a point-in-time join cannot tell apart are refused, never joined to the wrong row.

The declaration shape the scaffold used to write for event data: the per-event feature view and
the label view keyed by the entity (`user_id`) and the event's instant, with a TTL of one second.
Two events of one user in the same second then get the same feature row, whichever of the two
the join finds first. The Feast join shows the misjoin here; the `training_set` asset refuses the
rows, naming the view, its key and how many rows repeat it."""

import datetime as dt
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from assets import asset_key
from assets.features import feature_assets
from declare import (
    DailyPartitions,
    Day,
    EventTable,
    FeatureTableSpec,
    Label,
    TrainingWindow,
    UseCase,
)
from declare.contracts import ColumnRule, TableContract
from pipelines.settings import Settings
from resources.feast_names import refresh
from resources.feature_store import FeastFeatureStore
from resources.lake import ParquetLake

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAME = "old_event_shape"
SAME_SECOND = pd.Timestamp("2024-03-01T10:00:00Z")

FEAST_MODULE = f'''
from datetime import timedelta

from feast import Entity, FeatureService, FeatureView, Field, FileSource, ValueType
from feast.types import Int64, String

user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.STRING)


def _lake_table(table):
    return FileSource(name=table, path=f"{NAME}/{{table}}", timestamp_field="event_timestamp")


EVENT_ROW_TTL = timedelta(seconds=1)
event_features = FeatureView(
    name="event_features",
    entities=[user],
    ttl=EVENT_ROW_TTL,
    source=_lake_table("event_features"),
    schema=[Field(name="movie", dtype=String)],
)
event_outcomes = FeatureView(
    name="event_outcomes",
    entities=[user],
    ttl=EVENT_ROW_TTL,
    online=False,
    source=_lake_table("event_outcomes"),
    schema=[Field(name="liked", dtype=Int64)],
)
{NAME}_v1 = FeatureService(name="{NAME}_v1", features=[event_features])
'''


def _unused(*args, **kwargs):
    raise AssertionError("the feature tables are written by the test")


RATINGS = TableContract(
    table="ratings",
    columns=(
        ColumnRule("user_id", "text", required=True),
        ColumnRule("at", "timestamp", required=True),
        ColumnRule("movie", "text", required=True),
        ColumnRule("liked", "number", required=True),
    ),
    natural_key=("user_id",),
    event_time="at",
    min_rows=1,
    max_rejected_share=0.05,
)
CASE = UseCase(
    name=NAME,
    description="Will a user like the movie they rate?",
    partitions=DailyPartitions(timezone="UTC", start="2024-03-01", end="2024-03-04"),
    source=_unused,
    event_tables=(EventTable(RATINGS, "The day's ratings."),),
    dimensions=(),
    feature_tables=(
        FeatureTableSpec("event_features", "Per event: the movie.", _unused, {"r": Day("ratings")}),
        FeatureTableSpec("event_outcomes", "Per event: liked.", _unused, {"r": Day("ratings")}),
    ),
    feature_service=f"{NAME}_v1",
    label=Label(view="event_outcomes", column="liked", task="binary", table="event_outcomes"),
    registered_model=NAME,
    window=TrainingWindow(days=3),
)
EVENTS = pd.DataFrame(
    {
        "user_id": ["u1", "u1", "u2", "u1", "u2"],
        "event_timestamp": [
            SAME_SECOND,
            SAME_SECOND,  # a second rating of u1 in the same second
            SAME_SECOND + pd.Timedelta(minutes=5),
            pd.Timestamp("2024-03-02T09:00:00Z"),
            pd.Timestamp("2024-03-03T09:00:00Z"),
        ],
        "movie": ["m10", "m20", "m30", "m40", "m50"],
        "liked": [1, 0, 1, 0, 1],
    }
)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> FeastFeatureStore:
    root = tmp_path_factory.mktemp("old_shape")
    repos, home = root / "feature_repo", root / "home"
    (repos / NAME).mkdir(parents=True)
    settings = (REPO / "feature_repo" / "flights" / "feature_store.yaml").read_text()
    project = settings.replace("project: flights\n", f"project: {NAME}\n")
    (repos / NAME / "feature_store.yaml").write_text(project)
    (repos / NAME / f"{NAME}.py").write_text(FEAST_MODULE)
    refresh(repos / NAME)
    store = FeastFeatureStore(repo_path=str(repos), home=str(home)).for_use_case(NAME)
    store.apply()
    day = EVENTS["event_timestamp"].dt.date
    for table, columns in (("event_features", ["movie"]), ("event_outcomes", ["liked"])):
        folder = home / "lake" / NAME / table
        folder.mkdir(parents=True)
        for each, rows in EVENTS.groupby(day):
            frame = rows[["user_id", "event_timestamp", *columns]]
            frame.to_parquet(folder / f"{each.isoformat()}.parquet", index=False)
    return store


def test_the_old_shape_joins_one_event_to_another_events_row(store: FeastFeatureStore):
    outcomes = store.view_rows(
        "event_outcomes",
        dt.datetime(2024, 3, 1, tzinfo=dt.UTC),
        dt.datetime(2024, 3, 4, tzinfo=dt.UTC),
    )
    joined = store.historical_features(
        outcomes[["user_id", "event_timestamp"]], f"{NAME}_v1"
    ).merge(EVENTS, on=["user_id", "event_timestamp"])
    same = joined[(joined["user_id"] == "u1") & (joined["event_timestamp"] == SAME_SECOND)]
    # Each of the two ratings of u1 gets both movies (the merge pairs each with both), but the
    # join gave them one movie: one of the two ratings carries the other's.
    assert same["event_features__movie"].nunique() == 1
    assert set(same["movie"]) == {"m10", "m20"}


def test_the_training_set_refuses_rows_whose_key_repeats_within_the_ttl(
    store: FeastFeatureStore, tmp_path: Path
):
    training_set = feature_assets(CASE, Settings().days_per_run)[-1]
    config = {"start": "2024-03-01", "validation_start": "2024-03-02"}
    config |= {"test_start": "2024-03-03", "end": "2024-03-04"}
    result = dg.materialize(
        [training_set],
        resources={"feature_store": store, "lake": ParquetLake(root=str(tmp_path / "lake"))},
        run_config={
            "ops": {asset_key(CASE, "training_set").to_python_identifier(): {"config": config}}
        },
        raise_on_error=False,
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    refusal = failure.step_failure_data.user_failure_data  # a dg.Failure, not a crash
    assert refusal is not None and refusal.description is not None
    message = refusal.description
    assert "2 of 5 entity rows of view 'event_outcomes' repeat its join key (user_id)" in message
    assert "within 1 s, its TTL" in message
    assert f"user_id=u1 at {SAME_SECOND.isoformat()} (2 rows)" in message
    assert "--event-key" in message and "natural key" in message
    # No attempt was retried, and nothing was written.
    assert not list((tmp_path / "lake").rglob("*.parquet"))
