"""An example of a team's own network: an MLP with residual blocks, trained by import path.

    python -m ml.train --model.architecture usecases.models.residual_mlp:ResidualMLP \\
        --model.options '{"width": 128, "num_blocks": 3}' --data.training_set ... --output_dir ...

It keeps the contract of `ml.model` (docs/training.md, "Models"): constructed with keyword
arguments `numeric_width`, `cardinalities`, `outputs` and, when `model.options` is set,
`options`; `forward(numeric, categorical)` returns (batch,) for one output per row, else
(batch, outputs); no branch on a tensor's values, so that it exports to ONNX. Its `blocks` are
what FSDP shards one by one (`ml.model.shard_units`).
"""

from typing import Any

import torch
from torch import nn

DEFAULTS = {"width": 64, "num_blocks": 2, "embedding_dim": 8, "dropout": 0.1}
"""The options it understands, and their values when `model.options` leaves them out."""


class ResidualBlock(nn.Module):
    """x + Linear(ReLU(Linear(LayerNorm(x)))), with dropout inside."""

    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.body = nn.Sequential(
            nn.LayerNorm(width),
            nn.Linear(width, 2 * width),
            nn.ReLU(),
            nn.Dropout(dropout),
            nn.Linear(2 * width, width),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class ResidualMLP(nn.Module):
    """Numbers and one embedding per categorical column, projected to `width`, through
    `num_blocks` residual blocks, then a linear head."""

    def __init__(
        self,
        numeric_width: int,
        cardinalities: list[int],
        outputs: int,
        options: dict[str, Any] | None = None,
    ):
        super().__init__()
        unknown = sorted(set(options or {}) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}: the options are {sorted(DEFAULTS)}")
        settings = {**DEFAULTS, **(options or {})}
        width, dim = int(settings["width"]), int(settings["embedding_dim"])
        self.embeddings = nn.ModuleList(nn.Embedding(n, dim) for n in cardinalities)
        self.project = nn.Linear(numeric_width + dim * len(cardinalities), width)
        self.blocks = nn.ModuleList(
            ResidualBlock(width, float(settings["dropout"]))
            for _ in range(int(settings["num_blocks"]))
        )
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, outputs))
        self.outputs = outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        embedded = [e(categorical[:, i]) for i, e in enumerate(self.embeddings)]
        x = self.project(torch.cat([numeric, *embedded], dim=1))
        for block in self.blocks:
            x = block(x)
        out = self.head(x)
        return out.squeeze(1) if self.outputs == 1 else out
