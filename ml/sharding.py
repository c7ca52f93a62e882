"""How ranks share a model (`TrainConfig.strategy`), and its state in either case.

- `ddp`: a replica on every rank, gradients all-reduced in the backward pass (DDP).
- `fsdp`: parameters, gradients and optimizer state sharded over the ranks (FSDP2,
  `torch.distributed.fsdp.fully_shard`): each block of the network is its own unit (its
  parameters are gathered just before it runs and freed after, `ml.model.shard_units`), then
  the root.

One rank alone runs the plain model either way. The state functions use
`torch.distributed.checkpoint.state_dict`, which gives the same keys for every strategy (a
sharded DTensor per parameter under fsdp, a whole tensor otherwise), so one checkpoint format
(`ml.checkpoint`) serves both and reshards between them.
"""

import warnings
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel

from ml.model import shard_units

DDP = "ddp"
FSDP = "fsdp"
_OPTIMIZER = StateDictOptions(flatten_optimizer_state_dict=True)
"""A flat optimizer state: tensors and plain values side by side, no lists of tensors."""


def parallelize(model: nn.Module, strategy: str, world_size: int) -> nn.Module:
    """What the training steps call: `model` itself alone, or wrapped (ddp) or sharded in place
    (fsdp) over the ranks. Build the optimizer after this: under fsdp its parameters become
    shards."""
    if world_size == 1:
        return model
    if strategy == DDP:
        return DistributedDataParallel(model)
    if strategy == FSDP:
        # Our losses never write into a network's output in place, which is all that warning
        # (raised at every forward of a network that returns a view, such as `squeeze`) is about.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view")
        for unit in shard_units(model):
            fully_shard(unit)
        fully_shard(model)
        return model
    raise ValueError(f"strategy={strategy!r}: must be one of {(DDP, FSDP)}")


def weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """This rank's view of the weights (sharded under fsdp), detached copies: the best weights
    so far."""
    return {k: v.detach().clone() for k, v in _tensors(get_model_state_dict(model)).items()}


def load_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Set the weights from `weights` (or a checkpoint's copy of them)."""
    set_model_state_dict(model, cast(dict[str, Any], state))


def full_weights(model: nn.Module, world_size: int) -> dict[str, torch.Tensor]:
    """The whole weights on the CPU, gathered to rank 0 (every rank must call this; the others
    get an empty dict): what `model.safetensors` holds."""
    if world_size == 1:
        return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {
        k: v.contiguous() for k, v in _tensors(get_model_state_dict(model, options=options)).items()
    }


def training_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """{"model", "optimizer"}: this rank's part of both (sharded under fsdp)."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=_OPTIMIZER)
    return {"model": model_state, "optimizer": optimizer_state}


def load_training_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Set the model and optimizer from `training_state` (or a checkpoint's copy of it)."""
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
        options=_OPTIMIZER,
    )


def _tensors(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A model's state dict as what it is: tensors (torch types it as any state value)."""
    return cast(dict[str, torch.Tensor], state)
