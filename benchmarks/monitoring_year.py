"""A use case's monitoring over the year after its training, measured (docs/monitoring.md).

    .venv/bin/python -m benchmarks.monitoring_year --use-case flights
    .venv/bin/python -m benchmarks.monitoring_year --use-case ridership --through 2016-08-14

1. `make run`'s lifecycle (`cli.run.main`) in a home of its own: the champion trained on
   the use case's default window, its test days scored, the day after predicted.
2. Every day after the window, to `--through`, ingested and validated and its feature tables
   built, a backfill's batch of days per run.
3. Each of those days scored by `score_day`: predictions as of the day's start, the drift of the
   window up to it, the realized performance of the predictions against the champion's tested
   figure. Scoring after the year is ingested gives the figures the nightly order gives (each day
   predicted the night before, judged the day after): a day's predictions read nothing of the day
   or after it (tests/integration/test_prediction_ahead.py).

It writes every day's figures to `<home>/monitoring_year.json` and prints the month table in
Markdown: drift events, features past their warn and fail lines per day, the month's realized
metric with its bootstrap interval (the month's predictions pooled), the days judged decayed or
failed, and the decay events.
"""

import argparse
import datetime as dt
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A use case's monitoring over a year, measured.")
    parser.add_argument("--use-case", default="flights")
    parser.add_argument("--through", help="last day scored (default: the last partition)")
    parser.add_argument("--home", help="where it all goes (default: /tmp/ml-year-<use case>)")
    args = parser.parse_args(argv)
    home = Path(args.home or f"/tmp/ml-year-{args.use_case}").resolve()
    # Read when the definitions are built: the run's stores, never the repository's `.local`.
    os.environ["ML_LIFECYCLE_HOME"] = str(home)
    os.environ["DAGSTER_HOME"] = str(home / "dagster_home")

    from assets import asset_key
    from cli import run, run_jobs

    began = time.perf_counter()
    if run.main(["--use-case", args.use_case]) != 0:
        print("the lifecycle run failed: no champion to follow", file=sys.stderr)
        return 1
    trained = time.perf_counter() - began

    import dagster as dg

    from pipelines.definitions import SETTINGS, USE_CASES, defs
    from pipelines.jobs import definition_name

    case = run.choose_use_case(USE_CASES, args.use_case)
    last = dt.date.fromisoformat(case.partitions.end) - dt.timedelta(days=1)
    through = dt.date.fromisoformat(args.through) if args.through else last
    after = run.default_window(case)[1] + dt.timedelta(days=1)
    days = [(after + dt.timedelta(days=n)).isoformat() for n in range((through - after).days + 1)]

    def job(base: str) -> dg.JobDefinition:
        return defs.resolve_job_def(definition_name(case, base))

    scored: dict[str, dict] = {}
    with dg.DagsterInstance.get() as instance:
        outcomes = {}
        for at in range(0, len(days), SETTINGS.days_per_run):
            chunk = days[at : at + SETTINGS.days_per_run]
            outcomes |= run_jobs.run_days(job("ingest_and_validate"), instance, chunk)
        for stretch in run_jobs.published_stretches(days, outcomes):
            for day, done in run_jobs.run_days(job("build_features"), instance, stretch).items():
                outcomes[day] = outcomes[day].merged(done)
        prepared = time.perf_counter() - began - trained
        for day in days:
            if not outcomes[day].success:
                scored[day] = {"refused": outcomes[day].problems}
                continue
            result = run_jobs.run_assets(job("score_day"), instance, day, partition=day)
            scored[day] = {
                asset: _plain(result.assets.get(asset_key(case, asset).to_user_string()) or {})
                for asset in ("batch_predictions", "feature_drift", "realized_performance")
            } | {"success": result.success, "problem": result.problem}
            print(f"{day}: {_day_line(scored[day])}", flush=True)
    months = month_table(case, days, scored, home)
    seconds = {
        "lifecycle": round(trained, 1),
        "ingest_and_features": round(prepared, 1),
        "scoring": round(time.perf_counter() - began - trained - prepared, 1),
    }
    path = home / "monitoring_year.json"
    path.write_text(json.dumps({"days": scored, "months": months, "seconds": seconds}, indent=2))
    print()
    print(markdown(case, months))
    print(f"\nper day: {path}; seconds: {seconds}")
    return 0


def month_table(case, days: list[str], scored: dict[str, dict], home: Path) -> list[dict]:
    """Per month: the drift and realized-performance figures of its scored days."""
    import pandas as pd

    from assets.inference import LakeDays
    from ml.monitor import predicted_outcomes
    from ml.realized import measured
    from resources.lake import LakeFiles

    tables = LakeDays(case, LakeFiles(root=str(home / "lake")))
    policy = case.realized.for_task(case.label.task)
    output = "probability" if case.label.task == "binary" else "prediction"
    by_month: dict[str, list[str]] = defaultdict(list)
    for day in days:
        by_month[day[:7]].append(day)
    months = []
    for month, its_days in by_month.items():
        drift = [scored[d].get("feature_drift") or {} for d in its_days]
        real = [scored[d].get("realized_performance") or {} for d in its_days]
        joined = [
            frame
            for d in its_days
            if (frame := predicted_outcomes(tables, case.label, dt.date.fromisoformat(d)))
            is not None
        ]
        rows = pd.concat(joined, ignore_index=True) if joined else pd.DataFrame()
        threshold = 0.5 if case.label.task == "binary" else None  # ROC AUC ignores it
        measured = (
            measured(
                policy,
                rows[case.label.column].to_numpy(dtype="float64"),
                rows[output].to_numpy(dtype="float64"),
                case.label.task,
                threshold,
            )
            if not rows.empty
            else None
        )
        verdicts = [r.get("verdict") for r in real if r]
        months.append(
            {
                "month": month,
                "days": len(its_days),
                "drift_events": sum(bool(d.get("drift_event")) for d in drift),
                "failed_features_per_day": _mean(
                    [d.get("failed_features") or 0 for d in drift if d]
                ),
                "warned_features_per_day": _mean(
                    [d.get("warned_features") or 0 for d in drift if d]
                ),
                "score_psi_median": _median([d.get("score_psi") for d in drift if d]),
                "metric": policy.metric,
                "rows": measured.rows if measured else 0,
                "value": _finite(measured.value) if measured else None,
                "low": _finite(measured.low) if measured else None,
                "high": _finite(measured.high) if measured else None,
                "tested": next((r.get("tested") for r in real if r), None),
                "judged_ok": verdicts.count("ok"),
                "judged_decayed": verdicts.count("decayed"),
                "judged_failed": verdicts.count("failed"),
                "decay_events": sum(bool(r.get("decay_event")) for r in real),
            }
        )
    return months


def markdown(case, months: list[dict]) -> str:
    metric = months[0]["metric"] if months else "metric"
    lines = [
        f"| month | days | drift events | features past fail / warn per day | score PSI (median)"
        f" | realized {metric} [95% interval] | tested | windows ok / decayed / failed"
        " | decay events |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in months:
        value = "—" if m["value"] is None else f"{m['value']:.3f} [{m['low']:.3f}, {m['high']:.3f}]"
        tested = "—" if m["tested"] is None else f"{m['tested']:.3f}"
        lines.append(
            f"| {m['month']} | {m['days']} | {m['drift_events']}"
            f" | {m['failed_features_per_day']:.1f} / {m['warned_features_per_day']:.1f}"
            f" | {_fmt(m['score_psi_median'])} | {value} | {tested}"
            f" | {m['judged_ok']} / {m['judged_decayed']} / {m['judged_failed']}"
            f" | {m['decay_events']} |"
        )
    return "\n".join(lines)


def _day_line(figures: dict) -> str:
    drift, real = figures.get("feature_drift") or {}, figures.get("realized_performance") or {}
    metric = real.get("metric", "")
    return (
        f"score PSI {_fmt(drift.get('score_psi'))}, drift event {drift.get('drift_event')},"
        f" {drift.get('failed_features') or 0} features past fail;"
        f" {metric} day {_fmt(real.get(f'day_{metric}'))}"
        f" window {_fmt(real.get(f'window_{metric}'))} {real.get('verdict')}"
        + ("" if figures.get("success") else f"; FAILED: {figures.get('problem')}")
    )


def _plain(metadata: dict) -> dict:
    """The metadata worth keeping per day: numbers, flags, short texts, lists (no plots)."""
    return {
        k: v
        for k, v in metadata.items()
        if isinstance(v, bool | int | float | list) or (isinstance(v, str) and len(v) < 300)
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def _median(values: list) -> float | None:
    import statistics

    found = [float(v) for v in values if isinstance(v, int | float)]
    return statistics.median(found) if found else None


def _finite(value: float) -> float | None:
    import math

    return value if math.isfinite(value) else None


def _fmt(value) -> str:
    return "—" if not isinstance(value, int | float) else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())
