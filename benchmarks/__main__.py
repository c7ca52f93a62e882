"""`make bench`: measure every ratio, print one table, write benchmarks/results/latest.json.

python -m benchmarks              # every judged ratio
python -m benchmarks P6 P7 P8     # only these; latest.json keeps the others' last values
python -m benchmarks --info       # also the ratios printed for information only
python -m benchmarks --smoke      # every benchmark at toy sizes, once: does each still run?

`--smoke` runs each benchmark's whole path (its data, its processes, both sides, the table) at
the sizes of `SMOKE`, each measure once and without waiting for quiet cores. Its ratios say
nothing about performance and are never written to latest.json (the table is printed, marked
smoke); `tests/e2e/test_benchmarks.py` runs it so that a benchmark cannot rot unnoticed.
"""

import datetime as dt
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from importlib.metadata import version
from pathlib import Path

from benchmarks.harness import REPEATS, Ratio, as_json, measure, median
from benchmarks.training_speed import wait_for_quiet

RESULTS = Path(__file__).parent / "results" / "latest.json"
IDS = (
    *("P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10", "P11", "P12", "P13", "P14"),
    "P15",
    "P16",
    "P17",
)


@dataclass(frozen=True)
class Sizes:
    """How much each benchmark measures: `FULL` for the figures, `SMOKE` to see it run."""

    repeats: int = REPEATS
    """Measures of a ratio whose process takes seconds (its median is the figure)."""
    few: int = 3
    """Measures of a ratio whose process takes 10 s or more (GX's or Feast's import, a
    quarter's materialization): the median of three keeps `make bench` within 20 minutes."""
    validation_rows: tuple[int, ...] = (336_776, 1_000_000)
    scales: tuple[int, ...] = (1, 10)
    spark_scales: tuple[int, ...] = (1, 10)
    """P15's scales of make run's days: Spark against DuckDB at each, local[2] ÷ local[1] at the
    last (not in smoke mode: a second JVM for the same path)."""
    """P2 and P12: the flights of make run's days as they are, and ten times each day's rows."""
    lifecycle_window: tuple[dt.date, dt.date] | None = None
    """P2 and P12's training window; None: make run's default (59 days with the lead-in)."""
    feature_days: int = 365
    """Days of feature tables P4 joins (the year)."""
    materialized_days: int = 90
    """P5 on the year's first quarter (0.75M values): the same ratio as the year's, in a
    quarter of the time."""
    training_rows: int = 60_000
    """Synthetic training set: 42k train rows, 2.5 times the real one's, shaped like it."""
    feed_repeats: int = 7
    feed_epochs: int = 10
    run_epochs: int = 5
    checkpoint_blocks: tuple[int, int] = (12, 24)
    """P8's blocks at a checkpoint every 200 and every 50 steps."""
    serving_rows: tuple[int, int] = (100_000, 1_000_000)
    """Feature files for P10 and P11: P11 compares peak memory at 10x rows against 1x."""
    serving_batches: tuple[int, ...] = (1, 64, 4096, 65536)
    serving_blocks: int = 6
    endtoend_blocks: int = 4
    capacity_rows: int = 3_000
    """P14's training set (2,100 train rows): one epoch of the widest case in seconds."""
    capacity_cases: int = 9
    """P14's cases (`benchmarks.capacity_error.CASES`), from the first."""
    stream_rows: tuple[int, ...] = (50_000, 500_000, 1_500_000)
    """P16: a rank's training set at 1x, 10x and 30x the flights' (make run's 50,009 rows)."""
    study_trials: int = 8
    study_epochs: int = 3
    """P17's study: trials of this many epochs each (no early stop), on `training_rows`."""
    smoke: bool = False


FULL = Sizes()
SMOKE = Sizes(
    repeats=1,
    few=1,
    validation_rows=(2_000,),
    scales=(2,),
    spark_scales=(1,),
    lifecycle_window=(dt.date(2013, 1, 1), dt.date(2013, 1, 4)),
    feature_days=10,
    materialized_days=3,
    training_rows=3_000,
    feed_repeats=1,
    feed_epochs=1,
    run_epochs=1,
    checkpoint_blocks=(2, 2),
    serving_rows=(2_000, 4_000),
    serving_batches=(64,),
    serving_blocks=1,
    endtoend_blocks=1,
    capacity_rows=600,
    capacity_cases=1,
    study_trials=2,
    study_epochs=1,
    stream_rows=(2_000, 6_000),
    smoke=True,
)
"""Toy sizes: each benchmark's whole path in seconds. P2 runs `make run` once, at 2x rows of
four days (its fixed costs are most of a minute); P12, which needs two scales, is then not
measured."""


def settle(sizes: Sizes) -> None:
    """Before a measure, wait for quiet cores (not in smoke mode: it measures nothing)."""
    if not sizes.smoke:
        wait_for_quiet()


def p1_load_time(sizes: Sizes) -> Ratio:
    argv = ["-m", "benchmarks.load_time"]
    measure([*argv, "code_location"], repeats=1)  # warm the file cache
    location = median(measure([*argv, "code_location"], sizes.repeats), "seconds")
    dagster = median(measure([*argv, "dagster"], sizes.repeats), "seconds")
    value = location / dagster
    return Ratio.judged(
        "P1", "code-location load ÷ `import dagster`", location, dagster, value, "<= 1.5"
    )


def p2_p12_lifecycle(table: "Table", sizes: Sizes) -> None:
    """`make run` (`python -m cli.run` in a fresh home) against the plain script of the
    same compute (`benchmarks/plain_lifecycle.py`, its trailing tables built once as a script
    would), both reading the same drop folders, at 1x and 10x rows a day. One measure each: a
    `make run` takes minutes. Both sides must build the same training set (its fingerprint)."""
    from benchmarks.lifecycle_scale import window_arguments

    window = sizes.lifecycle_window
    windowed = [] if window is None else ["--window", *map(str, window)]
    plain_argv = ["-m", "benchmarks.plain_lifecycle", "--histories", "once"]
    plain_argv += window_arguments(window)
    runs, plains = {}, {}
    with tempfile.TemporaryDirectory(prefix="bench-lifecycle-") as folder:
        for scale in sizes.scales:
            drops = str(Path(folder) / f"{scale}x")
            subprocess.run(
                [
                    *(sys.executable, "-m", "benchmarks.lifecycle_scale", "prepare"),
                    *("--scale", str(scale), "--out", drops, *windowed),
                ],
                check=True,
                capture_output=True,
            )
            settle(sizes)
            (runs[scale],) = measure(
                ["-m", "benchmarks.lifecycle_scale", "makerun", "--drops", drops, *windowed], 1
            )
            settle(sizes)
            (plains[scale],) = measure([*plain_argv, "--drops", drops], repeats=1)
            assert runs[scale]["fingerprint"] == plains[scale]["fingerprint"], (
                f"{scale}x: make run and the plain script built different training sets"
            )
            print(f"     make run at {scale}x rows: the gate's verdict: {runs[scale]['gate']}")
            target = "<= 1.3" if scale == 1 else "<= 1.2"
            table.add(
                Ratio.judged(
                    "P2",
                    f"make run ÷ the plain script of its compute, {scale}x rows"
                    + verdict_note(runs[scale]),
                    runs[scale]["seconds"],
                    plains[scale]["seconds"],
                    runs[scale]["seconds"] / plains[scale]["seconds"],
                    target,
                )
            )
    if len(sizes.scales) < 2:
        print("     P12: not measured (one scale)", flush=True)
        return
    small, large = sizes.scales
    table.add(
        Ratio.judged(
            "P12",
            f"make run wall, {large}x ÷ {small}x rows a day"
            + "".join(verdict_note(runs[scale], scale) for scale in sizes.scales),
            runs[large]["seconds"],
            runs[small]["seconds"],
            runs[large]["seconds"] / runs[small]["seconds"],
            "<= 11",
        ),
        replace(
            Ratio.judged(
                "P12",
                f"make run peak RSS (largest process), {large}x ÷ {small}x (info)",
                runs[large]["peak_rss_mib"],
                runs[small]["peak_rss_mib"],
                runs[large]["peak_rss_mib"] / runs[small]["peak_rss_mib"],
                "<= 11",
            ),
            unit="MiB",
        ),
    )


def verdict_note(run: dict, scale: int | None = None) -> str:
    """What a ratio's line says when the gate refused the model: that run scored nothing (the
    plain script always scores), so its time is the lifecycle up to and including the gate."""
    if not run["gate"].startswith("reject"):
        return ""
    return f" (gate rejected{f' at {scale}x' if scale else ''}: not scored)"


def p3_validation(rows: int, sizes: Sizes) -> Ratio:
    argv = ["-m", "benchmarks.validation_speed"]
    gx = median(measure([*argv, "gx", "--rows", str(rows)], repeats=sizes.few), "seconds")
    pandas = median(measure([*argv, "pandas", "--rows", str(rows)], repeats=sizes.few), "seconds")
    value = pandas / gx  # rows/s of GX ÷ rows/s of pandas, same rows
    return Ratio.judged(
        "P3", f"GX rows/s ÷ hand-written pandas rows/s ({rows:,} rows)", gx, pandas, value, ">= 0.5"
    )


def p4_retrieval(home: Path, sizes: Sizes) -> Ratio:
    argv = ["-m", "benchmarks.feast_retrieval"]
    feast = median(measure([*argv, "feast", "--home", str(home)], sizes.few), "seconds")
    native = median(measure([*argv, "duckdb", "--home", str(home)], sizes.few), "seconds")
    value = native / feast  # rows/s through Feast ÷ rows/s of the native query, same rows
    what = "the year" if sizes.feature_days == 365 else f"{sizes.feature_days} days"
    return Ratio.judged(
        "P4", f"Feast retrieval ÷ native DuckDB ASOF JOIN ({what})", feast, native, value, ">= 0.5"
    )


def p5_materialization(home: Path, sizes: Sizes) -> Ratio:
    argv = ["-m", "benchmarks.feast_materialize"]
    days = ("--days", str(sizes.materialized_days))
    feast = measure([*argv, "feast", "--home", str(home), *days], repeats=sizes.few)
    floor = measure([*argv, "sqlite", "--home", str(home), *days], repeats=sizes.few)
    values = feast[0]["values"]
    assert all(s["values"] == values for s in feast + floor), "both sides write the same rows"
    value = median(floor, "seconds") / median(feast, "seconds")  # values/s ÷ values/s
    return Ratio.judged(
        "P5",
        f"Feast materialize ÷ SQLite upserts ({values / 1e6:.2f}M values)",
        median(feast, "seconds"),
        median(floor, "seconds"),
        value,
        ">= 0.5",
    )


def throughput(
    id: str, what: str, ours: float, reference: float, value: float, target: str
) -> Ratio:
    """A ratio of two speeds in samples/s (`value`: their median ratio, or the ratio of their
    medians), and whether it meets `target`."""
    return replace(Ratio.judged(id, what, ours, reference, value, target), unit="samples/s")


def alternated(
    sides: dict[str, list[str]], sizes: Sizes, repeats: int | None = None
) -> dict[str, list[dict]]:
    """Each side measured `repeats` times (default: `sizes.repeats`), a fresh process each, the
    sides taking turns after a quiet moment: a load from elsewhere, or the machine slowing down,
    falls on both alike."""
    out: dict[str, list[dict]] = {side: [] for side in sides}
    for _ in range(sizes.repeats if repeats is None else repeats):
        for side, argv in sides.items():
            settle(sizes)
            out[side] += measure(argv, repeats=1)
    return out


def paired(ours: list[dict], reference: list[dict], key: str) -> float:
    """The median of the ratios of measures taken side by side (the same round)."""
    return statistics.median(a[key] / b[key] for a, b in zip(ours, reference, strict=True))


def p6_feed(data: Path, threads: int, sizes: Sizes) -> Ratio:
    argv = ["-m", "benchmarks.training_speed", "feed", "--data", str(data)]
    argv += ["--threads", str(threads), "--epochs", str(sizes.feed_epochs)]
    # Each measure compares both feeds.
    runs = alternated({"feeds": argv}, sizes, sizes.feed_repeats)["feeds"]
    return throughput(
        "P6",
        f"train samples/s, ml.train's feed ÷ pre-sliced, {threads} thread(s)",
        median(runs, "gather"),
        median(runs, "presliced"),
        median(runs, "ratio"),
        ">= 0.95",
    )


def run_argv(
    data: Path, processes: int, threads: int, batch: int, epochs: int, strategy: str = "ddp"
) -> list[str]:
    return [
        *("-m", "benchmarks.training_speed", "run", "--data", str(data)),
        *("--processes", str(processes), "--threads", str(threads), "--batch", str(batch)),
        *("--epochs", str(epochs), "--strategy", strategy),
    ]


def p7_layouts(data: Path, sizes: Sizes) -> list[Ratio]:
    from ml.config import TrainConfig
    from ml.layout import choose_layout

    epochs = sizes.run_epochs
    sides = {"2x1": run_argv(data, 2, 1, 512, epochs), "1x2": run_argv(data, 1, 2, 1024, epochs)}
    runs = alternated(sides, sizes)
    speeds = {side: median(samples, "samples_per_s") for side, samples in runs.items()}
    ddp = throughput(
        "P7",
        "DDP 2 processes x 1 thread ÷ 1 x 2 threads, batch 1024",
        speeds["2x1"],
        speeds["1x2"],
        paired(runs["2x1"], runs["1x2"], "samples_per_s"),
        ">= 1.0",
    )
    settle(sizes)
    with tempfile.TemporaryDirectory(prefix="bench-layout-") as folder:
        layout = choose_layout(2, data, TrainConfig(), cache=Path(folder) / "layouts.json")
    print(f"ml.layout: {layout.reason}")
    name = f"{layout.processes}x{layout.threads_per_process}"
    other = "1x2" if name == "2x1" else "2x1"
    picked = throughput(
        "P7",
        f"the layout ml.layout picks ({name}) ÷ the faster one",
        speeds[name],
        max(speeds.values()),
        min(paired(runs[name], runs[other], "samples_per_s"), 1.0),  # 1 when it is the faster
        ">= 1.0",
    )
    return [ddp, picked]


def p13_fsdp(data: Path, sizes: Sizes) -> Ratio:
    """FSDP2 against DDP: the same MLP, data and global batch, 2 processes x 1 thread (gloo),
    taking turns."""
    epochs = sizes.run_epochs
    sides = {
        "fsdp": run_argv(data, 2, 1, 512, epochs, "fsdp"),
        "ddp": run_argv(data, 2, 1, 512, epochs, "ddp"),
    }
    runs = alternated(sides, sizes)
    return throughput(
        "P13",
        "FSDP2 ÷ DDP, 2 processes x 1 thread, batch 512 per process",
        median(runs["fsdp"], "samples_per_s"),
        median(runs["ddp"], "samples_per_s"),
        paired(runs["fsdp"], runs["ddp"], "samples_per_s"),
        ">= 0.8",
    )


def p8_checkpoints(data: Path, info: bool, sizes: Sizes) -> list[Ratio]:
    """From a checkpoint's time and a step's, both measured while training: the effect at
    k = 200 (~0.8%) is far below this machine's jitter (±30% between blocks of the same work),
    so the blocks' own ratio is only printed."""
    argv = ["-m", "benchmarks.training_speed", "checkpoints", "--data", str(data)]
    ratios = []
    judged, informative = sizes.checkpoint_blocks
    for every, blocks, note in ((200, judged, ""), (50, informative, " (info)"))[: 1 + info]:
        runs = alternated(
            {"blocks": [*argv, "--every", str(every), "--blocks", str(blocks)]}, sizes
        )
        checkpoint_s = median(runs["blocks"], "checkpoint_ms") / 1000
        step_s = median(runs["blocks"], "step_ms") / 1000
        without = 512 / step_s
        with_ = every * 512 / (every * step_s + checkpoint_s)
        print(
            f"P8 k={every}: a checkpoint {1000 * checkpoint_s:.1f} ms, {every} steps"
            f" {every * step_s:.2f} s; blocks with ÷ without checkpoints, side by side:"
            f" {median(runs['blocks'], 'ratio'):.3f}"
        )
        ratios.append(
            throughput(
                "P8",
                f"train samples/s, checkpoint every {every} steps ÷ none{note}",
                with_,
                without,
                with_ / without,
                ">= 0.98",
            )
        )
    return ratios


def serving(
    folder: Path, sizes: Sizes, command: str, *args: object, repeats: int | None = None
) -> list[dict]:
    argv = ["-m", "benchmarks.serving_speed", command, "--folder", str(folder)]
    settle(sizes)
    return measure([*argv, *map(str, args)], sizes.repeats if repeats is None else repeats)


def p9_onnxruntime(folder: Path, info: bool, sizes: Sizes) -> list[Ratio]:
    """Medians of ratios measured inside each process (the two sides take turns)."""
    ratios = []
    layouts = ((1, False, sizes.repeats), (2, False, sizes.repeats), (1, True, sizes.few))
    for threads, served, repeats in layouts[: len(layouts) if info else 1]:
        for batch in sizes.serving_batches:
            command = "served" if served else "network"
            args = ("--threads", threads, "--batch", batch, "--blocks", sizes.serving_blocks)
            runs = serving(folder, sizes, command, *args, repeats=repeats)
            what = "served graph ÷ torch + Preprocessor" if served else "network"
            note = "" if threads == 1 and not served else " (info)"
            ratios.append(
                throughput(
                    "P9",
                    f"ORT ÷ torch eager rows/s, {what}, {threads}t, batch {batch}{note}",
                    median(runs, "onnxruntime_rows_per_s"),
                    median(runs, "torch_rows_per_s"),
                    median(runs, "ratio"),
                    ">= 1.2",
                )
            )
    return ratios


def p10_endtoend(folder: Path, sizes: Sizes) -> Ratio:
    rows = sizes.serving_rows[-1]
    runs = serving(folder, sizes, "endtoend", "--rows", rows, "--blocks", sizes.endtoend_blocks)
    return throughput(
        "P10",
        f"Parquet → score_to_parquet ÷ session.run alone ({rows:,} rows)",
        median(runs, "endtoend_rows_per_s"),
        median(runs, "run_rows_per_s"),
        median(runs, "ratio"),
        ">= 0.8",
    )


def p11_memory(folder: Path, info: bool, sizes: Sizes) -> list[Ratio]:
    """At 16,384 rows a batch, 1x rows is 7 batches: enough to fill the pipeline (reading,
    scoring, writing overlap, so three batches are in memory). At 65,536, 1x is under two
    batches and never does: that ratio is for information."""
    small, large = sizes.serving_rows
    ratios = []
    for batch, note in ((16_384, ""), (65_536, " (info)"))[: 2 if info else 1]:
        peaks = {
            rows: median(
                serving(folder, sizes, "rss", "--rows", rows, "--batch", batch), "peak_rss_mib"
            )
            for rows in (small, large)
        }
        ratio = Ratio.judged(
            "P11",
            f"peak RSS, batch inference {large:,} ÷ {small:,} rows, batch {batch:,}{note}",
            peaks[large],
            peaks[small],
            peaks[large] / peaks[small],
            "<= 1.3",
        )
        ratios.append(replace(ratio, unit="MiB"))
    return ratios


def p14_capacity(sizes: Sizes) -> list[Ratio]:
    """Per case (`benchmarks.capacity_error`), the median over fresh trainings of
    |estimated - measured peak| ÷ measured; estimated and measured in MiB beside it."""
    from benchmarks.capacity_error import CASES

    ratios = []
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as folder:
        data = Path(folder) / "training_set.parquet"
        argv = ["-m", "benchmarks.capacity_error", "data", str(data)]
        subprocess.run([sys.executable, *argv, "--rows", str(sizes.capacity_rows)], check=True)
        for case in CASES[: sizes.capacity_cases]:
            settle(sizes)
            runs = measure(case.argv(data), sizes.few)
            ratio = Ratio.judged(
                "P14",
                f"capacity estimate's error, {case.name}",
                median(runs, "estimated_bytes") / 2**20,
                median(runs, "peak_bytes") / 2**20,
                median(runs, "error"),
                "<= 0.2",
            )
            ratios.append(replace(ratio, unit="MiB"))
    return ratios


def p15_spark_join(sizes: Sizes) -> list[Ratio]:
    """The training set's join on Spark: `local[2]` ÷ `local[1]` at the largest scale (judged),
    and Spark `local[2]` ÷ DuckDB at each scale (reported), every side giving the same rows."""
    from benchmarks.lifecycle_scale import window_arguments

    scales = sizes.spark_scales
    argv = [sys.executable, "-m", "benchmarks.spark_join"]
    seconds: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-spark-") as folder:
        for scale in scales:
            home = str(Path(folder) / f"{scale}x")
            window = window_arguments(sizes.lifecycle_window)
            window = ["--window", *window[1::2]] if window else []
            prepare = [*argv, "prepare", "--scale", str(scale), "--home", home, *window]
            subprocess.run(prepare, check=True, capture_output=True)
            join = [*argv[1:], "join", "--home", home, "--engine"]
            sides = {"duckdb": [*join, "duckdb"], "local[2]": [*join, "spark"]}
            if scale == scales[-1] and not sizes.smoke:  # smoke: the same path, one master
                sides["local[1]"] = [*join, "spark", "--master", "local[1]"]
            measured = alternated(sides, sizes, repeats=sizes.few)
            prints = {s["fingerprint"] for side in measured.values() for s in side}
            if len(prints) != 1:
                raise RuntimeError(f"P15 at {scale}x: the engines joined different rows: {prints}")
            for side, samples in measured.items():
                seconds[(scale, side)] = median(samples, "seconds")
    # Ratios of speeds (rows/s) from the seconds each side took for the same rows.
    ratios = []
    top = scales[-1]
    if (top, "local[1]") in seconds:
        two, one = seconds[(top, "local[2]")], seconds[(top, "local[1]")]
        what = f"Spark join rows/s, local[2] ÷ local[1] ({top}x rows)"
        ratios.append(Ratio.judged("P15", what, two, one, one / two, ">= 1.6"))
    for scale in scales:
        spark, duckdb = seconds[(scale, "local[2]")], seconds[(scale, "duckdb")]
        what = f"Spark local[2] ÷ DuckDB join rows/s ({scale}x rows)"
        reported = Ratio.judged("P15", what, spark, duckdb, duckdb / spark, ">= 0")
        ratios.append(replace(reported, target="reported"))
    return ratios


def p16_stream_memory(sizes: Sizes) -> list[Ratio]:
    """A training rank's peak resident set (one process, one epoch, `benchmarks.stream_memory`)
    on the synthetic training set at each of `stream_rows`, stored as the asset stores it: the
    largest ÷ the smallest judged, the others reported."""
    ratios, peaks = [], {}
    smallest, largest = sizes.stream_rows[0], sizes.stream_rows[-1]
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as folder:
        for rows in sizes.stream_rows:
            data = Path(folder) / f"rows-{rows}"
            argv = ["-m", "benchmarks.stream_memory", "prepare", str(data), "--rows", str(rows)]
            subprocess.run([sys.executable, *argv], check=True)
            settle(sizes)
            runs = measure(["-m", "benchmarks.stream_memory", "train", str(data)], sizes.few)
            peaks[rows] = median(runs, "peak_rss_mib")
            shutil.rmtree(data)
    for rows in sizes.stream_rows[1:]:
        ratio = Ratio.judged(
            "P16",
            f"a training rank's peak RSS, {rows:,} ÷ {smallest:,} rows"
            + ("" if rows == largest else " (reported)"),
            peaks[rows],
            peaks[smallest],
            peaks[rows] / peaks[smallest],
            "<= 1.3",
        )
        ratio = replace(ratio, unit="MiB")
        ratios.append(ratio if rows == largest else replace(ratio, target="reported"))
    return ratios


def p17_study(data: Path, sizes: Sizes) -> Ratio:
    """A study's wall, its trials 2 side by side against one at a time: the `study` asset on
    the synthetic training set (`benchmarks.study_speed`), the sides taking turns. The same
    trials on both sides: the same values (a seeded random start) and the same layout (a core
    each, as the study declares 2 workers), each the same number of epochs."""
    argv = ["-m", "benchmarks.study_speed", "--data", str(data)]
    argv += ["--trials", str(sizes.study_trials), "--epochs", str(sizes.study_epochs)]
    sides = {workers: [*argv, "--workers", workers] for workers in ("2", "1")}
    runs = alternated(sides, sizes, sizes.few)
    for two, one in zip(runs["2"], runs["1"], strict=True):
        if two["best_validation_loss"] != one["best_validation_loss"]:
            raise RuntimeError(f"P17: the two sides trained different trials: {two} against {one}")
    return Ratio.judged(
        "P17",
        f"a study's wall, {sizes.study_trials} trials, 2 side by side ÷ 1 at a time",
        median(runs["2"], "seconds"),
        median(runs["1"], "seconds"),
        paired(runs["2"], runs["1"], "seconds"),
        "<= 0.6",
    )


HEADER = "id   ratio" + " " * 56 + "value   target          (numerator / denominator)"


class Table:
    """The ratios in the order they are measured, each printed the moment it is: a run of many
    minutes shows its results as it goes, with the time each part took."""

    def __init__(self) -> None:
        self.ratios: list[Ratio] = []
        self.began = time.monotonic()
        print(HEADER, flush=True)

    def add(self, *ratios: Ratio) -> None:
        for ratio in ratios:
            self.ratios.append(ratio)
            print(ratio.row(), flush=True)

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        began = time.monotonic()
        yield
        now = time.monotonic()
        print(f"     ({name}: {now - began:.0f} s; {now - self.began:.0f} s so far)", flush=True)


def main(ids: list[str], info: bool = False, sizes: Sizes = FULL) -> None:
    unknown = sorted(set(ids) - set(IDS))
    if unknown:
        raise SystemExit(f"unknown ratio id(s) {unknown}; known: {', '.join(IDS)}")
    wanted = set(ids or IDS)
    if sizes.smoke:
        print("SMOKE: toy sizes, one measure each; the ratios below are not figures.", flush=True)
    table = Table()
    if "P1" in wanted:
        with table.part("P1"):
            table.add(p1_load_time(sizes))
    if wanted & {"P2", "P12"}:
        with table.part("P2, P12"):
            p2_p12_lifecycle(table, sizes)
    if "P3" in wanted:
        with table.part("P3"):
            for rows in sizes.validation_rows:
                table.add(p3_validation(rows, sizes))
    if wanted & {"P4", "P5"}:
        with tempfile.TemporaryDirectory(prefix="bench-features-") as home, table.part("P4, P5"):
            # The year's feature tables, built once by the functions the assets call.
            subprocess.run(
                [
                    *(sys.executable, "-m", "benchmarks.feature_data", str(Path(home) / "lake")),
                    *("--days", str(sizes.feature_days)),
                ],
                check=True,
                capture_output=True,
            )
            if "P4" in wanted:
                table.add(p4_retrieval(Path(home), sizes))
            if "P5" in wanted:
                table.add(p5_materialization(Path(home), sizes))
    if "P15" in wanted:
        with table.part("P15"):
            table.add(*p15_spark_join(sizes))
    if "P16" in wanted:
        with table.part("P16"):
            table.add(*p16_stream_memory(sizes))
    if wanted & {"P6", "P7", "P8", "P13", "P17"}:
        with tempfile.TemporaryDirectory(prefix="bench-training-") as folder:
            data = Path(folder) / "training_set.parquet"
            subprocess.run(
                [
                    *(sys.executable, "-m", "benchmarks.training_speed", "data", str(data)),
                    *("--rows", str(sizes.training_rows)),
                ],
                check=True,
                capture_output=True,
            )
            if "P6" in wanted:
                with table.part("P6"):
                    table.add(*(p6_feed(data, threads, sizes) for threads in (1, 2)))
            if "P7" in wanted:
                with table.part("P7"):
                    table.add(*p7_layouts(data, sizes))
            if "P8" in wanted:
                with table.part("P8"):
                    table.add(*p8_checkpoints(data, info, sizes))
            if "P13" in wanted:
                with table.part("P13"):
                    table.add(p13_fsdp(data, sizes))
            if "P17" in wanted:
                with table.part("P17"):
                    table.add(p17_study(data, sizes))
    if wanted & {"P9", "P10", "P11"}:
        with tempfile.TemporaryDirectory(prefix="bench-serving-") as folder:
            subprocess.run(
                [
                    *(sys.executable, "-m", "benchmarks.serving_speed", "prepare", folder),
                    *("--rows", *map(str, sizes.serving_rows)),
                ],
                check=True,
                capture_output=True,
            )
            if "P9" in wanted:
                with table.part("P9"):
                    table.add(*p9_onnxruntime(Path(folder), info, sizes))
            if "P10" in wanted:
                with table.part("P10"):
                    table.add(p10_endtoend(Path(folder), sizes))
            if "P11" in wanted:
                with table.part("P11"):
                    table.add(*p11_memory(Path(folder), info, sizes))
    if "P14" in wanted:
        with table.part("P14"):
            table.add(*p14_capacity(sizes))
    print()
    print(HEADER)
    for ratio in table.ratios:
        print(ratio.row())
    if sizes.smoke:
        seconds = time.monotonic() - table.began
        print(f"\nSMOKE: every benchmark ran ({seconds:.0f} s); nothing written", flush=True)
        return
    kept = []
    if ids and RESULTS.is_file():  # a partial run keeps the other ratios' last values
        kept = [r for r in json.loads(RESULTS.read_text())["ratios"] if r["id"] not in wanted]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                "machine": f"{platform.node()} {platform.machine()} {platform.python_version()}",
                "seconds": round(time.monotonic() - table.began),
                "versions": {
                    p: version(p)
                    for p in (
                        *("dagster", "great-expectations", "pandas", "feast", "duckdb", "torch"),
                        *("onnx", "onnxruntime", "pyarrow"),
                    )
                },
                "ratios": sorted(kept + as_json(table.ratios), key=lambda r: IDS.index(r["id"])),
            },
            indent=2,
        )
    )
    print(f"\nwritten: {RESULTS} ({time.monotonic() - table.began:.0f} s)")


if __name__ == "__main__":
    arguments = sys.argv[1:]
    flags = {"--info", "--smoke"}
    main(
        [a for a in arguments if a not in flags],
        info="--info" in arguments,
        sizes=SMOKE if "--smoke" in arguments else FULL,
    )
