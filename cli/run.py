"""`make run`: run one declared use case's lifecycle on its bundled data with the embedded
defaults, then say where the results are.

    python -m cli.run [--use-case NAME] [--start YYYY-MM-DD] [--end YYYY-MM-DD]

First the dimension tables and the Feast registry; then every day, the history lead-in (the days
the window's trailing features read back) and the window, ingested and validated in runs of a
range of days as a batched backfill takes them; then the window's feature tables in one run of
its days and its online store in another (each day recorded as its own partition); then a
training set over the window; then `train_model`: `trained_model` (torchrun workers launched
through Dagster Pipes), its evaluation against the champion and the gate, the ONNX export with
its parity check, and registration as champion if every gate passed; then the champion scores
the test days (`batch_predictions`). Every run is recorded in the local instance exactly as a run
launched from the UI would be, so `make dev` afterwards shows every run, materialization and
check result. Runs execute in this process: one process keeps GX, Feast and the bundled data
loaded instead of paying their start-up once per step.
"""

import argparse
import dataclasses
import datetime as dt
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

from assets import asset_key, daily_partitions
from cli.run_jobs import AssetRun, DayOutcome, published_stretches, run_assets, run_days
from cli.run_summary import Stop, Summary, where_lines
from cli.stops import STOP_FD, Stopped, Stops, exit_code, supervise_worker
from declare import Trailing, UseCase
from pipelines.jobs import definition_name


def choose_use_case(cases: Sequence[UseCase], name: str | None) -> UseCase:
    """The declared use case called `name`; the first declared when `name` is None."""
    if not cases:
        raise ValueError("no use case is declared")
    if name is None:
        return cases[0]
    for case in cases:
        if case.name == name:
            return case
    raise ValueError(f"no use case {name!r} is declared; use one of {[c.name for c in cases]}")


def default_window(case: UseCase) -> tuple[dt.date, dt.date]:
    """The first and last day of the training window `make run` trains on when not told: the
    use case's default window, else its last `window.days` days."""
    declared = case.window.default
    if declared:
        last = dt.date.fromisoformat(declared["end"]) - dt.timedelta(days=1)
        return dt.date.fromisoformat(declared["start"]), last
    last = dt.date.fromisoformat(case.partitions.end) - dt.timedelta(days=1)
    first = max(
        last - dt.timedelta(days=case.window.days - 1),
        dt.date.fromisoformat(case.partitions.start),
    )
    return first, last


def training_split(
    case: UseCase, start: dt.date | None = None, end: dt.date | None = None
) -> tuple[dict[str, str], str]:
    """The `training_set` config `make run` trains on, and where its dates come from: the
    declared `window.default` as it stands when no day is given, else the days [start, end]
    (the default window's where one is left out) split by `window.shares`."""
    declared = case.window.default
    if declared and start is None and end is None:
        return dict(declared), f"the split {case.name} declares (window.default)"
    first, last = default_window(case)
    start, end = start or first, end or last
    shares = "/".join(f"{share:.0%}" for share in case.window.shares)
    return case.window.config(start, end), f"{start}..{end} split {shares} (window.shares)"


def history_days(case: UseCase) -> int:
    """Days processed before the training window, so that the window's trailing feature inputs
    have their history (the longest any feature table reads back)."""
    return max(
        (
            source.days
            for spec in case.feature_tables
            for source in spec.inputs.values()
            if isinstance(source, Trailing)
        ),
        default=0,
    )


@dataclass(frozen=True)
class Plan:
    """The days `make run` processes for a use case, and the training set it builds of them."""

    window: dict[str, str]
    """The `training_set` config: `start`, `validation_start`, `test_start`, `end`."""
    split_from: str
    """Where the window's dates come from (`training_split`)."""
    partitions: list[str]
    """Every day processed, in order: the history lead-in, then the window's days."""

    @property
    def start(self) -> dt.date:
        return dt.date.fromisoformat(self.window["start"])

    @property
    def end(self) -> dt.date:
        """The window's last day."""
        return dt.date.fromisoformat(self.window["end"]) - dt.timedelta(days=1)

    @property
    def window_days(self) -> list[str]:
        """The days after the lead-in: those the training set is made of."""
        lead_in = len([p for p in self.partitions if dt.date.fromisoformat(p) < self.start])
        return self.partitions[lead_in:]

    @property
    def test_days(self) -> list[str]:
        return [day for day in self.partitions if day >= self.window["test_start"]]

    @property
    def split(self) -> str:
        """Where the training set's days begin each part, and where those dates came from."""
        window = self.window
        return (
            f"validation from {window['validation_start']}, test from {window['test_start']};"
            f" {self.split_from}"
        )


def plan_days(case: UseCase, start: dt.date | None = None, end: dt.date | None = None) -> Plan:
    """The days of `case` to process for a training window over [start, end] (`training_split`)
    and the history its trailing features read back; ValueError, saying why, when there are
    none or the window cannot be split."""
    try:
        window, split_from = training_split(case, start, end)
    except ValueError as error:
        raise ValueError(f"{error} (train/validation/test)") from None
    dated = Plan(window, split_from, partitions=[])  # its dates, before its days are chosen
    first, last = dated.start - dt.timedelta(days=history_days(case)), dated.end
    partitions = [
        key
        for key in daily_partitions(case).get_partition_keys()
        if first <= dt.date.fromisoformat(key) <= last
    ]
    if not partitions:
        raise ValueError(f"no partitions of {case.name} between {first} and {last}")
    return dataclasses.replace(dated, partitions=partitions)


def ensure_dagster_home(home: Path, instance_file: Path) -> Path:
    """DAGSTER_HOME (default `<home>/dagster_home`) with the profile's instance file in it."""
    dagster_home = Path(os.environ.setdefault("DAGSTER_HOME", str(home / "dagster_home")))
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(instance_file, dagster_home / "dagster.yaml")
    return dagster_home


def _day(text: str) -> dt.date:
    """A `--start`/`--end` value: a YYYY-MM-DD day, or a clean usage error naming it."""
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a YYYY-MM-DD day") from None


@dataclass
class Driver:
    """`make run`'s runs of one use case over `plan`'s days, in order, and what each did; a
    stop ends it between runs (`Stopped`)."""

    case: UseCase
    plan: Plan
    job: Callable[[str], dg.JobDefinition]
    """The use case's job of a base name (`ingest_and_validate`, ...)."""
    instance: dg.DagsterInstance
    stops: Stops
    days_per_run: int
    """Days one ingest run takes, as a backfill run takes them (`Settings.days_per_run`)."""
    config: str | None = None
    """The catalog entry trained; None: the use case's (`UseCase.config`)."""
    outcomes: dict[str, DayOutcome] = field(default_factory=dict)
    training: AssetRun = field(init=False)
    model: AssetRun = field(default_factory=lambda: AssetRun(False, "", ran=False))
    scored: dict[str, AssetRun] = field(default_factory=dict)
    """The `score_day` run of each test day."""
    ahead: dict[str, AssetRun] = field(default_factory=dict)
    """The `predict_day` run of the day after the window."""

    def __post_init__(self) -> None:
        window = self.plan.window
        self.training = AssetRun(False, f"[{window['start']}, {window['end']})", ran=False)

    def set_up(self) -> bool:
        """The dimension tables (if the use case has any) and the Feast registry; False, said
        on stderr, when one of them failed."""
        setups = [("apply_feature_registry", "Applying the Feast registry")]
        if self.case.dimensions:
            setups.insert(0, ("load_dimensions", "Loading the dimension tables"))
        for setup, what in setups:
            if not run_assets(self.job(setup), self.instance, stops=self.stops).success:
                self.stops.check()
                print(f"{what} failed; see `make dev` → Runs.", file=sys.stderr)
                return False
        return True

    def ingest(self) -> None:
        """Every day ingested and validated first, a backfill run's worth of days at a time (GX
        imported and each source read once)."""
        ingest, per_run = self.job("ingest_and_validate"), self.days_per_run
        partitions = self.plan.partitions
        for at in range(0, len(partitions), per_run):
            chunk = partitions[at : at + per_run]
            self.outcomes |= run_days(ingest, self.instance, chunk, self.stops)
        self.stops.check()

    def build_features(self) -> None:
        """The window's published days get their feature tables and online store in one run of
        each unbroken stretch. The lead-in days only feed the window's trailing features: their
        own would need a lead-in of their own."""
        job, instance, stops, outcomes = self.job, self.instance, self.stops, self.outcomes
        for stretch in published_stretches(self.plan.window_days, outcomes):
            for step in ("build_features", "write_online_store"):
                for day, done in run_days(job(step), instance, stretch, stops).items():
                    outcomes[day] = outcomes[day].merged(done)
                stretch = [day for day in stretch if outcomes[day].success]
                if not stretch:
                    break
        stops.check()

    def print_days(self) -> None:
        window_days = self.plan.window_days
        for partition, outcome in self.outcomes.items():
            status = "published" if outcome.success else "REFUSED"
            lead = " (history lead-in)" if partition not in window_days else ""
            print(f"{partition}: {status}{lead}", flush=True)

    def train_and_score(self) -> None:
        """The training set, then (if it was built) training through registration, the test
        days scored by the champion and the day after predicted."""
        case, job, instance, stops = self.case, self.job, self.instance, self.stops
        training_set = asset_key(case, "training_set").to_python_identifier()
        self.training = run_assets(
            job("build_training_set"),
            instance,
            self.training.window,
            ops={training_set: {"config": self.plan.window}},
            stops=stops,
        )
        following = (self.plan.end + dt.timedelta(days=1)).isoformat()
        if self.training.success:
            trained_model = asset_key(case, "trained_model").to_python_identifier()
            entry = {"catalog": {"name": self.config or case.config}}
            self.model = run_assets(
                job("train_model"), instance, ops={trained_model: {"config": entry}}, stops=stops
            )
            # The test days: the champion (new, or kept when the gate refused) scores them.
            scoring = job("score_day")
            for day in self.plan.test_days:
                self.scored[day] = run_assets(scoring, instance, day, partition=day, stops=stops)
            # The day after: predicted as the nightly run would, before any of it is known.
            if case.predicts_ahead and following <= str(
                daily_partitions(case).get_last_partition_key()
            ):
                self.ahead[following] = run_assets(
                    job("predict_day"), instance, following, partition=following, stops=stops
                )
        stops.check()

    def summary(self, seconds: float) -> Summary:
        stops = self.stops
        return Summary(
            self.case,
            list(self.outcomes.values()),
            self.training,
            self.model,
            self.scored,
            seconds,
            self.ahead,
            planned=self.plan.partitions,
            to_score=self.plan.test_days,
            stop=Stop(stops.signum, stops.stage) if stops.signum is not None else None,
            split=self.plan.split,
        )

    def succeeded(self) -> bool:
        """Whether the model was trained and every day it was to score was scored."""
        runs = [*self.scored.values(), *self.ahead.values()]
        scoring_ok = bool(self.scored) and all(run.success for run in runs)
        return self.training.success and self.model.success and scoring_ok


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Run a use case's lifecycle on its bundled data.")
    parser.add_argument(
        "--use-case", metavar="NAME", help="the declared use case to run (default: the first)"
    )
    parser.add_argument(
        "--start",
        type=_day,
        help="first day of the training set (YYYY-MM-DD; default: the use case's default window);"
        " the days its trailing features read back are processed too",
    )
    parser.add_argument("--end", type=_day, help="last day, inclusive (YYYY-MM-DD)")
    parser.add_argument(
        "--config",
        metavar="NAME",
        help="the catalog entry to train (usecases/<name>/configs/NAME.toml; default: the one the"
        " use case names, `baseline`)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="torchrun workers (DDP over gloo); 0 lets the launcher measure the fastest layout",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments()
    args = parser.parse_args(argv)
    if STOP_FD not in os.environ:  # the command itself: the work runs in a worker it can stop
        return supervise_worker("cli.run", sys.argv[1:] if argv is None else argv)
    if args.processes:  # read when the definitions are built, below
        os.environ["ML_LIFECYCLE_TRAIN_PROCESSES"] = str(args.processes)

    # Feast installs a DeprecationWarning filter of its own when imported, ahead of any set
    # before; importing it first lets the filter below hold. The warning is pydantic 2's about
    # dagster-shared's v1-style attribute access: not ours to change.
    import feast  # noqa: F401

    warnings.filterwarnings("ignore", message="The `__fields__` attribute is deprecated")
    from pipelines.definitions import SETTINGS, USE_CASES, defs, instance_file
    from pipelines.run_health import release_dead_runs

    try:
        case = choose_use_case(USE_CASES, args.use_case)
        days = plan_days(case, args.start, args.end)
        if args.config is not None:
            case.configs.entry(args.config)  # an unknown name is refused before any run
    except ValueError as error:
        parser.error(str(error))

    def job(base: str) -> dg.JobDefinition:
        return defs.resolve_job_def(definition_name(case, base))

    home = SETTINGS.home
    ensure_dagster_home(home, instance_file(SETTINGS.profile))
    began = time.perf_counter()
    with dg.DagsterInstance.get() as instance, Stops(instance) as stops:
        driver = Driver(case, days, job, instance, stops, SETTINGS.days_per_run, args.config)
        try:
            # A run an earlier, killed `make run` left unfinished would hold its pool slots.
            for released in release_dead_runs(instance):
                print(f"run {released.run_id} ({released.job_name}): {released.reason}", flush=True)
            if not driver.set_up():
                return 1
            driver.ingest()
            driver.build_features()
            driver.print_days()
            driver.train_and_score()
        except Stopped:
            pass
    summary = driver.summary(time.perf_counter() - began)
    print()
    print("\n".join(summary.lines()))
    print()
    print("\n".join(where_lines(case, home)))
    if stops.signum is not None:
        return exit_code(stops.signum)
    return 0 if driver.succeeded() else 1


if __name__ == "__main__":
    sys.exit(main())
