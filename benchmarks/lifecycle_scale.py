"""P2 and P12's `make run` side: the whole flights lifecycle (`python -m cli.run`) at a
synthetic scale-up of its own data, and the drop folders that hold that data.

    python -m benchmarks.lifecycle_scale prepare --scale 10 --out /tmp/drops-10x
    python -m benchmarks.lifecycle_scale makerun                      # bundled data (one JSON line)
    python -m benchmarks.lifecycle_scale makerun --drops /tmp/drops-10x
    python -m benchmarks.lifecycle_scale prepare --scale 2 --out D --window 2013-01-01 2013-01-04

`--window FIRST LAST` (both commands) narrows the training window from the default (the smoke
mode of `python -m benchmarks` runs four days).

`prepare` writes a drop folder (`resources.sources.DropFolderSource`'s layout) with every day
`make run` processes by default: the training window and its history lead-in (59 days, from
`cli.run.default_window` and `history_days`), each day's flights `--scale` times
(`benchmarks.large_drop.scaled_day`: copy k of a flight gets a tail number with k in front and
flights are numbered anew, so natural keys stay unique), the same flights without their outcome
columns as the day's `flight_schedule` (the table predictions read at the day's start; also for
the day after the window, which `make run` predicts ahead), the day's real weather once (its
natural key is the airport and hour: a copy would be a duplicate), and the dimension tables. At
scale 1 the flights are the real ones, read back from CSV.

`makerun` runs `python -m cli.run` in a fresh temporary home, as `make run` does on a fresh
checkout: `ML_LIFECYCLE_HOME` and `DAGSTER_HOME` under a temporary folder, the local instance
file installed there (`make instance`), `ML_LIFECYCLE_DROP_FOLDER` set when `--drops` is given
(the bundled data otherwise). It prints one JSON line: `seconds` (the command's wall time,
interpreter start to exit), `run_seconds` (what the run's own summary says), `peak_rss_mib` (the
largest single process of the tree: `getrusage(RUSAGE_CHILDREN).ru_maxrss`, which covers every
descendant that was waited for, torchrun's workers included), `tree_rss_peak_mib` (the whole
tree's RSS summed, sampled every 0.2 s: a lower bound of the true peak), and the training set's
`fingerprint` as the summary prints it (12 hex digits).
"""

import argparse
import datetime as dt
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTANCE_FILE = REPO / "deploy" / "dagster.local.yaml"
"""What `make instance` installs for the local profile (the Makefile's INSTANCE_FILE)."""
FINGERPRINT = re.compile(r"fingerprint ([0-9a-f]{12})")
RUN_SECONDS = re.compile(r"scoring in ([0-9.]+) s:")
SAMPLE_S = 0.2


Window = tuple[dt.date, dt.date] | None
"""The training window's first and last day; None: `make run`'s default."""


def window_days(window: Window = None) -> list[dt.date]:
    """The days `make run` processes for `window`: the history lead-in (from the first
    partition on), then the window."""
    from cli.run import default_window, history_days
    from usecases.flights import USE_CASE

    first, last = window or default_window(USE_CASE)
    first -= dt.timedelta(days=history_days(USE_CASE))
    first = max(first, dt.date.fromisoformat(USE_CASE.partitions.start))
    return [first + dt.timedelta(days=i) for i in range((last - first).days + 1)]


def prepare(scale: int, out: Path, window: Window = None) -> dict:
    """Write the drop folder of `scale` times the flights of every day; its row counts."""
    from benchmarks.large_drop import scaled_day, write_csv_drop
    from usecases.flights.contracts import OUTCOME_COLUMNS, WEATHER
    from usecases.flights.source import SCHEDULE, BundledFlightsSource

    source = BundledFlightsSource()
    out.mkdir(parents=True)
    for table in ("airlines", "airports", "planes"):
        source.read_table(table).frame.to_csv(out / f"{table}.csv", index=False)
    rows = {"flights": 0, SCHEDULE: 0, "weather": 0}
    days = window_days(window)
    ahead = days[-1] + dt.timedelta(days=1)
    for day in [*days, ahead]:
        flights = scaled_day(scale, day.isoformat())
        rows[SCHEDULE] += len(flights)
        write_csv_drop(flights.drop(columns=list(OUTCOME_COLUMNS)), out / SCHEDULE / f"{day}.csv")
        if day == ahead:  # predicted before it happens: only its schedule is known
            continue
        weather = source.read_day("weather", day, timestamp_columns=WEATHER.timestamp_columns)
        rows["flights"] += len(flights)
        rows["weather"] += len(weather.frame)
        write_csv_drop(flights, out / "flights" / f"{day}.csv")
        write_csv_drop(weather.frame, out / "weather" / f"{day}.csv")
    return {"scale": scale, "days": len(days), "first": str(days[0]), "last": str(days[-1]), **rows}


def makerun(drops: Path | None, keep: Path | None = None, window: Window = None) -> dict:
    """`python -m cli.run` in a fresh home; its wall time, peak RSS and fingerprint."""
    home = Path(tempfile.mkdtemp(prefix="bench-makerun-")) if keep is None else keep
    try:
        dagster_home = home / "dagster_home"
        dagster_home.mkdir(parents=True)
        shutil.copyfile(INSTANCE_FILE, dagster_home / "dagster.yaml")  # `make instance`
        env = {**os.environ, "ML_LIFECYCLE_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
        env.pop("ML_LIFECYCLE_ENV", None)  # the local profile, as `make run` on a laptop
        env.pop("ML_LIFECYCLE_DROP_FOLDER", None)
        if drops is not None:
            env["ML_LIFECYCLE_DROP_FOLDER"] = str(drops.resolve())
        log = home / "make-run.log"
        began = time.perf_counter()
        with log.open("w") as sink:
            process = subprocess.Popen(
                [sys.executable, "-m", "cli.run", *window_arguments(window)],
                cwd=REPO,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
            tree_peak = _TreeSampler(process.pid)
            tree_peak.start()
            code = process.wait()
            seconds = time.perf_counter() - began
            tree_peak.stop()
        output = log.read_text()
        gate = gate_verdict(home)
        # A gate that refuses the model is the lifecycle working: its cost is measured all the
        # same (nothing is then scored, which the verdict says). Any other failure is not.
        if code != 0 and not gate.startswith("reject"):
            raise RuntimeError(f"cli.run exited {code}; its output:\n{output[-4000:]}")
        fingerprint = FINGERPRINT.search(output)
        run_seconds = RUN_SECONDS.search(output)
        return {
            "exit_code": code,
            "gate": gate,
            "seconds": seconds,
            "run_seconds": float(run_seconds.group(1)) if run_seconds else None,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            "tree_rss_peak_mib": tree_peak.peak_mib,
            "fingerprint": fingerprint.group(1) if fingerprint else None,
            "drops": str(drops) if drops else "bundled",
        }
    finally:
        if keep is None:
            shutil.rmtree(home, ignore_errors=True)


def window_arguments(window: Window) -> list[str]:
    """`--start FIRST --end LAST` of `cli.run` (and the plain script); none by default."""
    return [] if window is None else ["--start", str(window[0]), "--end", str(window[1])]


def gate_verdict(home: Path) -> str:
    """The gate's verdict on the model the run trained, from the report it wrote: "promote", or
    "reject: " and the failed rules; "none" when no training got as far as the gate."""
    from ml.evaluate import GATE_REPORT  # after the measure: it imports Dagster
    from ml.gate import GateReport

    reports = sorted(home.glob(f"models/**/{GATE_REPORT}"), key=lambda p: p.stat().st_mtime)
    if not reports:
        return "none"
    report = GateReport.from_json(reports[-1].read_text())
    return report.decision if report.passed else f"reject: {'; '.join(report.reasons)}"


class _TreeSampler(threading.Thread):
    """The largest sum of RSS over a process and its descendants, sampled every SAMPLE_S."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_mib = pid, 0.0
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        root = psutil.Process(self.pid)
        while not self._done.wait(SAMPLE_S):
            total = 0
            try:
                for process in [root, *root.children(recursive=True)]:
                    try:
                        total += process.memory_info().rss
                    except psutil.Error:  # a child that ended between listing and reading
                        continue
            except psutil.Error:
                return
            self.peak_mib = max(self.peak_mib, total / 2**20)

    def stop(self) -> None:
        self._done.set()
        self.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    made = commands.add_parser("prepare", help="write a drop folder of the 59 days at --scale")
    made.add_argument("--scale", type=int, required=True)
    made.add_argument("--out", type=Path, required=True)
    run = commands.add_parser("makerun", help="one measure of `python -m cli.run`")
    run.add_argument("--drops", type=Path, help="a drop folder (default: the bundled data)")
    run.add_argument("--keep", type=Path, help="run in this new folder and keep it")
    for command in (made, run):
        command.add_argument(
            "--window", nargs=2, type=dt.date.fromisoformat, metavar=("FIRST", "LAST")
        )
    args = parser.parse_args()
    window = tuple(args.window) if args.window else None
    if args.command == "prepare":
        result = prepare(args.scale, args.out, window)
    else:
        result = makerun(args.drops, args.keep, window)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
