"""How the lineage command starts and how its walk reads the event log: one query answers every
reader of the same unpartitioned materialization, and each reader still gets the latest one
before it."""

import subprocess
import sys

import dagster as dg
import pytest

from cli.lineage_walk import _EventLog, _Read

pytestmark = pytest.mark.integration

AIRLINES = dg.AssetKey(["tiny", "airlines"])
CARRIERS = dg.AssetKey(["tiny", "carrier_history"])


def test_loading_the_command_imports_neither_dagster_nor_mlflow():
    # The command turns the garbage collector off before Dagster and MLflow load (3 s of CPU).
    code = "import sys, cli.lineage; print(sorted({'dagster', 'mlflow'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"


def materialize(instance: dg.DagsterInstance, key: dg.AssetKey, partition: str | None) -> int:
    """Records a materialization of `key` (`partition`); its storage id."""
    instance.report_runless_asset_event(dg.AssetMaterialization(key, partition=partition))
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=key), limit=1)
    return records.records[0].storage_id


def test_readers_of_one_unpartitioned_materialization_share_one_query():
    with dg.DagsterInstance.ephemeral() as instance:
        before_any = materialize(instance, CARRIERS, "2013-01-01")
        first = materialize(instance, AIRLINES, None)
        after_first = [materialize(instance, CARRIERS, d) for d in ("2013-01-02", "2013-01-03")]
        second = materialize(instance, AIRLINES, None)
        after_second = [materialize(instance, CARRIERS, d) for d in ("2013-01-04", "2013-01-05")]
        readers = [before_any, *after_first, *after_second]
        queries = []
        fetch = instance.fetch_materializations

        def counted(*args, **kwargs):
            queries.append(args[0])
            return fetch(*args, **kwargs)

        instance.fetch_materializations = counted  # type: ignore[method-assign]
        log = _EventLog(instance)
        log.prefetch((reader, _Read(AIRLINES, None, None, None)) for reader in readers)
        found = {r: [m.storage_id for m in log.latest_before(AIRLINES, None, r)] for r in readers}

    assert found == {
        before_any: [],
        **{reader: [first] for reader in after_first},
        **{reader: [second] for reader in after_second},
    }
    assert len(queries) == 3  # one per distinct answer, none in the lookups after the prefetch
