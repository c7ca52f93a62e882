"""The model: an MLP over standardized numbers and embedded categories, one output per row."""

import math

import torch
from torch import nn

from ml.config import ModelConfig


def embedding_dim(cardinality: int, max_dim: int) -> int:
    """Width of a category's embedding: grows with the square root of its vocabulary."""
    return min(max_dim, math.ceil(math.sqrt(cardinality)) + 1)


class TabularNet(nn.Module):
    """One output per row from `numeric` (batch, width) and `categorical` (batch, n): a logit
    for a binary task, the standardized label for regression (`ml.task`)."""

    def __init__(self, numeric_width: int, cardinalities: list[int], config: ModelConfig):
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
        layers.append(nn.Linear(width, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        embedded = [e(categorical[:, i]) for i, e in enumerate(self.embeddings)]
        return self.mlp(torch.cat([numeric, *embedded], dim=1)).squeeze(1)
