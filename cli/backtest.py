"""`make backtest`: a use case's rolling backtest (`<use case>_backtest`) of one catalog entry,
its folds run one after another in this process and recorded in the instance as runs from the
UI are (a fold is a partition: entry|month); prints each fold's figures.

    python -m cli.backtest --use-case <name> --config baseline --folds 2013-02-01...2013-04-01

The folds' feature tables must be materialized first (`make run` builds the days it trains
on; a backfill of the daily job builds more).
"""

import argparse
import datetime as dt
import os
import sys
import warnings

from cli.stops import STOP_FD, supervise_worker


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="A use case's rolling backtest.")
    parser.add_argument("--use-case", help="the use case (default: the first declared)")
    parser.add_argument("--config", help="the catalog entry (default: the use case's)")
    parser.add_argument(
        "--folds",
        help="a fold (YYYY-MM-01) or a range FIRST...LAST (default: the first fold and the one"
        " after it)",
    )
    return parser


def chosen_folds(known: list[str], given: str | None) -> list[str]:
    """The folds `given` names among `known` (in order): one, or FIRST...LAST inclusive."""
    if given is None:
        return known[:2]
    first, _, last = given.partition("...")
    last = last or first
    for fold in (first, last):
        if fold not in known:
            raise ValueError(f"fold {fold!r} is not one of {known[0]} … {known[-1]} (YYYY-MM-01)")
    if dt.date.fromisoformat(first) > dt.date.fromisoformat(last):
        raise ValueError(f"folds {given!r}: {first} comes after {last}")
    return [fold for fold in known if first <= fold <= last]


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if STOP_FD not in os.environ:  # the command itself: the work runs in a worker it can stop
        return supervise_worker("cli.backtest", sys.argv[1:] if argv is None else argv)
    import feast  # noqa: F401  # its warning filter first, as in cli.run

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    import dagster as dg

    from assets import asset_key
    from assets.backtest import CONFIG, FOLD, backtest_partitions
    from cli.run import choose_use_case, ensure_dagster_home
    from cli.run_jobs import run_assets
    from cli.stops import Stops
    from pipelines.definitions import SETTINGS, USE_CASES, defs, instance_file
    from pipelines.jobs import definition_name

    try:
        case = choose_use_case(USE_CASES, args.use_case)
        entry = args.config or case.config
        case.configs.entry(entry)
        if not case.backtests:
            raise ValueError(f"use case {case.name!r} has no backtest: no whole fold fits its days")
        months = backtest_partitions(case).get_partitions_def_for_dimension(FOLD)
        folds = chosen_folds(list(months.get_partition_keys()), args.folds)
    except ValueError as error:
        parser.error(str(error))
    backtest = asset_key(case, "backtest").to_user_string()
    ensure_dagster_home(SETTINGS.home, instance_file(SETTINGS.profile))
    job = defs.resolve_job_def(definition_name(case, "backtest"))
    rows = []
    with dg.DagsterInstance.get() as instance, Stops(instance) as stops:
        for fold in folds:
            key = dg.MultiPartitionKey({CONFIG: entry, FOLD: fold})
            print(f"fold {fold} of {entry}: training on the {case.backtest.train_days} days before")
            ran = run_assets(job, instance, partition=str(key), stops=stops)
            shown = ran.assets.get(backtest)
            if not ran.success or shown is None:
                print(f"Fold {fold} did not finish: {ran.problem or ran.stopped or 'see make dev'}")
                return 1
            rows.append(_row(shown))
    print()
    print(f"Backtest of {entry} ({case.name}), {len(rows)} fold(s):")
    print("| fold | metric | interval | naive forecast | test rows |")
    print("|---|---|---|---|---|")
    for row in rows:
        print(row)
    return 0


def _row(shown: dict) -> str:
    """One fold's figures from its materialization's document (n/a: undefined on its rows)."""
    fold = shown["fold"]

    def num(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.4f}"

    return (
        f"| {fold['fold']} | {fold['metric']} {num(fold['value'])}"
        f" | [{num(fold['low'])}, {num(fold['high'])}]"
        f" | {'none declared' if fold['baseline'] is None else num(fold['baseline'])}"
        f" | {fold['rows']} |"
    )


if __name__ == "__main__":
    sys.exit(main())
