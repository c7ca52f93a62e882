"""Run one job of the project's definitions in this process, as `make run` runs each of its jobs:
unfinished runs of dead processes are released first. The process the kill tests SIGKILL.

    python -m tests.e2e.run_job JOB [--partition P] [--config JSON] [--from-failure RUN_ID]

`--from-failure` re-executes a failed run from its failed steps (the UI's "Re-execute from
failure", and what a run retry does), reusing the outputs of the steps that succeeded.
"""

import argparse
import json
import os
import sys
import warnings

import dagster as dg

JOB = "TEST_RUN_JOB"


def _job() -> dg.JobDefinition:
    from pipelines.definitions import defs
    from usecases.flights import USE_CASE

    return defs.resolve_job_def(USE_CASE.name_for(os.environ[JOB]))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("job")
    parser.add_argument("--partition")
    parser.add_argument("--config", default="{}")
    parser.add_argument("--from-failure")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    from pipelines.run_health import release_dead_runs

    os.environ[JOB] = args.job
    config = json.loads(args.config)
    with dg.DagsterInstance.get() as instance:
        release_dead_runs(instance)
        if args.from_failure:
            options = dg.ReexecutionOptions.from_failure(args.from_failure, instance)
            with dg.execute_job(
                dg.reconstructable(_job),
                instance,
                run_config=config,
                reexecution_options=options,
                raise_on_error=False,
            ) as result:
                return 0 if result.success else 1
        result = _job().execute_in_process(
            instance=instance, partition_key=args.partition, run_config=config, raise_on_error=False
        )
        return 0 if result.success else 1


if __name__ == "__main__":
    sys.exit(main())
