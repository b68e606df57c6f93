"""Full parameter sharding over the data-parallel replicas (FSDP2, `torch.distributed.fsdp.fully_shard`).

Each replica keeps `1 / replicas` of every parameter, gradient and optimizer state. A layer's parameters are
all-gathered just before its forward (and again for its backward) and freed after; gradients are
reduce-scattered, so each replica averages only its own shard. The numbers are those of data parallelism.

`transformers.Trainer` refuses `--fsdp` on CPUs ("Using fsdp only works in distributed training": accelerate's
FSDP plugin wants a GPU), while `fully_shard` itself runs on gloo: so `IPUTrainer` shards the model here, on any
device, and keeps accelerate from wrapping it in DDP.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

FSDP_HELP = (
    "full parameter sharding (--fsdp) runs with one process per replica (torchrun, ipus_per_replica 1); "
    "pipeline stages on separate processes keep whole weights"
)


class ShardedModel(nn.Module):
    """Holds a model whose parameters `fully_shard` has sharded: `Trainer` then sees a wrapped model and leaves
    it to us (accelerate would otherwise put DDP around DTensor parameters)."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)


def shard_model(model: nn.Module, layer_paths: Iterable[str]) -> nn.Module:
    """Shard `model` in place over every process of the job, one FSDP unit per pipeline layer plus the root
    (embeddings, heads), so at most one layer's parameters are whole at a time.

    Args:
        model (`nn.Module`): the stock model, already on this process's device.
        layer_paths (`Iterable[str]`): dotted paths of its layers (`PipelinedModel.layer_paths()`).

    Returns:
        `nn.Module`: the same model, its parameters now `DTensor` shards.
    """
    if not dist.is_initialized():
        raise RuntimeError(FSDP_HELP + "; no process group is initialized")
    for path in layer_paths:
        fully_shard(model.get_submodule(path))
    # Tied embeddings and output projection share one parameter: both stay in the root unit.
    fully_shard(model)
    return model


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole, unsharded `state_dict` of a sharded model, on the CPU of rank 0 (empty on the others).

    A collective: every process must call it. Its keys and values are those of the stock model, so what is
    saved from it loads in one process.
    """
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def load_full_state_dict(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Load a whole `state_dict` (a one-process checkpoint) into a sharded model: each process keeps its shards.

    Raises:
        ValueError: the checkpoint has keys the model lacks, or lacks keys other than tied duplicates.
    """
    options = StateDictOptions(full_state_dict=True, strict=False)
    result = set_model_state_dict(model, state_dict, options=options)
    # A tied parameter (output projection = embeddings) is saved once, under one of its names.
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"the checkpoint does not fit the model: missing {missing}, unexpected {result.unexpected_keys}"
        )


def _parameter_names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    # torch.optim numbers parameters in the order of its groups; torch.distributed.checkpoint names them.
    names = {p: n for n, p in model.named_parameters()}
    return [names[p] for group in optimizer.param_groups for p in group["params"]]


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The whole optimizer state of a sharded model on rank 0, in the layout of `optimizer.state_dict()` in one
    process (parameters numbered in group order), so that a one-process run resumes from it. A collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True, flatten_optimizer_state_dict=False)
    full = get_optimizer_state_dict(model, optimizer, options=options)
    index = {name: i for i, name in enumerate(_parameter_names(model, optimizer))}
    return {
        "state": {index[name]: value for name, value in full.get("state", {}).items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full.get("param_groups", [])],
    }


def load_full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Load a one-process `optimizer.state_dict()` (or `full_optimizer_state_dict`'s) into the optimizer of a
    sharded model: each process keeps its shards of the state."""
    names = _parameter_names(model, optimizer)
    full = {
        "state": {names[int(i)]: value for i, value in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]],
    }
    set_optimizer_state_dict(model, optimizer, full, options=StateDictOptions(full_state_dict=True))


def local_parameter_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of parameters this process holds (its shard of each `DTensor`, all of a plain tensor)."""
    total = 0
    for p in parameters:
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def unsharded_norm(norm: torch.Tensor) -> torch.Tensor:
    """A gradient norm computed over `DTensor` shards, as a plain tensor (the norm over every shard)."""
    return norm.full_tensor() if isinstance(norm, DTensor) else norm
