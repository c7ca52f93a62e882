"""Faults of the production services, on the real ones: PostgreSQL or Redis gone for a moment in
the middle of a step (a proxy cuts the step's connections and refuses new ones), and two
`feast apply` at the same instant on one SQL registry."""

import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Callable

import dagster as dg
import pandas as pd
import pytest

from pipelines.definitions import definitions
from resources.feature_store import DEFAULT_REPO, FeastFeatureStore
from tests.conftest import CASE, node
from tests.outage import Outage
from tests.production import (
    POSTGRES,
    REDIS,
    REDIS_DB,
    ProductionWorld,
    databases,
    postgres_url,
    query,
    require_services,
)
from tests.world import WINTER

# The first test to run may build the local and the production worlds.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(1200)]

SERVICE = "flight_delay_v1"
ENTITY_KEYS = ["flight_id", "origin", "dest", "carrier", "tailnum"]


def retried(result: dg.ExecuteInProcessResult, step: str) -> int:
    return sum(
        1
        for event in result.all_events
        if event.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY
        and event.step_key == node(step)
    )


def up_for_retry(instance: dg.DagsterInstance, step: str) -> Callable[[], bool]:
    """Whether a run in progress has put `step` up for retry: the effect an outage must have
    before it ends."""

    def seen() -> bool:
        started = dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])
        return any(
            event.step_key == node(step)
            for run in instance.get_runs(filters=started, limit=5)
            for event in instance.all_logs(
                run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY
            )
        )

    return seen


def through(production: ProductionWorld, store: FeastFeatureStore) -> ProductionWorld:
    """The production world with its feature store replaced by `store`."""
    resources = {**production.defs.resources, "feature_store": store}
    return dataclasses.replace(production, defs=definitions(resources))


def declared(store: FeastFeatureStore) -> dict[str, list[str]]:
    feast = store.store()
    return {
        "entities": sorted(e.name for e in feast.list_entities()),
        "feature_views": sorted(v.name for v in feast.list_feature_views()),
        "feature_services": sorted(s.name for s in feast.list_feature_services()),
    }


def test_postgresql_gone_during_the_registry_step_is_retried_and_nothing_is_lost(
    production: ProductionWorld,
):
    feast_db = postgres_url(production.databases["feast"])
    outage = Outage(POSTGRES)
    try:
        store = FeastFeatureStore(
            repo_path=str(DEFAULT_REPO),
            home=str(production.home),
            registry_url=feast_db.replace(f":{POSTGRES[1]}/", f":{outage.port}/"),
            redis_url=production.variables["FEAST_REDIS_URL"],
            offline_root=str(production.home / "lake"),
        ).for_use_case(CASE.name)
        outage.down()
        outage.up_when(up_for_retry(production.instance, "feature_registry"))
        result = through(production, store).run("apply_feature_registry")
    finally:
        outage.close()
    assert result.success
    assert outage.refused >= 1
    assert retried(result, "feature_registry") >= 1
    direct = FeastFeatureStore(
        repo_path=str(DEFAULT_REPO), home=str(production.home), registry_url=feast_db
    ).for_use_case(CASE.name)
    applied = result.asset_materializations_for_node(node("feature_registry"))[-1].metadata
    assert declared(direct)["feature_views"] == applied["feature_views"].value.split(", ")


def test_redis_gone_during_materialization_is_retried_and_the_values_are_right(
    production: ProductionWorld,
):
    day = WINTER[-1]
    outage = Outage(REDIS)
    try:
        store = FeastFeatureStore(
            repo_path=str(DEFAULT_REPO),
            home=str(production.home),
            registry_url=production.variables["FEAST_REGISTRY_URL"],
            redis_url=f"{outage.address()},db={REDIS_DB}",
            offline_root=str(production.home / "lake"),
        ).for_use_case(CASE.name)
        outage.down()
        # Until the step has failed, once the Redis client's own reconnects are spent: its retry
        # policy (5 ± 5 s, then 15 ± 5 s) has to bring it back.
        outage.up_when(up_for_retry(production.instance, "online_features"))
        result = through(production, store).run("daily_partition", day, assets=["online_features"])
        assert result.success
        assert outage.refused >= 1
        assert retried(result, "online_features") >= 1
        entities = pd.read_parquet(
            production.home / "lake" / "flights" / "flight_outcomes" / f"{day}.parquet"
        )
        entities = entities.sample(40, random_state=3)[ENTITY_KEYS]
        online = store.online_features(entities, SERVICE)
    finally:
        outage.close()
    instant = pd.Timestamp(day, tz="America/New_York") + pd.Timedelta(days=1)
    offline = store.historical_features(
        entities.assign(event_timestamp=instant - pd.Timedelta(microseconds=1)), SERVICE
    )
    for column in store.feature_columns(SERVICE):
        a = pd.Series(online[column].to_numpy(), dtype="object")
        b = pd.Series(offline[column].to_numpy(), dtype="object")
        assert ((a == b) | (a.isna() & b.isna())).all(), column


APPLY = """
import json, pathlib, sys, time
from resources.feature_store import FeastFeatureStore
store = FeastFeatureStore(repo_path=sys.argv[1], home=sys.argv[2], registry_url=sys.argv[3],
                          redis_url=sys.argv[4]).for_use_case("flights")
import feast.repo_operations  # the ~11 s import, before the start line
pathlib.Path(sys.argv[5]).touch()
while not pathlib.Path(sys.argv[6]).exists():
    time.sleep(0.001)
applied = store.apply()
print(json.dumps({"feature_views": applied.feature_views}))
"""


def test_two_feast_applies_at_the_same_instant_lose_no_definition(tmp_path):
    """Without the project's apply lock one of the two fails on a unique violation."""
    require_services()
    go = tmp_path / "go"
    with databases("feast") as names:
        url = postgres_url(names["feast"])
        host, port = REDIS
        processes = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    APPLY,
                    str(DEFAULT_REPO),
                    str(tmp_path / f"home{n}"),
                    url,
                    f"{host}:{port},db={REDIS_DB}",
                    str(tmp_path / f"ready{n}"),
                    str(go),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for n in range(2)
        ]
        deadline = time.monotonic() + 180
        while not all((tmp_path / f"ready{n}").exists() for n in range(2)):
            assert time.monotonic() < deadline, "the apply processes never got ready"
            assert all(process.poll() is None for process in processes)
            time.sleep(0.05)
        go.touch()
        outputs = [process.communicate(timeout=240) for process in processes]
        for process, (_, err) in zip(processes, outputs, strict=True):
            assert process.returncode == 0, err[-3000:]
        reports = [json.loads(out.strip().splitlines()[-1]) for out, _ in outputs]
        store = FeastFeatureStore(
            repo_path=str(DEFAULT_REPO), home=str(tmp_path / "check"), registry_url=url
        ).for_use_case(CASE.name)
        found = declared(store)
        assert found["feature_views"] == reports[0]["feature_views"] == reports[1]["feature_views"]
        assert found["entities"] and found["feature_services"]
        rows = query(names["feast"], "SELECT count(*) FROM feature_views")[0][0]
        assert rows == len(found["feature_views"])
