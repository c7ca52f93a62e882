"""P16: a training rank's peak resident memory as the training set grows.

    python -m benchmarks.stream_memory prepare FOLDER --rows N   # a training set of parts
    python -m benchmarks.stream_memory train FOLDER              # one rank, one epoch: JSON

`prepare` writes the synthetic training set (`benchmarks.training_speed`: the flights' columns
and types) of N rows as the `training_set` asset does (`ml.parts.write_parts`, the train split's
statistics in the manifest). `train` runs `python -m ml.train` on it, one process, one epoch,
and prints the peak resident set it reported (`ml.memory.peak_memory_bytes`) with its rows and
wall. A rank streams its share (`ml.streaming`), so the peak should stay where the runtime, the
model and two blocks of rows put it, whatever N.
"""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.training_speed import LABEL, synthetic_training_set


def prepare(folder: Path, rows: int) -> None:
    from ml.data import FitStats
    from ml.parts import write_parts

    write_parts(synthetic_training_set(rows), folder, "split", fit=FitStats())


def train(folder: Path) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-stream-") as out:
        argv = [sys.executable, "-m", "ml.train", "--data.training_set", str(folder)]
        argv += ["--data.label", LABEL, "--output_dir", out, "--optim.max_epochs", "1"]
        began = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True)
        seconds = time.perf_counter() - began
        result = json.loads((Path(out) / "result.json").read_text())
    from ml.parts import TrainingSetFiles

    return {
        "peak_rss_mib": result["peak_memory_bytes"] / 2**20,
        "rows": TrainingSetFiles.open(folder).rows(None),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="P16: a training rank's peak memory")
    parser.add_argument("command", choices=("prepare", "train"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rows", type=int, default=50_000)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.folder, args.rows)
    else:
        print(json.dumps(train(args.folder)))


if __name__ == "__main__":
    main()
