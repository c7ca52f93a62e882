"""The Spark resource's settings (`resources.spark`): what a session starts with, by where it
runs. Starting one is in tests/integration/test_spark.py."""

import sys

import pytest

from resources.spark import LOOPBACK, SparkEngine, SparkError

pytestmark = pytest.mark.unit


def test_a_local_session_listens_on_loopback_with_a_shuffle_partition_per_core():
    settings = SparkEngine(master="local[3]").settings()
    assert settings["spark.driver.bindAddress"] == settings["spark.driver.host"] == LOOPBACK
    assert settings["spark.sql.shuffle.partitions"] == "3"
    assert settings["spark.sql.session.timeZone"] == "UTC"
    # Python workers run this interpreter: the first python3 on PATH lacks Feast.
    assert settings["spark.pyspark.python"] == sys.executable
    assert settings["spark.driver.memory"] == "4g"


def test_a_session_is_started_from_one_dict_that_says_where_it_runs():
    local = SparkEngine(master="local[3]")
    assert local.session_conf() == {"spark.master": "local[3]", **local.settings()}
    connect = SparkEngine(master="local[3]", remote="sc://h:15002")
    assert connect.session_conf()["spark.remote"] == "sc://h:15002"
    assert "spark.master" not in connect.session_conf()


@pytest.mark.parametrize(
    ("master", "cores"),
    [("local", 1), ("local[2]", 2), ("local[4,3]", 4), ("spark://h:7077", None)],
)
def test_the_cores_of_a_local_session_are_read_from_its_master(master, cores):
    assert SparkEngine(master=master).cores() == cores


def test_a_cluster_or_connect_session_is_given_no_local_address():
    for engine in (SparkEngine(master="spark://master:7077"), SparkEngine(remote="sc://h:15002")):
        settings = engine.settings()
        assert not engine.is_local
        assert "spark.driver.bindAddress" not in settings
        assert "spark.sql.shuffle.partitions" not in settings
        assert "spark.pyspark.python" not in settings  # the cluster's image says
        assert "spark.driver.memory" not in settings  # the driver's pod says


def test_the_resource_s_conf_goes_over_its_own_settings():
    engine = SparkEngine(conf={"spark.sql.shuffle.partitions": "8", "spark.executor.memory": "2g"})
    settings = engine.settings()
    assert settings["spark.sql.shuffle.partitions"] == "8"
    assert settings["spark.executor.memory"] == "2g"


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"remote": "http://h:15002"}, "a Spark Connect address is sc://host:port"),
        ({"master": ""}, "spark master is empty"),
    ],
)
def test_settings_that_cannot_work_are_refused_with_what_to_set(fields, says):
    with pytest.raises(SparkError, match=says):
        SparkEngine(**fields).settings()
