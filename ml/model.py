"""The networks a use case can train, chosen by `model.architecture` (`build_model`).

Every network takes `numeric` (batch, width) and `categorical` (batch, n) and returns one output
per row, (batch,), or one per class, (batch, classes): a logit for a binary task, the standardized
label for regression (`ml.task`).
"""

import math

import torch
from torch import nn

from ml.config import ModelConfig

MLP = "mlp"


def build_model(
    numeric_width: int, cardinalities: list[int], outputs: int, config: ModelConfig
) -> nn.Module:
    """The network `config.architecture` names, for inputs of the preprocessor's shapes
    (`numeric_width` columns, one vocabulary size per categorical column) and `outputs` outputs
    per row (1, or the number of classes)."""
    if config.architecture == MLP:
        return TabularNet(numeric_width, cardinalities, config, outputs)
    raise ValueError(f"model.architecture={config.architecture!r}: must be one of {(MLP,)}")


def embedding_dim(cardinality: int, max_dim: int) -> int:
    """Width of a category's embedding: grows with the square root of its vocabulary."""
    return min(max_dim, math.ceil(math.sqrt(cardinality)) + 1)


class TabularNet(nn.Module):
    """An MLP over the numbers and one embedding per categorical column."""

    def __init__(
        self,
        numeric_width: int,
        cardinalities: list[int],
        config: ModelConfig,
        outputs: int = 1,
    ):
        super().__init__()
        dims = [embedding_dim(n, config.max_embedding_dim) for n in cardinalities]
        self.embeddings = nn.ModuleList(
            nn.Embedding(n, d) for n, d in zip(cardinalities, dims, strict=True)
        )
        width = numeric_width + sum(dims)
        layers: list[nn.Module] = []
        for hidden in config.hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(config.dropout)]
            width = hidden
        layers.append(nn.Linear(width, outputs))
        self.mlp = nn.Sequential(*layers)
        self.outputs = outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        embedded = [e(categorical[:, i]) for i, e in enumerate(self.embeddings)]
        out = self.mlp(torch.cat([numeric, *embedded], dim=1))
        return out.squeeze(1) if self.outputs == 1 else out
