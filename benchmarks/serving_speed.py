"""P9, P10, P11: serving the exported ONNX model (`ml.export`, `ml.predict`).

    python -m benchmarks.serving_speed prepare FOLDER --rows 100000 1000000    # once
    python -m benchmarks.serving_speed network --folder FOLDER --threads 1 --batch 64
    python -m benchmarks.serving_speed served --folder FOLDER --threads 1 --batch 64
    python -m benchmarks.serving_speed endtoend --folder FOLDER --rows 100000
    python -m benchmarks.serving_speed rss --folder FOLDER --rows 1000000

`prepare` fits the preprocessor on a synthetic training set shaped like the real one
(`benchmarks.training_speed.synthetic_training_set`, 60,000 rows), builds the default model
(`ml.config.ModelConfig`, seeded initialisation: speed does not depend on the weights), saves its
weights, and exports both the network alone (`ml.export.network_onnx`) and the served graph
(`ml.export.export`). It also writes feature files of the given row counts (the training set's
feature columns and `flight_id`, other rows of the same distribution), in row groups of 65,536
rows as the pipeline writes its tables.

`network` is P9: torch eager (`inference_mode`) against onnxruntime on the same float32/int64
tensors, `--threads` threads each, batches of `--batch` rows prepared before any timing; the two
take turns block by block (ABBA) inside one process after a warm-up block each. `served` is
the same from raw feature values: `Scorer.predict` (inputs built, served graph run) against
torch with `Preprocessor.inputs` and a sigmoid, each side building its inputs inside the timing
(for information). `endtoend` is P10, ABBA too: `ml.predict.parquet_batches` →
`ml.predict.score_to_parquet` (Parquet in, predictions written) against the served graph's
`session.run` alone on inputs built beforehand from the same rows, same batches. `rss` is P11:
one batch-inference run in this fresh process, and its peak RSS.

Each prints one JSON line.
"""

import argparse
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.training_speed import LABEL, synthetic_training_set

TRAINING_ROWS = 60_000
ROW_GROUP_ROWS = 65_536
BLOCK_ROWS = {1: 2_000, 64: 32_768, 4096: 131_072, 65536: 262_144}
"""Rows per timed block of each batch size: long enough to time, short enough to alternate."""
SEED = 2013


def prepare(folder: Path, rows: list[int]) -> None:
    import torch
    from safetensors.torch import save_file

    from ml import export
    from ml.config import ModelConfig
    from ml.data import Preprocessor
    from ml.model import TabularNet

    folder.mkdir(parents=True, exist_ok=True)
    training = synthetic_training_set(TRAINING_ROWS, seed=0)
    preprocessor = Preprocessor.fit(training[training["split"] == "train"])
    torch.manual_seed(SEED)
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    model.eval()
    (folder / "preprocessor.json").write_text(preprocessor.to_json())
    save_file(model.state_dict(), folder / "weights.safetensors")
    (folder / "network.onnx").write_bytes(
        export.network_onnx(model, preprocessor).SerializeToString()
    )
    export.export(model, preprocessor, folder / "served.onnx", {"model_version": "bench"})
    for count in rows:
        frame = synthetic_training_set(count, seed=1).drop(columns=[LABEL, "split"])
        table = pa.Table.from_pandas(frame, preserve_index=False)
        pq.write_table(table, folder / f"features_{count}.parquet", row_group_size=ROW_GROUP_ROWS)


def load_model(folder: Path):
    from safetensors.torch import load_file

    from ml.config import ModelConfig
    from ml.data import Preprocessor
    from ml.model import TabularNet

    preprocessor = Preprocessor.from_json((folder / "preprocessor.json").read_text())
    model = TabularNet(preprocessor.numeric_width, preprocessor.cardinalities, ModelConfig())
    model.load_state_dict(load_file(folder / "weights.safetensors"))
    return model.eval(), preprocessor


def session(path: Path, threads: int):
    """The session serving builds (`ml.predict.open_session`), of the graph at `path`."""
    from ml.predict import open_session

    return open_session(path, threads=threads)


def features(folder: Path, rows: int) -> pd.DataFrame:
    """`rows` rows of the smallest feature file (repeated if it is shorter)."""
    path = min(folder.glob("features_*.parquet"), key=lambda p: int(p.stem.split("_")[1]))
    frame = pd.read_parquet(path)
    return pd.concat([frame] * -(-rows // len(frame)), ignore_index=True).iloc[:rows]


def alternate(sides: dict, batches: int, blocks: int) -> dict[str, float]:
    """Each side's callable run over `batches` batches per block, one warm-up block each, then
    `blocks` blocks per side in ABBA order; the seconds per side, and the median of the blocks'
    ratios (first side's rows/s ÷ second's)."""
    names = list(sides)
    for name in names:
        sides[name](batches)
    seconds = {name: [] for name in names}
    for block in range(blocks):
        for name in names if block % 2 == 0 else reversed(names):
            started = time.perf_counter()
            sides[name](batches)
            seconds[name].append(time.perf_counter() - started)
    first, second = names
    ratio = statistics.median(b / a for a, b in zip(seconds[first], seconds[second], strict=True))
    return {**{name: sum(s) for name, s in seconds.items()}, "ratio": ratio}


def time_network(folder: Path, threads: int, batch: int, served: bool, blocks: int) -> dict:
    """P9 (network) or its served-graph variant: onnxruntime ÷ torch eager rows/s."""
    import torch

    from ml.predict import Scorer

    torch.set_num_threads(threads)
    model, preprocessor = load_model(folder)
    rows = BLOCK_ROWS[batch]
    frame = features(folder, max(rows, batch))
    count = rows // batch
    frames = [frame.iloc[i * batch : (i + 1) * batch] for i in range(count)]
    if served:
        # Raw feature values in, probabilities out, each side building its own inputs from the
        # same frames: the served graph against the eager way to serve the same model.
        scorer = Scorer.load(folder / "served.onnx", threads=threads)

        def torch_side(n: int) -> None:
            with torch.inference_mode():
                for f in frames[:n]:
                    torch.sigmoid(model(*preprocessor.inputs(f)))

        def ort_side(n: int) -> None:
            for f in frames[:n]:
                scorer.predict(f)
    else:
        tensors = [preprocessor.inputs(f) for f in frames]
        ort_inputs = [{"numeric": n.numpy(), "categorical": c.numpy()} for n, c in tensors]
        ort_run = session(folder / "network.onnx", threads).run

        def torch_side(n: int) -> None:
            with torch.inference_mode():
                for numeric, categorical in tensors[:n]:
                    model(numeric, categorical)

        def ort_side(n: int) -> None:
            for inputs in ort_inputs[:n]:
                ort_run(None, inputs)

    timed = alternate({"onnxruntime": ort_side, "torch": torch_side}, count, blocks)
    total = blocks * count * batch
    return {
        "onnxruntime_rows_per_s": total / timed["onnxruntime"],
        "torch_rows_per_s": total / timed["torch"],
        "ratio": timed["ratio"],
    }


def time_endtoend(folder: Path, rows: int, batch: int, blocks: int) -> dict:
    """P10: Parquet in → predictions written, ÷ the served graph's `run` on the same batches."""
    import datetime as dt

    from ml.predict import Scorer, parquet_batches, score_to_parquet

    path = folder / f"features_{rows}.parquet"
    scorer = Scorer.load(folder / "served.onnx", threads=1)
    inputs = [scorer.inputs(f) for f in parquet_batches(path, batch_rows=batch)]
    constants = {"model_version": "bench", "predicted_at": dt.datetime.now(dt.UTC)}

    with tempfile.TemporaryDirectory(prefix="bench-scores-", dir=folder) as out:

        def endtoend(_: int) -> None:
            score_to_parquet(
                scorer,
                parquet_batches(path, batch_rows=batch),
                Path(out) / "predictions.parquet",
                keep=["flight_id"],
                constants=constants,
                threshold=0.5,
            )

        def run_alone(_: int) -> None:
            for batch_inputs in inputs:
                scorer.run(batch_inputs)

        timed = alternate({"endtoend": endtoend, "run": run_alone}, 1, blocks)
    return {
        "endtoend_rows_per_s": blocks * rows / timed["endtoend"],
        "run_rows_per_s": blocks * rows / timed["run"],
        "ratio": timed["ratio"],
    }


def peak_rss(folder: Path, rows: int, batch: int) -> dict:
    """P11: one batch-inference run of `rows` rows in this process; its peak RSS."""
    from ml.predict import Scorer, parquet_batches, score_to_parquet

    scorer = Scorer.load(folder / "served.onnx", threads=1)
    with tempfile.TemporaryDirectory(prefix="bench-scores-", dir=folder) as out:
        summary = score_to_parquet(
            scorer,
            parquet_batches(folder / f"features_{rows}.parquet", batch_rows=batch),
            Path(out) / "predictions.parquet",
            keep=["flight_id"],
            constants={"model_version": "bench"},
            threshold=0.5,
        )
    assert summary.rows == rows
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"rows": rows, "peak_rss_mib": peak_kib / 1024, "rows_per_s": summary.rows_per_s}


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    prepare_ = commands.add_parser("prepare")
    prepare_.add_argument("folder", type=Path)
    prepare_.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    for name in ("network", "served"):
        command = commands.add_parser(name)
        command.add_argument("--threads", type=int, default=1)
        command.add_argument("--batch", type=int, choices=sorted(BLOCK_ROWS), required=True)
        command.add_argument("--blocks", type=int, default=8)
    for name in ("endtoend", "rss"):
        command = commands.add_parser(name)
        command.add_argument("--rows", type=int, required=True)
        command.add_argument("--batch", type=int, default=65_536)
    commands.choices["endtoend"].add_argument("--blocks", type=int, default=8)
    for command in commands.choices.values():
        if command is not prepare_:
            command.add_argument("--folder", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args.folder, args.rows)
        return
    if args.command in ("network", "served"):
        served = args.command == "served"
        result = time_network(args.folder, args.threads, args.batch, served, args.blocks)
    elif args.command == "endtoend":
        result = time_endtoend(args.folder, args.rows, args.batch, args.blocks)
    else:
        result = peak_rss(args.folder, args.rows, args.batch)
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
