"""Inference through a tensor-parallel split with plain tensors: after `tensor_parallel.parallelize` has placed each
process's share of the weights (the same split as training's, Megatron's), each split module's `DTensor` parameters
become the plain tensors of its share, and its only exchanges are explicit: the row-wise projections' outputs summed,
the vocabulary embedding's lookups summed, the output projection's logits gathered, through `HostCollectives`
(shared memory between the processes of one host, the process group elsewhere).

Why: decoding runs a few rows a step, and there the `DTensor` machinery costs more than the split saves. Measured on
an idle 2-core AVX2 EPYC, GPT-2 124M, 8 rows, one thread a process: a step spent 17 ms in `DTensor` dispatch and 37 ms
waiting on 25 `gloo` all-reduces (1.5-1.8 ms each on this VM's loopback) against 44 ms of matrix work, so 2 processes
decoded at 0.71x one process. Training keeps the `DTensor` split (its gradients, optimizer and checkpoints need it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from transformers.pytorch_utils import Conv1D

from .host_collectives import HostCollectives
from .tensor_parallel import LOCALIZED, TensorParallelPlan

HookIds = tuple[frozenset[int], frozenset[int]]
HOOK_FLAGS = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


def hook_ids(model: nn.Module, plan: TensorParallelPlan) -> dict[str, HookIds]:
    """The forward hooks each module of `plan` has before it is split (`parallelize` adds its own: the ones
    `localize` removes)."""
    return {
        path: (frozenset(module._forward_pre_hooks), frozenset(module._forward_hooks))
        for path in plan.styles
        for module in [model.get_submodule(path)]
    }


def localizable(model: nn.Module, plan: TensorParallelPlan) -> bool:
    """Whether every split module is a plain one (a `peft` LoRA layer wrapping one keeps the `DTensor` split)."""
    return bool(plan.styles) and not any(hasattr(model.get_submodule(path), "base_layer") for path in plan.styles)


def localize(
    model: nn.Module, plan: TensorParallelPlan, before: Mapping[str, HookIds], collectives: HostCollectives
) -> nn.Module:
    """Turn `model`, split by `parallelize` as `plan` says, into plain tensors and explicit exchanges (inference only:
    nothing here has a backward that keeps the split).

    Args:
        model (`nn.Module`): the split model.
        plan (`TensorParallelPlan`): the plan it was split with.
        before (`Mapping[str, HookIds]`): `hook_ids(model, plan)` taken before the split.
        collectives (`HostCollectives`): the exchanges between the processes of the split.

    Returns:
        `nn.Module`: the same model, every parameter a plain tensor (its share, or whole where replicated).
    """
    locals_: dict[int, nn.Parameter] = {}
    for path, kind in plan.styles.items():
        module = model.get_submodule(path)
        _drop_hooks(module, before[path])
        for name, param in list(module.named_parameters(recurse=False)):
            if isinstance(param, DTensor):
                if id(param) not in locals_:
                    locals_[id(param)] = nn.Parameter(_share(param, kind, name, collectives.rank), requires_grad=False)
                module.register_parameter(name, locals_[id(param)])
        _shape_attributes(module)
        if kind == "rowwise":
            module.register_forward_hook(lambda _, __, output: collectives.all_reduce(output))
        elif kind == "vocabulary_head":
            module.register_forward_hook(lambda _, __, output: collectives.all_gather(output, dim=-1))
        elif kind == "vocabulary_embedding":
            _lookup_share(module, collectives)
    for name, param in list(model.named_parameters(remove_duplicate=False)):  # a tied alias outside the plan
        if isinstance(param, DTensor):
            owner, _, attribute = name.rpartition(".")
            model.get_submodule(owner).register_parameter(attribute, locals_[id(param)])
    LOCALIZED.update(model.get_submodule(path) for path in plan.styles)
    return model


def _share(param: DTensor, kind: str, name: str, rank: int) -> torch.Tensor:
    """This process's plain share of `param`. A row-wise projection's bias is whole on every process but must be
    added once to the summed outputs: it is kept on the first process, zeros on the others."""
    local = param.to_local().detach()
    if kind == "rowwise" and name == "bias" and all(isinstance(p, Replicate) for p in param.placements) and rank:
        return torch.zeros_like(local)
    return local


def _shape_attributes(module: nn.Module) -> None:
    """The sizes a module reads in its forward, now its share's (`Conv1D.nf` shapes its output; `WeightMajorLinear`
    reads a linear's `in_features`/`out_features`)."""
    if isinstance(module, Conv1D):
        module.nf = module.weight.shape[1]
    elif isinstance(module, nn.Linear):
        module.out_features, module.in_features = module.weight.shape
    elif isinstance(module, nn.Embedding):
        module.num_embeddings = module.weight.shape[0]


def _drop_hooks(module: nn.Module, before: HookIds) -> None:
    """Remove the hooks `parallelize` added (they turn inputs and outputs into `DTensor`s)."""
    for hooks, kept in ((module._forward_pre_hooks, before[0]), (module._forward_hooks, before[1])):
        for key in [k for k in hooks if k not in kept]:
            del hooks[key]
            for extra in HOOK_FLAGS:
                getattr(module, extra, {}).pop(key, None)


def _lookup_share(embedding: nn.Embedding, collectives: HostCollectives) -> None:
    """The vocabulary embedding holds rows `[start, start + rows)` of the table: each process looks up the ids in its
    share (the others read row `start`, then zeroed), and the lookups are summed."""
    rows = embedding.weight.shape[0]
    start = collectives.rank * rows
    outside: dict[str, Any] = {}

    def shift(_: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
        ids = inputs[0] - start
        outside["mask"] = (ids < 0) | (ids >= rows)
        return (ids.masked_fill(outside["mask"], 0), *inputs[1:])

    def sum_shares(_: nn.Module, __: Any, output: torch.Tensor) -> torch.Tensor:
        return collectives.all_reduce(output.masked_fill(outside.pop("mask").unsqueeze(-1), 0.0))

    embedding.register_forward_pre_hook(shift)
    embedding.register_forward_hook(sum_shares)
