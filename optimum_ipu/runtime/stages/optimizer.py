"""The optimizer state of a model whose stages run on separate processes, each holding its stage only: written and read
per stage, never gathered into one process.

Each stage writes the state of the parameters it trains, keyed by parameter name, as
`optimizer-0000s-of-0000n.safetensors` (replica 0's process; under FSDP each state tensor is first gathered over the
stage's replicas only): the tensors under `"{parameter}::{state key}"`, the groups' hyper-parameters and any state value
that is not a tensor as JSON in its metadata, so nothing in it is pickled. Global rank 0 writes `optimizer.index.json`
(name -> file). Names, not torch's group numbering, so the state loads into any layout: a process holding one stage of
another split reads only the files that hold its names; one process holding the whole model reads them all and numbers
them as its own optimizer does. Files of an earlier release (`.pt`, read with `weights_only=True`) load too.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import torch.distributed as dist
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import nn

from ..fsdp import held_like, reshard, whole_on_cpu
from .hold import stage_hold

OPTIMIZER_INDEX_NAME = "optimizer.index.json"


def optimizer_file(stage: int, stages: int) -> str:
    """The file name of one stage's optimizer state (numbered as the weight shards are)."""
    return f"optimizer-{stage + 1:05d}-of-{stages:05d}.safetensors"


def save_stage_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Write this stage's optimizer state into `folder` (see the module docstring). A collective: every process of
    the job calls it.

    Args:
        model (`nn.Module`): the model, holding one stage (`stage_hold`).
        optimizer (`torch.optim.Optimizer`): its optimizer (over the parameters this process holds).
        folder (`str`): the checkpoint folder.
    """
    hold = stage_hold(model)
    reshard(model)  # an evaluation may have left the FSDP root's parameters gathered
    names = {p: n for n, p in model.named_parameters()}
    groups, state = [], {}
    for group in optimizer.param_groups:
        # a parameter several stages hold (a tied embedding) is trained alike on each: the owner writes it
        own = [p for p in group["params"] if hold.stage_of(names[p]) == hold.stage]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": [names[p] for p in own]})
        for param in own:
            if param in optimizer.state:  # FSDP: every replica of the stage takes part in each gather, in this order
                state[names[param]] = {k: whole_on_cpu(v) for k, v in optimizer.state[param].items()}
    stages, group = hold.mesh["pp"].size(), hold.mesh.get_group("pp")
    if hold.mesh.get_local_rank("dp") == 0:
        os.makedirs(folder, exist_ok=True)
        write_state(os.path.join(folder, optimizer_file(hold.stage, stages)), state, groups)
    written: list[Any] = [None] * stages
    dist.all_gather_object(written, sorted(state), group=group)
    if dist.get_rank() == 0:
        state_map = {name: optimizer_file(s, stages) for s, part in enumerate(written) for name in part}
        index = {"stages": stages, "state_map": dict(sorted(state_map.items()))}
        with open(os.path.join(folder, OPTIMIZER_INDEX_NAME), "w", encoding="utf-8") as f:
            json.dump(index, f, indent=2)
    dist.barrier()


def has_stage_optimizer(folder: str) -> bool:
    """Whether a checkpoint folder holds its optimizer state per stage."""
    return os.path.isfile(os.path.join(folder, OPTIMIZER_INDEX_NAME))


def _read(folder: str, wanted: set[str] | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The saved state of the `wanted` names (all when None), and the hyper-parameters of each group."""
    with open(os.path.join(folder, OPTIMIZER_INDEX_NAME), encoding="utf-8") as f:
        index = json.load(f)
    files = {file for name, file in index["state_map"].items() if wanted is None or name in wanted}
    first = min(index["state_map"].values(), default=optimizer_file(0, int(index["stages"])))
    files.add(first)  # every stage's file carries the groups' hyper-parameters
    state, hyper = {}, []
    for file in sorted(files):
        path = os.path.join(folder, file)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: a stage's optimizer state named by {OPTIMIZER_INDEX_NAME} is missing")
        saved_state, groups = read_state(path)
        state.update({n: s for n, s in saved_state.items() if wanted is None or n in wanted})
        hyper = hyper or [{k: v for k, v in g.items() if k != "params"} for g in groups]
    return state, hyper


def write_state(path: str, state: dict[str, dict[str, Any]], groups: list[dict[str, Any]]) -> None:
    """One stage's optimizer state as safetensors: tensors by `"{parameter}::{key}"`, the rest as JSON metadata."""
    tensors, values = {}, {}
    for name, entries in state.items():
        for key, value in entries.items():
            if torch.is_tensor(value):
                tensors[f"{name}::{key}"] = value.contiguous()
            else:
                values.setdefault(name, {})[key] = value
    plain = lambda v: v.tolist() if torch.is_tensor(v) else str(v)  # noqa: E731 (a tensor learning rate, an enum)
    metadata = {"format": "pt", "param_groups": json.dumps(groups, default=plain), "values": json.dumps(values)}
    save_file(tensors, path, metadata=metadata)


def read_state(path: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """A stage's optimizer state and parameter groups (`write_state`'s file, or an earlier release's `.pt`).

    Raises:
        ValueError: the file is damaged (it names the file).
    """
    if path.endswith(".pt"):
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return saved["state"], saved["param_groups"]
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            state: dict[str, dict[str, Any]] = {}
            for key in f.keys():
                name, _, entry = key.rpartition("::")
                state.setdefault(name, {})[entry] = f.get_tensor(key)
        for name, entries in json.loads(metadata.get("values", "{}")).items():
            state.setdefault(name, {}).update(entries)
        return state, json.loads(metadata["param_groups"])
    except (SafetensorError, KeyError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path}: this stage's optimizer state is damaged ({error}); resume from an earlier checkpoint"
        ) from error


def load_stage_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> None:
    """Load into this process's optimizer the saved state of the parameters it holds, reading only the stage files
    that hold them (any split of the saving run); under FSDP each process keeps its shard of each tensor."""
    names = {p: n for n, p in model.named_parameters()}
    params = {names[p]: p for group in optimizer.param_groups for p in group["params"]}
    state, hyper = _read(folder, set(params))
    for name, values in state.items():
        param = params[name]
        optimizer.state[param] = {
            # a copy of its own (a mapped file may be rotated away), sharded as the parameter is
            k: held_like(v.clone(), param) if torch.is_tensor(v) and v.shape == param.shape else v
            for k, v in values.items()
        }
    _set_hyper_parameters(optimizer, hyper)


def stage_optimizer_as_one(model: nn.Module, optimizer: torch.optim.Optimizer, folder: str) -> dict[str, Any]:
    """The per-stage state of `folder` as `optimizer.state_dict()` of one process that holds the whole model: every
    file read, parameters numbered in the order of `optimizer`'s groups (`optimizer.load_state_dict` takes it)."""
    names = {p: n for n, p in model.named_parameters()}
    order = [names[p] for group in optimizer.param_groups for p in group["params"]]
    state, hyper = _read(folder, set(order))
    number = {name: i for i, name in enumerate(order)}
    _check_groups(optimizer, hyper)
    groups, start = [], 0
    for group, saved in zip(optimizer.param_groups, hyper or [{}] * len(optimizer.param_groups), strict=True):
        numbers = list(range(start, start + len(group["params"])))
        groups.append({**{k: v for k, v in group.items() if k != "params"}, **saved, "params": numbers})
        start += len(numbers)
    cloned = {number[n]: {k: v.clone() if torch.is_tensor(v) else v for k, v in s.items()} for n, s in state.items()}
    return {"state": cloned, "param_groups": groups}


def _check_groups(optimizer: torch.optim.Optimizer, hyper: list[dict[str, Any]]) -> None:
    """The saved state has as many parameter groups as `optimizer` (or none saved)."""
    if hyper and len(hyper) != len(optimizer.param_groups):
        raise ValueError(
            f"the optimizer state does not fit the model: {len(hyper)} parameter groups saved, the optimizer has "
            f"{len(optimizer.param_groups)}"
        )


def _set_hyper_parameters(optimizer: torch.optim.Optimizer, hyper: list[dict[str, Any]]) -> None:
    _check_groups(optimizer, hyper)
    for group, saved in zip(optimizer.param_groups, hyper, strict=False):
        group.update(saved)
