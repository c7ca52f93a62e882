"""The process's Spark session, started from a dict of settings (`resources.spark.SparkEngine`
writes them; Feast's Spark offline store and compute engine carry them as `spark_conf`).

Spark starts one session a process; every caller gets the active one, else the one these
settings describe. A few of Spark's settings are read from the environment of the JVM and the
Python workers it starts, not from the session's settings; they are set here from the settings
that name them, so one dict says everything:

- `spark.driver.bindAddress` → `SPARK_LOCAL_IP`: where a local driver's web UI listens (every
  interface when unset);
- `spark.pyspark.python` → `PYSPARK_PYTHON`: the interpreter of Python workers (the online
  store's writes run there), which otherwise is the first `python3` on PATH, without this
  environment's packages.

pyspark is imported on first use.
"""

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FROM_ENVIRONMENT = {
    "spark.driver.bindAddress": "SPARK_LOCAL_IP",
    "spark.pyspark.python": "PYSPARK_PYTHON",
}


def spark_session(conf: Mapping[str, str] | None) -> "SparkSession":
    """The active session, else one started from `conf` (`spark.master` or `spark.remote` says
    where it runs). An active session on another master is refused: Spark runs one session a
    process, and this one would not run where `conf` says."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        master = (conf or {}).get("spark.master")
        running = active.sparkContext.master if master is not None else None
        if master is not None and running != master:
            raise ValueError(
                f"a Spark session on {running} is already running in this process, and Spark"
                f" runs one a process: stop it before starting one on {master}"
            )
        return active
    conf = dict(conf or {})
    if "spark.remote" not in conf:  # a Connect client starts no JVM and no workers here
        for setting, variable in FROM_ENVIRONMENT.items():
            if setting in conf:
                os.environ[variable] = conf[setting]
    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()
