"""Training launchers: where `python -m ml.train` runs. Every launcher runs the same entrypoint
under torchrun, and rank 0 reports back through Dagster Pipes."""

import os
import sys
from abc import ABC, abstractmethod
from pathlib import Path

import dagster as dg
from pydantic import Field

from ml.config import TrainConfig, to_args


class TrainingLauncher(dg.ConfigurableResource, ABC):
    """Runs a training job for an asset and returns what rank 0 reported."""

    output_root: str = Field(description="Folder under which each run writes its own folder.")

    def output_dir(self, context: dg.AssetExecutionContext) -> Path:
        return Path(self.output_root) / context.run.run_id

    @abstractmethod
    def launch(
        self, context: dg.AssetExecutionContext, config: TrainConfig
    ) -> dg.MaterializeResult: ...


class LocalTorchrun(TrainingLauncher):
    """torchrun on this machine: `processes` CPU (or GPU) workers, restarted up to
    `max_restarts` times after a failure; they resume from the last complete checkpoint."""

    processes: int = Field(default=2, description="Worker processes (torchrun --nproc-per-node).")
    threads_per_process: int = Field(default=1, description="OMP/torch threads per worker.")
    max_restarts: int = Field(default=2, description="torchrun --max-restarts.")

    def launch(
        self, context: dg.AssetExecutionContext, config: TrainConfig
    ) -> dg.MaterializeResult:
        command = [
            sys.executable,
            "-m",
            "ml.node",
            "--standalone",
            f"--nproc-per-node={self.processes}",
            f"--max-restarts={self.max_restarts}",
            "-m",
            "ml.train",
            *to_args(config),
        ]
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(self.threads_per_process),
            "DAGSTER_RUN_ID": context.run.run_id,
        }
        invocation = dg.PipesSubprocessClient().run(context=context, command=command, env=env)
        return invocation.get_materialize_result()
