"""Teams' own networks for the tests of `ml.model`'s contract, by import path
(`tests.unit.team_networks:<Class>`): each but the first breaks one rule of it."""

from typing import Any, ClassVar

import torch
from torch import nn


class Linear(nn.Module):
    """Keeps the contract; records what it was constructed with."""

    built_with: ClassVar[dict[str, Any]] = {}

    def __init__(self, numeric_width: int, cardinalities: list[int], outputs: int, **options):
        super().__init__()
        Linear.built_with = {
            "numeric_width": numeric_width,
            "cardinalities": cardinalities,
            "outputs": outputs,
            **options,
        }
        self.layer = nn.Linear(numeric_width + len(cardinalities), outputs)
        self.outputs = outputs

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        out = self.layer(torch.cat([numeric, categorical.float()], dim=1))
        return out.squeeze(1) if self.outputs == 1 else out


class NotAModule:
    def __init__(self, numeric_width: int, cardinalities: list[int], outputs: int):
        pass


class OwnArguments(nn.Module):
    """Its constructor wants its own arguments, not the contract's."""

    def __init__(self, width: int):
        super().__init__()


class KeepsItsColumn(Linear):
    """Returns (batch, 1) for one output per row."""

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return self.layer(torch.cat([numeric, categorical.float()], dim=1))


class FailsToRun(Linear):
    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        return self.layer(numeric)  # too narrow: the categories are left out


class Blocks(nn.Module):
    """Names its shard units by a `blocks` ModuleList."""

    def __init__(self, numeric_width: int, cardinalities: list[int], outputs: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(numeric_width, numeric_width) for _ in range(3))


class ShardUnits(Blocks):
    """Names its shard units by a method, which wins over `blocks`."""

    def shard_units(self) -> list[nn.Module]:
        return [self.blocks[0]]
