"""Apache Spark, behind one resource: the engine for data past one machine (`ENGINE=spark`).

`SparkEngine` says where Spark runs and starts the session every Spark step uses:

- `local[N]` (the default, `local[2]`): Spark inside this process's JVM with N cores, for tests
  and laptops. It needs only Java (17 here). Its driver and its web UI listen on 127.0.0.1 only:
  left alone, Spark binds the driver to the machine's outside interface and the UI to every
  interface (`SPARK_LOCAL_IP` is what the UI reads).
- a master URL (`spark://host:7077`, `k8s://https://...`, `yarn`): a cluster's master, the
  driver in this process (the run's pod); its addresses are the cluster's business.
- `remote` (`sc://host:15002`): a Spark Connect server, which runs the driver itself; nothing
  starts here but a client.

Feast's Spark offline store takes the active session when one exists, so the session this
resource starts is the one its joins run on; `conf()` is also what a generated
feature_store.yaml gives Feast (`spark_conf`) where Feast starts the session itself.

pyspark is imported on first use, never when the code location loads.
"""

import os
import re
import sys
from typing import TYPE_CHECKING

import dagster as dg
from pydantic import Field

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOOPBACK = "127.0.0.1"
LOCAL_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?$")
"""`local`, `local[N]`, `local[*]` and `local[N,F]` (F: task failures allowed)."""
APP_NAME = "ml-lifecycle"


class SparkError(RuntimeError):
    """A Spark setting that cannot work, or a session that could not start: the message says
    which and what to set instead."""


class SparkEngine(dg.ConfigurableResource):
    """Where Spark runs: a local session by default, a cluster's master or a Spark Connect
    server in production (docs/cluster.md)."""

    master: str = Field(
        default="local[2]",
        description="local[N] (this process, N cores), or a cluster's master URL"
        " (spark://..., k8s://..., yarn).",
    )
    remote: str = Field(
        default="",
        description="A Spark Connect address (sc://host:15002); set, it replaces `master`.",
    )
    driver_memory: str = Field(
        default="4g",
        description="A local session's heap (`spark.driver.memory`: the driver is every executor"
        " there). Spark's 1g runs out on a training set's join of 50,000 rows.",
    )
    conf: dict[str, str] = Field(
        default_factory=dict,
        description="More Spark settings (spark.executor.memory, spark.sql.shuffle.partitions,"
        " ...), over this resource's own.",
    )

    @property
    def is_local(self) -> bool:
        return not self.remote and LOCAL_MASTER.match(self.master) is not None

    def cores(self) -> int | None:
        """The cores a local session computes on (None: not a local session)."""
        if not self.is_local:
            return None
        found = LOCAL_MASTER.match(self.master)
        assert found is not None
        given = found.group(2)
        if given is None:
            return 1
        return len(os.sched_getaffinity(0)) if given == "*" else int(given)

    def settings(self) -> dict[str, str]:
        """The session's settings: this resource's own, then `conf` over them."""
        if self.remote and not self.remote.startswith("sc://"):
            raise SparkError(
                f"spark remote {self.remote!r}: a Spark Connect address is sc://host:port"
            )
        if not self.remote and not self.master:
            raise SparkError("spark master is empty: local[N], or a cluster's master URL")
        own = {"spark.app.name": APP_NAME}
        if self.is_local:
            cores = self.cores() or 1
            own |= {
                "spark.driver.bindAddress": LOOPBACK,
                "spark.driver.host": LOOPBACK,
                # One shuffle partition per core: Spark's default of 200 is for clusters, and a
                # local join of a training window then spends its time starting empty tasks.
                "spark.sql.shuffle.partitions": str(cores),
                # Python workers (the online store's writes) run this interpreter, with this
                # environment's packages, not the first `python3` on PATH.
                "spark.pyspark.python": sys.executable,
                "spark.driver.memory": self.driver_memory,
            }
        # Timestamps are instants: shown and cast in UTC whatever the machine's zone.
        own["spark.sql.session.timeZone"] = "UTC"
        # pandas rows (a training set's entity rows) reach Spark through Arrow, not row by row.
        own["spark.sql.execution.arrow.pyspark.enabled"] = "true"
        return own | dict(self.conf)

    def session_conf(self) -> dict[str, str]:
        """Everything a session is started from, where it runs included (`spark.remote` or
        `spark.master`): what Feast's Spark offline store and compute engine are given to
        start the same session this resource would (`ml.spark_session.spark_session`)."""
        where = {"spark.remote": self.remote} if self.remote else {"spark.master": self.master}
        return where | self.settings()

    def session(self) -> "SparkSession":
        """The session, started on first use (one per process: Spark's rule)."""
        from ml.spark_session import spark_session

        try:
            return spark_session(self.session_conf())
        except ValueError:
            raise  # another session runs here: its message says which
        except Exception as error:  # the JVM did not start, or the master did not answer
            where = self.remote or self.master
            raise SparkError(
                f"no Spark session on {where}: {type(error).__name__}: {error}"
                + (
                    " (a local session needs Java 17 on PATH or in JAVA_HOME)"
                    if self.is_local
                    else ""
                )
            ) from error
