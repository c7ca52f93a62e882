"""G1: the trainer on every visible GPU (NCCL, bf16): samples/s and model FLOP utilisation, with
each strategy (ddp, and fsdp: FSDP2 sharding over the GPUs).

    python -m benchmarks.gpu_check --out /tmp/gpu_check      # what benchmarks/gpu_check.sh runs

Runs `python -m ml.node ... -m ml.train` exactly as the launchers do, on a synthetic training
set shaped like the bundled one (35 numeric and 8 categorical features), for the project's model
and a wide variant that can load the GPU, each with `--strategies` (ddp and fsdp); reads each
run's result.json and prints one table. On one GPU the job has one rank, which trains the plain
model whatever the strategy (`ml.sharding`): fsdp over NCCL needs two GPUs or more.
Model FLOPs per sample are 6 x the multiply-accumulates of the linear layers (forward 2, backward
4); embeddings are lookups. Needs only torch, pandas, pyarrow, safetensors and scikit-learn, not
Dagster: GPU images need not carry the orchestration stack.
"""

import argparse
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

NUMERIC, CATEGORICAL = 35, 8
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L4": 121.0}
"""Dense bf16 tensor-core peaks from the vendors' data sheets; PEAK_TFLOPS overrides."""
MODELS = {"project": "128,64", "wide": "4096,4096,4096"}


def synthetic_training_set(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    columns: dict[str, object] = {}
    signal = np.zeros(rows)
    for i in range(NUMERIC):
        values = rng.normal(size=rows)
        signal += values * rng.normal(scale=0.2)
        columns[f"numeric__x{i:02d}"] = values
    for i in range(CATEGORICAL):
        codes = rng.integers(0, 3 + 15 * i, rows)
        signal += (codes % 3 == 0) * 0.3
        columns[f"categorical__c{i}"] = pd.array(codes.astype(str), dtype="string")
    columns["label"] = (signal + rng.normal(size=rows) > np.median(signal)).astype("int64")
    columns["split"] = np.where(np.arange(rows) < rows * 0.9, "train", "validation")
    pd.DataFrame(columns).to_parquet(path)


def linear_macs_per_sample(hidden: str) -> int:
    """Multiply-accumulates of the MLP's linear layers for one row (see ml.model)."""
    from ml.model import embedding_dim

    widths = [
        2 * NUMERIC + sum(embedding_dim(3 + 15 * i + 1, 16) for i in range(CATEGORICAL)),
        *map(int, hidden.split(",")),
        1,
    ]
    return sum(a * b for a, b in itertools.pairwise(widths))


def run(
    out: Path, data: Path, gpus: int, hidden: str, batch: int, epochs: int, strategy: str
) -> dict:
    run_dir = out / f"run-{hidden.replace(',', 'x')}-{strategy}"
    command = [
        sys.executable,
        "-m",
        "ml.node",
        "--standalone",
        f"--nproc-per-node={gpus}",
        "--max-restarts=0",
        "-m",
        "ml.train",
        "--data.training_set",
        str(data),
        "--data.label",
        "label",
        "--output_dir",
        str(run_dir),
        "--model.hidden_sizes",
        hidden,
        "--optim.batch_size",
        str(batch),
        "--optim.max_epochs",
        str(epochs),
        "--optim.patience_epochs",
        str(epochs),
        "--checkpoint_every_steps",
        "1000000",
        "--precision",
        "bf16",
        "--strategy",
        strategy,
    ]
    began = time.perf_counter()
    subprocess.run(command, check=True)
    result = json.loads((run_dir / "result.json").read_text())
    return {"wall_s": time.perf_counter() - began, **result}


def capacity_rows(out: Path) -> list[dict]:
    """Every run under `out`: the node's capacity estimate on the GPU (`ml.capacity`, made
    before the workers started) against the largest rank's measured
    `torch.cuda.max_memory_allocated` (`TrainResult.peak_memory_bytes`), and P14's error,
    |estimated - measured| / measured, with the estimate's components."""
    rows = []
    for path in sorted(out.glob("run-*/result.json")):
        result = json.loads(path.read_text())
        estimate, peak = result.get("capacity"), result.get("peak_memory_bytes") or 0
        row: dict = {"run": path.parent.name, "peak_mib": peak / 2**20}
        if estimate and peak:
            row |= {
                "device": estimate["device"],
                "estimated_mib": estimate["total_bytes"] / 2**20,
                "error": abs(estimate["total_bytes"] - peak) / peak,
                "components_mib": {
                    k.removesuffix("_bytes"): v / 2**20
                    for k, v in estimate.items()
                    if k.endswith("_bytes") and k not in ("target_bytes", "total_bytes")
                },
            }
        rows.append(row)
    return rows


def print_capacity(rows: list[dict]) -> None:
    print("\nP14 on the GPU: capacity estimate vs measured max_memory_allocated (target <= 0.2)")
    for row in rows:
        if "estimated_mib" not in row:
            print(f"  {row['run']:<28} no estimate in its result (peak {row['peak_mib']:,.1f} MiB)")
            continue
        parts = ", ".join(f"{k} {v:,.0f}" for k, v in row["components_mib"].items() if v)
        print(
            f"  {row['run']:<28} estimated {row['estimated_mib']:>10,.1f} MiB"
            f"  measured {row['peak_mib']:>10,.1f} MiB  error {row['error']:.3f}"
            f"  ({row['device']}; {parts})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("/tmp/gpu_check"))
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch", type=int, default=8192, help="rows per step per GPU")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--strategies", default="ddp,fsdp", help="comma-separated")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="check the plumbing on a CPU (1 process)"
    )
    args = parser.parse_args()

    import torch

    from ml import telemetry

    if not (torch.cuda.is_available() or args.cpu_smoke):
        print("no CUDA device visible: G1 needs a GPU machine", file=sys.stderr)
        return 2
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 1
    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak = float(
        os.environ.get("PEAK_TFLOPS")
        or next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), "nan")
    )
    args.out.mkdir(parents=True, exist_ok=True)
    data = args.out / "training_set.parquet"
    synthetic_training_set(data, args.rows)
    rows = []
    runs = [(m, s) for m in MODELS.items() for s in args.strategies.split(",")]
    for (label, hidden), strategy in runs:
        result = run(args.out, data, gpus, hidden, args.batch, args.epochs, strategy)
        flops = 6 * linear_macs_per_sample(hidden) * result["samples_per_s"]
        rows.append(
            {
                "model": f"{label} ({hidden})",
                "strategy": strategy if gpus > 1 else f"{strategy} (1 rank: unsharded)",
                "gpus": gpus,
                "device": name,
                "torch": torch.__version__,
                "precision": result["precision"],
                "samples_per_s": result["samples_per_s"],
                "model_tflops": flops / 1e12,
                "mfu": flops / (peak * 1e12 * gpus),
                "validation_roc_auc": result["validation"]["roc_auc"],
                "wall_s": result["wall_s"],
                "telemetry": result.get("telemetry", []),
            }
        )
    backend = "NCCL" if torch.cuda.is_available() else "gloo"
    print(f"\nG1 on {gpus} x {name} (peak bf16 {peak} TFLOP/s per GPU), {backend}, bf16 autocast")
    for row in rows:
        print(
            f"  {row['model']:<28} {row['strategy']:<24} {row['samples_per_s']:>14,.0f} samples/s"
            f"  {row['model_tflops']:8.2f} TFLOP/s  MFU {row['mfu']:7.2%}"
            f"  AUC {row['validation_roc_auc']:.3f}  ({row['wall_s']:.0f} s)"
        )
    for row in rows:  # per epoch: samples/s per rank, data wait, memory, utilisation
        epochs = [telemetry.JobEpoch.from_message(e) for e in row["telemetry"]]
        if epochs:
            print(f"\n  {row['model']}, per epoch (ml.telemetry):")
            print("    " + telemetry.table(epochs).replace("\n", "\n    "))
            print(f"    utilisation: {epochs[0].ranks[0].utilisation_source}")
    (args.out / "gpu_check.json").write_text(json.dumps(rows, indent=2))
    capacity = capacity_rows(args.out)
    print_capacity(capacity)
    (args.out / "capacity.json").write_text(json.dumps(capacity, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
