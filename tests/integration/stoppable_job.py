"""A command like `make run` for the stop tests: under `cli.stops.supervise_worker`,
three runs of a job whose `waits` step (with a retry policy, as the lifecycle's steps have)
writes the file `STOPPABLE_MARK` names and then works until it is interrupted; `other` runs
beside it. Prints each run's id and status as it ends, and "stopped by <SIGNAL>" when stopped.

    python -m tests.integration.stoppable_job
"""

import os
import sys
import time
from pathlib import Path

import dagster as dg

from cli.stops import STOP_FD, Stopped, Stops, exit_code, supervise_worker

MARK = "STOPPABLE_MARK"


@dg.asset(retry_policy=dg.RetryPolicy(max_retries=2, delay=1))
def waits() -> int:
    Path(os.environ[MARK]).touch()
    while True:  # a step that only a stop ends (as a held training)
        time.sleep(0.05)


@dg.asset(retry_policy=dg.RetryPolicy(max_retries=2, delay=1))
def after(waits: int) -> int:
    return waits + 1


@dg.asset
def other() -> int:
    return 3


ASSETS = [waits, after, other]
JOB = dg.define_asset_job("stoppable", ASSETS).resolve(
    asset_graph=dg.Definitions(assets=ASSETS).resolve_asset_graph()
)


def main() -> int:
    if STOP_FD not in os.environ:
        return supervise_worker("tests.integration.stoppable_job", sys.argv[1:])
    with dg.DagsterInstance.get() as instance, Stops(instance) as stops:
        try:
            for _ in range(3):
                result = stops.run(
                    JOB.name,
                    lambda run_id: JOB.execute_in_process(
                        instance=instance, run_id=run_id, raise_on_error=False
                    ),
                )
                print(result.run_id, result.dagster_run.status.value, flush=True)
                stops.check()
        except Stopped as stopped:
            print(stopped, flush=True)
            return exit_code(stopped.signum)
    return 0


if __name__ == "__main__":
    sys.exit(main())
