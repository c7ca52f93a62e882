"""A use case, declared: its partitions, tables, features, label, prediction, training window and
slices, and how its Dagster objects are named.

Plain frozen dataclasses, checked when they are made: an error names the use case and the field.
"""

import datetime as dt
import difflib
import re
import zoneinfo
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from declare.backtest import BacktestPolicy
from declare.catalog import BASELINE, Catalog, CatalogError
from declare.contracts import TableContract
from declare.gate import TASKS, GatePolicy, MulticlassGatePolicy, Policy, RegressionGatePolicy
from declare.policies import Automation, DecayPolicy, DriftSettings, Revisions
from declare.search import SearchPolicy

if TYPE_CHECKING:
    import pandas as pd

    from ml.features import FeatureTable, TableStream
    from resources.sources import RawSource

GRAINS = ("event", "entity_day")
"""What one row of an event table is (`EventTable.grain`)."""
PREDICTED_AT = ("event", "day_start")
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


class DeclarationError(ValueError):
    """A use case's declaration is wrong; the message names the use case and the field."""


def _refuse(case: str, name: str, problem: str) -> DeclarationError:
    return DeclarationError(f"use case {case!r}: {name}: {problem}")


SHOWN_NAMES = 12
"""How many of the valid names a refusal lists when none is near the wrong one."""


def unknown_name(
    case: str, name: str, value: str, known: Iterable[str], what: str
) -> DeclarationError:
    """The refusal of field `name`'s `value`, which is no `what` (`"column of table 'x'"`): it
    names the valid ones nearest to it, else the valid ones."""
    valid = sorted(set(known))
    near = difflib.get_close_matches(value, valid, n=3)
    if near:
        hint = "nearest: " + ", ".join(map(repr, near))
    elif valid:
        more = f" and {len(valid) - SHOWN_NAMES} more" if len(valid) > SHOWN_NAMES else ""
        hint = "none is near; valid: " + ", ".join(map(repr, valid[:SHOWN_NAMES])) + more
    else:
        hint = "there is none"
    return _refuse(case, name, f"{value!r} is no {what}; {hint}")


@dataclass(frozen=True)
class DailyPartitions:
    """How event tables are cut: one partition per calendar day in `timezone`, from `start` to
    the day before `end`. A raw timestamp is UTC; its day is the local day it falls on."""

    timezone: str
    start: str
    """First day, YYYY-MM-DD."""
    end: str
    """The day after the last one, YYYY-MM-DD."""

    def check(self, case: str) -> None:
        try:
            zoneinfo.ZoneInfo(self.timezone)
        except (ValueError, zoneinfo.ZoneInfoNotFoundError):
            raise _refuse(
                case, "partitions.timezone", f"{self.timezone!r} is no IANA time zone"
            ) from None
        days = []
        for name in ("start", "end"):
            try:
                days.append(dt.date.fromisoformat(getattr(self, name)))
            except ValueError:
                raise _refuse(
                    case, f"partitions.{name}", f"{getattr(self, name)!r} is not YYYY-MM-DD"
                ) from None
        if days[0] >= days[1]:
            raise _refuse(case, "partitions.end", f"{self.end} is not after start {self.start}")


def partition_day(partition_key: str) -> dt.date:
    """The calendar day a daily partition key names; refuses anything else by name."""
    try:
        day = dt.date.fromisoformat(partition_key)
    except (TypeError, ValueError):
        raise ValueError(f"partition key {partition_key!r} is not a YYYY-MM-DD day") from None
    if day.isoformat() != partition_key:
        raise ValueError(f"partition key {partition_key!r} is not a YYYY-MM-DD day")
    return day


@dataclass(frozen=True)
class EventTable:
    """A raw table that arrives a day at a time: ingested as `raw_<table>`, audited against its
    contract, published as `validated_<table>` with its broken rows in `quarantined_<table>`."""

    contract: TableContract
    description: str
    """What one day of it is, as the catalog shows it."""
    publish: "Callable[[pd.DataFrame], pd.DataFrame] | None" = None
    """Applied to each published chunk (e.g. flags derived from the row), Dagster-free."""
    counted_flags: tuple[str, ...] = ()
    """Boolean columns (after `publish`) whose true values are counted in the metadata."""
    grain: Literal["event", "entity_day"] | None = None
    """What one row is: `"event"`, one of possibly many events of an entity on a day, told apart
    by the contract's natural key (the event key, by which the per-event feature views and the
    label view are keyed, the entity's key carried as a field); `"entity_day"`, an entity's
    day, the natural key the entity's column alone. None: not said (a table of another shape,
    such as hourly observations)."""
    ahead: bool = False
    """Published before its day begins (a schedule, a plan, a calendar): what a day's
    predictions may read of the day itself. The run that predicts a day ingests it then; every
    other table of the day arrives after the day, with its outcomes."""
    revisions: Revisions = field(default_factory=Revisions)
    """How far a new version of a published day may fall short of the last good one (rows
    lost, a column emptied) before it is held back (`resources.revisions`)."""
    same_events_as: str | None = None
    """Another event table that describes the same events (a day's events and the plan of them):
    a day of either is held back when it holds fewer rows than the other's published day by
    more than its `revisions.max_row_loss`."""

    @property
    def name(self) -> str:
        return self.contract.table


@dataclass(frozen=True)
class Dimension:
    """A reference table loaded whole (not partitioned): a lookup that features or contracts
    read."""

    name: str
    description: str


@dataclass(frozen=True)
class Day:
    """A feature table's input: the published rows of `table` on the partition's day, handed to
    the builder as an iterable of chunks (a large day arrives a row group at a time)."""

    table: str


@dataclass(frozen=True)
class Trailing:
    """A feature table's input: the published rows of `table` on the `days` days before the
    partition's day (fewer at the start of the data, none missing), as an iterable of chunks of
    `columns`."""

    table: str
    days: int
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Lookup:
    """A feature table's input: a dimension table, whole, as a DataFrame."""

    table: str


FeatureInput = Day | Trailing | Lookup


@dataclass(frozen=True)
class FeatureTableSpec:
    """A daily feature table in the lake, an offline source of the use case's Feast views.

    `build(day, **inputs)` is Dagster-free: it gets the partition's day and each input by its
    name here, and returns a `ml.features.FeatureTable` or a `ml.features.TableStream`.

    `build_days(days, **inputs)`, optional, builds several consecutive days at once: each event
    table input then holds every day any of them reads (a trailing window from before the
    first day to the last), and the result has each day's rows, stamped (`event_timestamp`) at
    that day's local midnight, exactly as `build` gives them. A step of a range of days uses it
    to read and aggregate a shared history once instead of once a day."""

    name: str
    description: str
    build: "Callable[..., FeatureTable | TableStream]"
    inputs: Mapping[str, FeatureInput]
    build_days: "Callable[..., FeatureTable] | None" = None

    def reach(self) -> dict[str, tuple[int, bool]]:
        """For each event table the table reads: how many days before the day it reads back,
        and whether it reads the day itself."""
        reach: dict[str, tuple[int, bool]] = {}
        for source in self.inputs.values():
            if isinstance(source, Lookup):
                continue
            days, today = reach.get(source.table, (0, False))
            if isinstance(source, Trailing):
                reach[source.table] = (max(days, source.days), today)
            else:
                reach[source.table] = (days, True)
        return reach


@dataclass(frozen=True)
class Label:
    """What is predicted. The label view's source rows are the entity rows a training set and a
    day's scoring start from; its `column` is the label (rows without one are left out)."""

    view: str
    """The Feast feature view of outcomes (never served online)."""
    column: str
    task: Literal["binary", "regression"]
    table: str
    """The feature table behind `view`: the days it holds are the days with known outcomes."""
    event_timestamp: str = "event_timestamp"
    known_after: dt.timedelta = dt.timedelta(0)
    """The label delay: how long after a day ends every outcome of its events is known (a
    trip's once it has ended, hours after its day for a late one). The nightly run of a day, which
    publishes its outcomes and judges its predictions, may not start before it
    (`Automation.daily_at`). Less than a day: that run publishes a day's observations and
    outcomes together, and the next day's features and predictions wait for it, so a longer delay
    would hold every feature back by as long (outcomes on a cadence of their own are not
    built)."""

    def pending_at(self, daily_at: dt.time) -> str | None:
        """Why a nightly run at `daily_at` would come before its day's outcomes are all known;
        None when it would not."""
        if dt.timedelta(hours=daily_at.hour, minutes=daily_at.minute) >= self.known_after:
            return None
        return (
            f"{daily_at:%H:%M} is before the day's outcomes are all known: {self.table}'s label"
            f" delay (label.known_after) is {self.known_after} after the day ends"
        )


@dataclass(frozen=True)
class Prediction:
    """When an entity row is predicted. A training set's entity rows are taken as of the same
    instant as a day's predictions, so that the point-in-time join gives a model in training
    exactly the feature rows it is served: those stamped at or before that instant.

    - `"event"`: at the event's own instant (the label view's `event_timestamp`): what the event
      itself says is known then (a purchase scored as it happens);
    - `"day_start"`: at the start (local midnight) of the event's day: a day's events are
      predicted before the day begins, from what was known then (tomorrow's schedule, tonight).
      Feature rows of what is known ahead (a schedule, a calendar) are then stamped at the
      day's start, and observations when they became known."""

    at: Literal["event", "day_start"] = "event"
    entities: str | None = None
    """The feature table whose rows of a day are the entities predicted for that day, before
    its outcomes exist: built from tables published ahead of the day (`EventTable.ahead`) and
    from earlier days only, and holding every join key of the feature service. A day is then
    predicted the night before (`predict_day`) and judged once its outcomes are published.
    None: the label table's rows, scored once the day's outcomes are in (events scored as they
    happen, after the fact)."""


SPLIT_DAYS = ("start", "validation_start", "test_start", "end")
"""A training window's days, in order: each the first of its part, `end` the first after it."""


@dataclass(frozen=True)
class TrainingWindow:
    """The training set a retrain builds: the last `days` labelled days, split in time."""

    days: int = 31
    shares: tuple[float, float] = (0.70, 0.15)
    """Train and validation shares of the days; the test part gets the rest (a day at least)."""
    default: Mapping[str, str] = field(default_factory=dict)
    """The window `training_set` takes when its config leaves it out: start, validation_start,
    test_start, end (YYYY-MM-DD); empty: `days` ending at the partitions' last day."""

    def problem(self) -> tuple[str, str] | None:
        """The field and what is wrong with it, if anything: `default`, when given, names the
        four days of a split in order (what `make run` trains on as it stands)."""
        if self.days < 3:
            return "window.days", f"{self.days}: at least 3"
        if not self.default:
            return None
        if sorted(self.default) != sorted(SPLIT_DAYS):
            return "window.default", f"{sorted(self.default)}: give all of {list(SPLIT_DAYS)}"
        try:
            days = [dt.date.fromisoformat(self.default[name]) for name in SPLIT_DAYS]
        except (TypeError, ValueError):
            return "window.default", f"{dict(self.default)}: days are YYYY-MM-DD"
        if days != sorted(set(days)):
            return "window.default", f"{dict(self.default)}: the days must follow {SPLIT_DAYS}"
        return None

    def config(self, start: dt.date, last: dt.date) -> dict[str, str]:
        """The `training_set` config over the days [start, last], split by `shares` (a day each
        at least): what the nightly retrain and the drift sensor train on, and `make run` when
        given its days (else it trains on `default`)."""
        end = last + dt.timedelta(days=1)
        days = (end - start).days
        if days < 3:
            raise ValueError(f"a training window needs at least 3 days, got [{start}, {last}]")
        validation = min(max(int(days * self.shares[0]), 1), days - 2)
        test = min(max(int(days * sum(self.shares)), validation + 1), days - 1)
        return {
            "start": start.isoformat(),
            "validation_start": (start + dt.timedelta(days=validation)).isoformat(),
            "test_start": (start + dt.timedelta(days=test)).isoformat(),
            "end": end.isoformat(),
        }


@dataclass(frozen=True)
class Slice:
    """A slice of the test rows the gate judges: one per value of a column, or per bin."""

    name: str
    column: str
    """The training set's column, `<view>__<feature>`."""
    edges: tuple[float, ...] = ()
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class UseCase:
    """One use case of the lifecycle, declared."""

    name: str
    """Names its assets' key prefix and groups, jobs, schedules and sensor: lower_snake_case."""
    description: str
    partitions: DailyPartitions
    source: "Callable[[], RawSource]"
    """The raw data when no drop folder is configured (e.g. a data set bundled in a package)."""
    event_tables: tuple[EventTable, ...]
    dimensions: tuple[Dimension, ...]
    feature_tables: tuple[FeatureTableSpec, ...]
    feature_service: str
    """The Feast FeatureService a model is trained and served through (`feature_repo/`)."""
    label: Label
    registered_model: str
    """The MLflow registered model whose champion alias serves this use case."""
    window: TrainingWindow = field(default_factory=TrainingWindow)
    slices: tuple[Slice, ...] = ()
    gate: Policy | None = None
    """The gate a challenger must pass to replace the champion (`declare.gate`): a policy of the
    label's task. None: the task's default policy, which for a regression judges
    beats_baseline when a `baseline` is declared (`gate_policy`)."""
    drift: DriftSettings = field(default_factory=DriftSettings)
    realized: DecayPolicy = field(default_factory=DecayPolicy)
    """How the realized performance of its predictions is judged against the model's test
    figure, once their outcomes are known."""
    prediction: Prediction = field(default_factory=Prediction)
    """When an entity row is predicted, for training as for serving."""
    configs: Catalog = field(default_factory=Catalog)
    """Its catalog of named training configurations (`declare.catalog`: a folder of TOML files,
    `baseline` among them); none: only `baseline`, the generic defaults."""
    config: str = BASELINE
    """The catalog entry trained unless a run names another: the launchpad's defaults, the
    nightly retrain, the drift sensor's retrain and `make run`."""
    baseline: str | None = None
    """A column of the training set that is itself a naive forecast of the label (a regression's
    label a week before; a binary label's probability, such as the route's recent delay rate):
    evaluated beside the model on the same test rows, and by the default gate a model must beat
    it (`beats_baseline`). None for a multiclass label."""
    backtest: BacktestPolicy = field(default_factory=BacktestPolicy)
    """Its rolling backtest (`declare.backtest`, `ml.backtest`): a fold per month from the first
    one, each trained on the days before it and tested on the month."""
    search: SearchPolicy = field(default_factory=SearchPolicy)
    """What a study of its training tries (`declare.search`, `ml.tune`): the settings searched,
    the number of trials and how many run side by side."""
    automation: Automation = field(default_factory=Automation)
    """When the nightly run and the nightly retrain start, in the partitions' time zone."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise _refuse(self.name, "name", "must be lower_snake_case")
        self.partitions.check(self.name)
        tables = [t.name for t in self.event_tables]
        dimensions = [d.name for d in self.dimensions]
        features = [f.name for f in self.feature_tables]
        names = tables + dimensions + features
        if len(set(names)) != len(names):
            raise _refuse(self.name, "tables", f"names repeat: {sorted(names)}")
        for table in self.event_tables:
            if table.grain is not None and table.grain not in GRAINS:
                raise _refuse(
                    self.name,
                    f"event_tables[{table.name}].grain",
                    f"{table.grain!r} is not one of {GRAINS}",
                )
            if table.grain == "entity_day" and len(table.contract.natural_key) != 1:
                raise _refuse(
                    self.name,
                    f"event_tables[{table.name}].grain",
                    f"a row per entity and day is keyed by the entity alone, not by"
                    f" {table.contract.natural_key}; declare grain='event' if a row is an event",
                )
            if table.same_events_as is not None and table.same_events_as not in tables:
                raise _refuse(
                    self.name,
                    f"event_tables[{table.name}].same_events_as",
                    f"{table.same_events_as!r} is no declared event table",
                )
            for reference in table.contract.references:
                if reference.split(".")[0] not in dimensions:
                    raise _refuse(
                        self.name,
                        f"event_tables[{table.name}].contract",
                        f"refers to {reference!r}, but no dimension is declared by that name",
                    )
        for spec in self.feature_tables:
            for input_name, source in spec.inputs.items():
                known = dimensions if isinstance(source, Lookup) else tables
                if source.table not in known:
                    kind = "dimension" if isinstance(source, Lookup) else "event table"
                    raise _refuse(
                        self.name,
                        f"feature_tables[{spec.name}].inputs[{input_name}]",
                        f"{source.table!r} is no declared {kind}",
                    )
                if isinstance(source, Trailing):
                    field_name = f"feature_tables[{spec.name}].inputs[{input_name}].columns"
                    self._check_read_columns(field_name, source)
        if self.prediction.at not in PREDICTED_AT:
            raise _refuse(
                self.name, "prediction.at", f"{self.prediction.at!r} is not one of {PREDICTED_AT}"
            )
        if self.prediction.entities is not None:
            entities = self.prediction.entities
            if entities not in features:
                raise _refuse(self.name, "prediction.entities", f"{entities!r} is no feature table")
            if entities not in self.ahead_feature_tables:
                late = sorted(self._late_inputs(self.feature_table(entities)))
                raise _refuse(
                    self.name,
                    "prediction.entities",
                    f"{entities!r} reads the day's {late}, which arrive after the day: the"
                    " entities to predict must be known before it (EventTable.ahead)",
                )
        if self.label.task not in TASKS:
            raise _refuse(self.name, "label.task", f"{self.label.task!r} is not one of {TASKS}")
        if self.baseline is not None and self.label.task == "multiclass":
            raise _refuse(
                self.name, "baseline", "a multiclass label has no one-column naive forecast"
            )
        self._check_catalog()
        if self.gate is not None and self.gate.task != self.label.task:
            raise _refuse(
                self.name,
                "gate",
                f"a {self.gate.task} policy ({type(self.gate).__name__}) cannot judge a"
                f" {self.label.task} label",
            )
        if self.label.table not in features:
            raise _refuse(self.name, "label.table", f"{self.label.table!r} is no feature table")
        delay = self.label.known_after
        if not dt.timedelta(0) <= delay < dt.timedelta(days=1):
            raise _refuse(
                self.name,
                "label.known_after",
                f"{delay} is not in [0, 1 day): the nightly run publishes a day's outcomes with"
                " its observations",
            )
        if (automation := self.automation.problem()) is not None:
            raise _refuse(self.name, *automation)
        if (pending := self.label.pending_at(self.automation.daily_time)) is not None:
            raise _refuse(self.name, "automation.daily_at", pending)
        if (drift := self.drift.problem()) is not None:
            raise _refuse(self.name, *drift)
        if (window := self.window.problem()) is not None:
            raise _refuse(self.name, *window)
        if self.backtest.first and not self.backtests:
            fold = self.backtest.split(self.backtest.first_fold(self.partitions.start))
            raise _refuse(
                self.name,
                "backtest.first",
                f"the first fold's days [{fold['start']}, {fold['end']}) must lie in the"
                f" partitions [{self.partitions.start}, {self.partitions.end})",
            )

    @property
    def backtests(self) -> bool:
        """Whether it has a rolling backtest: its partitions hold its first fold whole (a
        declared `backtest.first` must; by default a use case of a few weeks has none)."""
        return self.backtest.fits(self.partitions.start, self.partitions.end)

    def _check_catalog(self) -> None:
        """Every entry of the catalog reads as one (its settings are checked where the training
        config is, `ml.catalog`), `baseline` among them, and `config` names one."""
        try:
            names = [entry.name for entry in self.configs.entries()]
        except CatalogError as error:
            raise _refuse(self.name, "configs", str(error)) from None
        if BASELINE not in names:
            raise _refuse(self.name, "configs", f"has no {BASELINE!r} entry: {names}")
        if self.config not in names:
            raise unknown_name(self.name, "config", self.config, names, "catalog entry")

    def _check_read_columns(self, name: str, source: Trailing) -> None:
        """A trailing window reads only columns its table publishes: those of its contract and
        the flags its `publish` adds (`counted_flags`)."""
        table = self.event_table(source.table)
        published = [*table.contract.column_names, *table.counted_flags]
        for column in source.columns:
            if column not in published:
                what = f"column of {table.name!r} (its contract's, or a counted flag)"
                raise unknown_name(self.name, name, column, published, what)

    def group(self, stage: str) -> str:
        """The asset group of one of this use case's stages (`flights_training`)."""
        return f"{self.name}_{stage}"

    def stage_of(self, group: str) -> str:
        """The stage of one of this use case's asset groups (`group`'s inverse)."""
        return group.removeprefix(f"{self.name}_")

    def name_for(self, base: str) -> str:
        """The name of this use case's job, schedule, sensor or op `base` (`flights_retrain`)."""
        return f"{self.name}_{base}"

    @property
    def gate_policy(self) -> Policy:
        """The policy the gate judges this use case's models by (`gate`, else its default)."""
        if self.gate is not None:
            return self.gate
        if self.label.task == "regression":
            return RegressionGatePolicy(require_baseline=self.baseline is not None)
        if self.label.task == "multiclass":
            return MulticlassGatePolicy()
        return GatePolicy(require_baseline=self.baseline is not None)

    @property
    def timezone(self) -> str:
        return self.partitions.timezone

    def event_table(self, name: str) -> EventTable:
        return next(t for t in self.event_tables if t.name == name)

    def same_events(self, table: EventTable) -> list[str]:
        """The event tables declared to describe the same events as `table`, either way."""
        return [
            other.name
            for other in self.event_tables
            if other is not table
            and (other.same_events_as == table.name or table.same_events_as == other.name)
        ]

    def feature_table(self, name: str) -> FeatureTableSpec:
        return next(t for t in self.feature_tables if t.name == name)

    @property
    def predicts_ahead(self) -> bool:
        """Whether a day is predicted before it begins (`Prediction.entities`), by its own run
        the night before, rather than scored with the day's other tables after it."""
        return self.prediction.entities is not None

    @property
    def ahead_tables(self) -> list[str]:
        """The event tables published before their day (`EventTable.ahead`)."""
        return [table.name for table in self.event_tables if table.ahead]

    @property
    def ahead_feature_tables(self) -> list[str]:
        """The feature tables a day's rows of which can be built before the day: every input of
        theirs is a table published ahead of it, the days before it, or a dimension."""
        return [spec.name for spec in self.feature_tables if not self._late_inputs(spec)]

    def _late_inputs(self, spec: FeatureTableSpec) -> set[str]:
        ahead = set(self.ahead_tables)
        return {
            source.table
            for source in spec.inputs.values()
            if isinstance(source, Day) and source.table not in ahead
        }
