"""`make tune`: a use case's hyperparameter study (`<use case>_tune`) run in this process on the
latest training set (`make run` builds one), recorded in the instance as a run from the UI is;
prints the trials and the best settings.

    python -m cli.tune --use-case <name> --trials 20 --workers 2 --save-best-as tuned
"""

import argparse
import os
import sys
import warnings

from cli.stops import STOP_FD, supervise_worker


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="A use case's hyperparameter study.")
    parser.add_argument("--use-case", help="the use case (default: the first declared)")
    parser.add_argument("--trials", type=int, help="finished trials in all (default: declared)")
    parser.add_argument("--workers", type=int, help="trials side by side (default: declared)")
    parser.add_argument("--start", help="the catalog entry trials start from")
    parser.add_argument("--study", help="the study's name; a study of that name resumes")
    parser.add_argument("--save-best-as", help="save the best settings as this catalog entry")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if STOP_FD not in os.environ:  # the command itself: the work runs in a worker it can stop
        return supervise_worker("cli.tune", sys.argv[1:] if argv is None else argv)
    import feast  # noqa: F401  # its warning filter first, as in cli.run

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    # Dagster's own Pipes session, opened by each trial from a thread: not ours to change.
    warnings.filterwarnings("ignore", message="AssetExecutionContext.run_id is deprecated")
    warnings.filterwarnings("ignore", message="Function `PipesMessageReader.expected_writer")
    import dagster as dg

    from assets import asset_key
    from cli.run import choose_use_case, ensure_dagster_home
    from cli.run_jobs import run_assets
    from cli.stops import Stops
    from pipelines.definitions import SETTINGS, USE_CASES, defs, instance_file
    from pipelines.jobs import definition_name

    try:
        case = choose_use_case(USE_CASES, args.use_case)
        if args.start is not None:
            case.configs.entry(args.start)
    except ValueError as error:
        parser.error(str(error))
    given = {
        "trials": args.trials,
        "workers": args.workers,
        "start": args.start,
        "study": args.study,
        "save_best_as": args.save_best_as,
    }
    config = {k: v for k, v in given.items() if v is not None}
    study = asset_key(case, "study")
    ensure_dagster_home(SETTINGS.home, instance_file(SETTINGS.profile))
    with dg.DagsterInstance.get() as instance, Stops(instance) as stops:
        ran = run_assets(
            defs.resolve_job_def(definition_name(case, "tune")),
            instance,
            ops={study.to_python_identifier(): {"config": config}},
            stops=stops,
        )
    shown = ran.assets.get(study.to_user_string())
    if not ran.success or shown is None:
        print(f"The study did not finish: {ran.problem or ran.stopped or 'see make dev'}")
        return 1
    print(shown["trials_table"])
    print()
    for key in ("study", "storage", "trials", "ran_in_this_run", "wall_s", "best", "best_trial"):
        if key in shown:
            print(f"{key}: {shown[key]}")
    if "best_validation_loss" in shown:
        print(f"best_validation_loss: {shown['best_validation_loss']}")
        print(shown["best_config"])
    print(f"saved: {shown['saved_as']}")
    print(f"mlflow: {shown['mlflow_run']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
