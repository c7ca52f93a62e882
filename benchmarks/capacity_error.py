"""P14: the capacity estimate's error, |estimated - measured peak| ÷ measured, and the table of
docs/training.md ("Capacity").

    python -m benchmarks.capacity_error data PATH --rows 3000
    python -m benchmarks.capacity_error measure --data PATH --size hidden_sizes=4096 --processes 2
    python -m benchmarks.capacity_error table --data PATH    # the docs' table, Markdown

`measure` runs a real training, `python -m ml.node` (torchrun) of `ml.train` for one epoch: the
node estimates before starting the workers (`ml.capacity`, kept in the run's folder) and rank 0
reports the largest rank's measured peak (`TrainResult.peak_memory_bytes`: the peak resident set
on a CPU). It prints one JSON line: both, in bytes, and the error.

The cases are the MLP at its default width, where the runtime (Python, torch, the trainer's
modules) is most of a rank's memory, and at 3 x 4096, where the model's state is (34M
parameters: 130 MiB each of weights, gradients and best weights, 260 MiB of AdamW moments, as
much again serialized while a checkpoint is written), and the FT-Transformer at its defaults,
where a step's activations are (attention over 43 tokens a row), each on 1 and 2 ranks.
Threads are pinned to one per rank.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness import PINNED_THREADS

LABEL = "arrival_delayed"


@dataclass(frozen=True)
class Case:
    architecture: str
    strategy: str
    size: str
    """The model's size settings, `name=value` joined by spaces (`--model.<name> value`)."""
    processes: int

    @property
    def name(self) -> str:
        """Short enough for the table's column: `ft_transformer 192/3 ddp x2` (2 ranks)."""
        values = "/".join(setting.split("=")[1] for setting in self.size.split())
        return f"{self.architecture} {values} {self.strategy} x{self.processes}"

    def model_flags(self) -> list[str]:
        return [
            f
            for setting in self.size.split()
            for f in (f"--model.{setting.split('=')[0]}", setting.split("=")[1])
        ]

    def argv(self, data: Path) -> list[str]:
        """The `measure` command of this case (after the interpreter)."""
        return [
            *("-m", "benchmarks.capacity_error", "measure", "--data", str(data)),
            *("--architecture", self.architecture, "--strategy", self.strategy),
            *("--size", self.size, "--processes", str(self.processes)),
        ]


CASES = tuple(
    Case(architecture, strategy, size, processes)
    for architecture, size in (
        ("mlp", "hidden_sizes=128,64"),
        ("mlp", "hidden_sizes=4096,4096,4096"),
        ("ft_transformer", "token_dim=192 num_blocks=3"),
    )
    for strategy, processes in (("ddp", 1), ("ddp", 2), ("fsdp", 2))
)
"""What P14 and the docs' table measure: each architecture alone, then on 2 ranks with each
strategy (fsdp on one rank trains the plain model, as ddp does)."""


def measure(data: Path, case: Case) -> dict:
    """One training of `case` on `data` in a fresh folder: the estimate, the measured peak and
    the error; each component of the estimate too."""
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as folder:
        command = [
            *(sys.executable, "-m", "ml.node", "--standalone"),
            *(f"--nproc-per-node={case.processes}", "--max-restarts=0", "-m", "ml.train"),
            *("--data.training_set", str(data), "--data.label", LABEL, "--output_dir", folder),
            *("--model.architecture", case.architecture, *case.model_flags()),
            *("--strategy", case.strategy, "--optim.max_epochs", "1"),
            *("--optim.batch_size", "256"),
        ]
        done = subprocess.run(
            command, env={**os.environ, **PINNED_THREADS}, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise SystemExit(f"{case.name}: training failed: {done.stderr[-3000:]}")
        result = json.loads((Path(folder) / "result.json").read_text())
    estimate, peak = result["capacity"], result["peak_memory_bytes"]
    return {
        "estimated_bytes": estimate["total_bytes"],
        "peak_bytes": peak,
        "error": abs(estimate["total_bytes"] - peak) / peak,
        "estimate": estimate,
    }


def table(data: Path) -> str:
    """The docs' Markdown table: one row per case, one training each."""
    lines = [
        "| architecture | strategy | ranks | size | estimated MiB | measured peak MiB"
        " | error | largest components (MiB) |",
        "|---|---|---:|---|---:|---:|---:|---|",
    ]
    for case in CASES:
        measured = measure(data, case)
        estimate = measured["estimate"]
        components = {
            k.removesuffix("_bytes"): v
            for k, v in estimate.items()
            if k.endswith("_bytes") and k not in ("target_bytes", "total_bytes") and v
        }
        largest = sorted(components.items(), key=lambda item: -item[1])[:4]
        shown = ", ".join(f"{name} {value / 2**20:,.0f}" for name, value in largest)
        estimated, peak = measured["estimated_bytes"], measured["peak_bytes"]
        lines.append(
            f"| {case.architecture} | {case.strategy} | {case.processes} | {case.size}"
            f" | {estimated / 2**20:,.1f} | {peak / 2**20:,.1f} | {(estimated - peak) / peak:+.1%}"
            f" | {shown} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data")
    data.add_argument("path", type=Path)
    data.add_argument("--rows", type=int, default=3_000)
    one = commands.add_parser("measure")
    one.add_argument("--data", type=Path, required=True)
    one.add_argument("--architecture", default="mlp")
    one.add_argument("--strategy", default="ddp")
    one.add_argument("--size", default="hidden_sizes=128,64")
    one.add_argument("--processes", type=int, default=1)
    docs = commands.add_parser("table")
    docs.add_argument("--data", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "data":
        from benchmarks.training_speed import write_data

        write_data(args.path, args.rows)
    elif args.command == "measure":
        case = Case(args.architecture, args.strategy, args.size, args.processes)
        sys.stdout.write(json.dumps(measure(args.data, case)) + "\n")
    else:
        sys.stdout.write(table(args.data) + "\n")


if __name__ == "__main__":
    main()
